"""The L2 overlay of an endpoint's vLLM Deployment: ONE value, ``desired_overlay``, and everything derived from it.

The overlay is what kvfleet puts on top of the Deployment the HyperPod Inference Operator renders, so that every
replica reads and writes the same Curvine L2 (docs/reference/hyperpod.md#what-the-operator-renders):

- env of the vLLM container: exactly one ``LMCACHE_REMOTE_URL``, the fs:// path under the Curvine mount (the
  operator injects its own ``sagemaker-hyperpod://`` entry, at an index that varies by operator version; host
  and port are placeholders the fs:// connector ignores); ``LMCACHE_REMOTE_SERDE`` naive (cachegen has a zip
  serialization bug in the fs connector); ``PYTHONHASHSEED`` fixed (LMCache keys derive from Python hashes:
  pods with different seeds share nothing, silently);
- the Curvine ReadWriteMany PVC as a volume, mounted read-write at the mount path in the vLLM container (the one
  the operator names after the Deployment and puts first).

Derived from the value, and only from it:

- ``violations``: every way a pod spec (a Deployment template or a running pod) misses the overlay — stage 4's
  checks (``fleet.endpoint_spec.l2_violations``) and the drift check (``fleet.drift``);
- ``json_patch``: the one RFC 6902 patch that puts the overlay on a live Deployment (patch mode, stage 4's
  safe sequence), with ``test`` ops guarding every index it relies on;
- ``kyverno_mutation``: the strategic-merge body of the ClusterPolicy of kyverno mode
  (``fleet.endpoint_spec.kyverno_policy``, rendered to k8s/kyverno by tools/render-k8s-manifests.py);
- ``Overlay.agree_env``: the env two pods must agree on before stage 5 sends a request (``stages.verify``);
- ``VIOLATION_KINDS``: the drift kinds the patch fixes (``fleet.drift.PATCHABLE``).

tests/unit/test_overlay_properties.py proves over generated live Deployments that the patch leaves no violation
and is empty exactly when there is none. The overlay's fixed names and defaults (env names, mount path, volume,
claim) are defined in ``fleet.constants``, the leaf the twin reads them from; this module imports them from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from kvfleet.fleet.constants import (
    CURVINE_PVC,
    ENV_CHUNK_SIZE,
    ENV_HASHSEED,
    ENV_REMOTE_SERDE,
    ENV_REMOTE_URL,
    L2_MOUNT_PATH,
    L2_VOLUME_NAME,
    OPERATOR_L2_SCHEME,
)

if TYPE_CHECKING:
    from kvfleet.fleet.inventory import Endpoint, Settings

# Where the pod spec sits in a Deployment, as a JSON pointer.
POD_TEMPLATE: Final = "/spec/template/spec"

# Violation kinds (drift kinds too: fleet.drift.SEVERITY).
DUPLICATE_URL: Final = "duplicate_l2_url"
OPERATOR_URL: Final = "operator_l2_url"
PATCH_LOST: Final = "patch_lost_to_reconcile"
SEED_MISSING: Final = "hash_seed_missing"
SERDE_MISMATCH: Final = "serde_mismatch"


@dataclass(frozen=True)
class Violation:
    kind: str  # a drift kind: duplicate_l2_url, operator_l2_url, patch_lost_to_reconcile, hash_seed_missing, ...
    field: str
    expected: str
    actual: str

    def text(self) -> str:
        return f"{self.kind}: {self.field} expected {self.expected!r}, found {self.actual!r}"


@dataclass(frozen=True)
class EnvRule:
    """One env entry of the overlay. ``unique``: exactly one entry may carry the name (the operator's own URL
    entry must go, not merely be shadowed); otherwise the last entry wins, as in Kubernetes."""

    name: str
    value: str
    kind: str  # the violation when the entry is absent or wrong
    unique: bool = False

    @property
    def entry(self) -> dict[str, str]:
        return {"name": self.name, "value": self.value}

    def holds(self, entry: Mapping[str, Any]) -> bool:
        return entry.get("value") == self.value and not entry.get("valueFrom")


@dataclass(frozen=True)
class Overlay:
    """The desired L2 overlay of one endpoint: env entries, volume and mount of the vLLM container, by name."""

    container: str
    env: tuple[EnvRule, ...]
    volume_name: str
    claim: str
    mount_path: str

    @property
    def volume(self) -> dict[str, Any]:
        return {"name": self.volume_name, "persistentVolumeClaim": {"claimName": self.claim}}

    @property
    def mount(self) -> dict[str, Any]:
        return {"name": self.volume_name, "mountPath": self.mount_path}

    @property
    def agree_env(self) -> tuple[str, ...]:
        """The env every pod of the endpoint must agree on for cross-pod hits (stage 5's pre-check)."""
        return (*(r.name for r in self.env), ENV_CHUNK_SIZE)

    def volume_holds(self, volume: Mapping[str, Any]) -> bool:
        pvc = volume.get("persistentVolumeClaim") or {}
        return pvc.get("claimName") == self.claim and not pvc.get("readOnly")

    def mount_holds(self, mount: Mapping[str, Any]) -> bool:
        return mount.get("name") == self.volume_name and not mount.get("readOnly")


def overlay_for(container: str, settings: Settings, claim: str = CURVINE_PVC) -> Overlay:
    """The overlay for the vLLM container named ``container`` (the operator names it after the Deployment)."""
    return Overlay(
        container=container,
        env=(EnvRule(ENV_REMOTE_URL, settings.l2_url, PATCH_LOST, unique=True),
             EnvRule(ENV_REMOTE_SERDE, settings.serde, SERDE_MISMATCH),
             EnvRule(ENV_HASHSEED, settings.hash_seed, SEED_MISSING)),
        volume_name=L2_VOLUME_NAME, claim=claim, mount_path=L2_MOUNT_PATH)



def desired_overlay(endpoint: Endpoint, settings: Settings, claim: str = CURVINE_PVC) -> Overlay:
    """THE desired overlay of ``endpoint``: everything below derives from this value."""
    return overlay_for(endpoint.name, settings, claim)


# Every kind ``violations`` can return; the patch fixes each of them (the property tests).
VIOLATION_KINDS: Final = frozenset({DUPLICATE_URL, OPERATOR_URL, PATCH_LOST, SEED_MISSING, SERDE_MISMATCH})


# ---- reading a pod spec ---------------------------------------------------------------------------------------


def find_container(pod_spec: Mapping[str, Any], name: str) -> tuple[int, Mapping[str, Any]]:
    """The vLLM container: the one named after the Deployment, else the first
    (docs/reference/hyperpod.md#what-the-operator-renders: the operator puts it first). Init containers are never it."""
    containers = list(pod_spec.get("containers") or [])
    for i, c in enumerate(containers):
        if c.get("name") == name:
            return i, c
    return 0, containers[0] if containers else {}


def _named(items: Sequence[Mapping[str, Any]] | None, key: str, value: str) -> list[int]:
    return [i for i, item in enumerate(items or []) if item.get(key) == value]


# ---- violations -----------------------------------------------------------------------------------------------


def _env_violations(ov: Overlay, env: Sequence[Mapping[str, Any]], field: str) -> list[Violation]:
    out: list[Violation] = []
    for rule in ov.env:
        entries = [env[i] for i in _named(env, "name", rule.name)]
        where = f"{field}[{rule.name}]"
        values = ", ".join(str(e.get("value", "valueFrom")) for e in entries)
        if rule.unique and len(entries) > 1:
            out.append(Violation(DUPLICATE_URL, where, f"1 entry = {rule.value}", f"{len(entries)} entries: {values}"))
        if rule.unique and any(str(e.get("value")).startswith(OPERATOR_L2_SCHEME) for e in entries):
            out.append(Violation(OPERATOR_URL, where, rule.value, values))
        elif rule.unique and len(entries) > 1:
            continue
        elif not entries:
            out.append(Violation(rule.kind, where, rule.value, "absent"))
        elif not rule.holds(entries[-1]):
            out.append(Violation(rule.kind, where, rule.value, str(entries[-1].get("value", "valueFrom"))))
    return out


def violations(ov: Overlay, pod_spec: Mapping[str, Any]) -> list[Violation]:
    """Every way ``pod_spec`` (a Deployment template or a running pod) misses the overlay."""
    _, container = find_container(pod_spec, ov.container)
    cname = container.get("name") or ov.container
    out = _env_violations(ov, list(container.get("env") or []), f"containers[{cname}].env")
    vols = list(pod_spec.get("volumes") or [])
    at = _named(vols, "name", ov.volume_name)
    if not at or not ov.volume_holds(vols[at[0]]):
        pvc = (vols[at[0]].get("persistentVolumeClaim") or {}) if at else {}
        have = ("absent" if not at else f"pvc {pvc.get('claimName')}" + (" read-only" if pvc.get("readOnly") else ""))
        out.append(Violation(PATCH_LOST, f"volumes[{ov.volume_name}]", f"pvc {ov.claim}", have))
    mounts = list(container.get("volumeMounts") or [])
    at = _named(mounts, "mountPath", ov.mount_path)
    if not at or not ov.mount_holds(mounts[at[0]]):
        m = mounts[at[0]] if at else {}
        have = "absent" if not at else f"{m.get('name')} at {ov.mount_path}" + (" read-only" if m.get("readOnly")
                                                                                else "")
        out.append(Violation(PATCH_LOST, f"containers[{cname}].volumeMounts", f"{ov.volume_name} at {ov.mount_path}",
                             have))
    return out


# ---- the JSON patch -------------------------------------------------------------------------------------------


def _at(doc: Mapping[str, Any], pointer: str) -> Mapping[str, Any]:
    node: Any = doc
    for part in pointer.strip("/").split("/"):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _guarded(path: str, item: Mapping[str, Any], op: dict[str, Any]) -> list[dict[str, Any]]:
    """``op`` on ``path``, after a ``test`` that the item there is still ``item``: a concurrent re-render that
    moved things makes the patch fail instead of editing the wrong entry."""
    return [{"op": "test", "path": path, "value": dict(item)}, op]


def _added(raw: Any, path: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Append ``items`` to the list at ``path``, creating the list when it is absent or null."""
    if not items:
        return []
    if not isinstance(raw, list):
        return [{"op": "add", "path": path, "value": items}]
    return [{"op": "add", "path": f"{path}/-", "value": item} for item in items]


def _env_ops(ov: Overlay, raw: Any, path: str) -> list[dict[str, Any]]:
    env: list[Mapping[str, Any]] = list(raw) if isinstance(raw, list) else []
    ops: list[dict[str, Any]] = []
    # Extra entries of a unique name go first, from the highest index down, so the lower indexes stay valid.
    extra = sorted((i for r in ov.env if r.unique for i in _named(env, "name", r.name)[1:]), reverse=True)
    for i in extra:
        ops += _guarded(f"{path}/{i}", env[i], {"op": "remove", "path": f"{path}/{i}"})
    kept = [e for i, e in enumerate(env) if i not in set(extra)]
    missing = []
    for rule in ov.env:
        at = _named(kept, "name", rule.name)
        if not at:
            missing.append(rule.entry)
            continue
        i = at[0] if rule.unique else at[-1]
        if not rule.holds(kept[i]):
            ops += _guarded(f"{path}/{i}", kept[i], {"op": "replace", "path": f"{path}/{i}", "value": rule.entry})
    return ops + _added(raw, path, missing)


def _keyed_ops(raw: Any, path: str, key: str, want: dict[str, Any], holds: bool) -> list[dict[str, Any]]:
    """Put ``want`` in the list at ``path``, identified by ``want[key]``: replace the item if it is wrong, add it
    if absent."""
    items: list[Mapping[str, Any]] = list(raw) if isinstance(raw, list) else []
    at = _named(items, key, want[key])
    if not at:
        return _added(raw, path, [want])
    if holds:
        return []
    return _guarded(f"{path}/{at[0]}", items[at[0]], {"op": "replace", "path": f"{path}/{at[0]}", "value": want})


def pod_spec_ops(ov: Overlay, pod_spec: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """The ops that put the overlay on the pod spec found at JSON pointer ``prefix``; [] when it holds."""
    idx, container = find_container(pod_spec, ov.container)
    base = f"{prefix}/containers/{idx}"
    vols = [v for v in pod_spec.get("volumes") or [] if v.get("name") == ov.volume_name]
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") == ov.mount_path]
    ops = _env_ops(ov, container.get("env"), f"{base}/env")
    ops += _keyed_ops(pod_spec.get("volumes"), f"{prefix}/volumes", "name", ov.volume,
                      bool(vols) and ov.volume_holds(vols[0]))
    ops += _keyed_ops(container.get("volumeMounts"), f"{base}/volumeMounts", "mountPath", ov.mount,
                      bool(mounts) and ov.mount_holds(mounts[0]))
    if ops and container.get("name"):
        ops = [{"op": "test", "path": f"{base}/name", "value": container["name"]}, *ops]
    return ops


def json_patch(ov: Overlay, deployment: Mapping[str, Any]) -> list[dict[str, Any]]:
    """ONE JSON patch (RFC 6902) that puts the overlay on ``deployment``'s pod template: exactly one URL entry
    (the operator's replaced wherever it sits, duplicates removed), serde and seed, the volume (replaced when it
    points at the wrong claim) and the mount. Empty exactly when ``violations`` of the template is empty."""
    return pod_spec_ops(ov, _at(deployment, POD_TEMPLATE), POD_TEMPLATE)


# ---- Kyverno --------------------------------------------------------------------------------------------------

# The ClusterPolicy covers every endpoint: the vLLM container is the one named after the admitted Deployment.
KYVERNO_CONTAINER: Final = "{{request.object.metadata.name}}"


def kyverno_mutation(ov: Overlay) -> dict[str, Any]:
    """The ``patchStrategicMerge`` body that injects the overlay on admission: env merges by name (so the URL
    replaces the operator's entry), the container is selected with a conditional anchor on its name."""
    return {"spec": {"template": {"spec": {
        "containers": [{"(name)": ov.container, "env": [r.entry for r in ov.env], "volumeMounts": [ov.mount]}],
        "volumes": [ov.volume],
    }}}}
