"""The desired state of one endpoint: its InferenceEndpointConfig, the L2 overlay of its Deployment, and the
rules a Deployment and its pods must satisfy for cross-pod L2 sharing to work.

Pure. Used by stage 4 (render, patch, verify), stage 5 (env pre-check) and the drift check (same rules, one
function: ``l2_violations``), so "what correct looks like" is written once.

Sources: DOMAIN.md stage 4 and FACTS.md §2.3 — LMCACHE_REMOTE_URL must be exactly one entry with the fs:// path
(the operator injects its own ``sagemaker-hyperpod://`` entry, whose index varies by operator version), serde
``naive``, ``PYTHONHASHSEED=0``, and the Curvine PVC mounted at /mnt/curvine. The URL is kept out of the CR:
declaring it there produces a duplicate entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvfleet.fleet import constants as C
from kvfleet.fleet.inventory import Endpoint, Settings

# Fields of the CR that the operator refuses to change on an existing endpoint (CRD descriptions, cited in
# tests/conformance/facts/inference_endpoint_config.yaml: "Once set, the enabled field cannot be modified";
# intelligentRoutingSpec "Adding this configuration to an existing deployment will be rejected").
IMMUTABLE_FIELDS = ("intelligentRoutingSpec.enabled",)
# Sections of the spec that cannot be added to an existing endpoint.
NOT_ADDABLE_SECTIONS = ("intelligentRoutingSpec",)
# The CRD's defaults for those fields: what the API server stores when the section is present without the field.
IMMUTABLE_DEFAULTS: dict[str, Any] = {"intelligentRoutingSpec.enabled": False}


@dataclass(frozen=True)
class Violation:
    kind: str  # a drift kind: duplicate_l2_url, operator_l2_url, patch_lost_to_reconcile, hash_seed_missing, ...
    field: str
    expected: str
    actual: str

    def text(self) -> str:
        return f"{self.kind}: {self.field} expected {self.expected!r}, found {self.actual!r}"


def managed_labels(ep: Endpoint) -> dict[str, str]:
    labels = {C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE, C.LOB_LABEL: ep.lob}
    if ep.l2:
        labels[C.L2_LABEL] = "curvine"
    return labels


def worker_env(ep: Endpoint, settings: Settings) -> list[dict[str, str]]:
    """The worker env kvfleet declares in the CR (never LMCACHE_REMOTE_URL: see module docstring)."""
    env = {
        C.ENV_REMOTE_SERDE: settings.serde,
        C.ENV_HASHSEED: settings.hash_seed,
        C.ENV_CHUNK_SIZE: str(settings.chunk_size),
        **{k: str(v) for k, v in ep.extra_env.items()},
    }
    return [{"name": k, "value": env[k]} for k in sorted(env)]


def render_iec(ep: Endpoint, settings: Settings) -> dict[str, Any]:
    kv: dict[str, Any] = {"enableL1Cache": ep.l1, "enableL2Cache": ep.l2}
    if ep.l2:
        kv["l2CacheSpec"] = {"l2CacheBackend": "tieredstorage"}
    return {
        "apiVersion": f"{C.IEC_GROUP}/{C.IEC_VERSION}",
        "kind": C.IEC_KIND,
        "metadata": {"name": ep.name, "namespace": ep.namespace, "labels": managed_labels(ep)},
        "spec": {
            "modelName": ep.model,
            "endpointName": ep.name,
            "instanceType": ep.instance_type,
            "replicas": ep.replicas,
            "invocationEndpoint": "v1/chat/completions",
            "modelSourceConfig": {"modelSourceType": "huggingface", "huggingFaceModel": {"modelId": ep.model_id}},
            "worker": {
                "image": ep.image,
                "modelInvocationPort": {"containerPort": 8000, "name": "http"},
                "modelVolumeMount": {"name": "model-weights", "mountPath": "/opt/ml/model"},
                "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 1}},
                "environmentVariables": worker_env(ep, settings),
            },
            "kvCacheSpec": kv,
            "intelligentRoutingSpec": {"enabled": True, "routingStrategy": ep.routing},
        },
    }


def _get(obj: Mapping[str, Any] | None, dotted: str) -> Any:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


# Fields kvfleet owns in the CR; anything else (defaults the API server filled in) is not compared.
OWNED_FIELDS = ("modelName", "instanceType", "replicas", "worker.image", "kvCacheSpec.enableL1Cache",
                "kvCacheSpec.enableL2Cache", "intelligentRoutingSpec.enabled", "intelligentRoutingSpec.routingStrategy")


def _env_map(env: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    return {str(e.get("name")): e.get("value") for e in env or []}


def cr_differences(live_spec: Mapping[str, Any], desired_spec: Mapping[str, Any]) -> list[Violation]:
    diffs = []
    for field in OWNED_FIELDS:
        want, have = _get(desired_spec, field), _get(live_spec, field)
        if want != have:
            diffs.append(Violation("cr_mismatch", f"spec.{field}", str(want), str(have)))
    want_env = _env_map(_get(desired_spec, "worker.environmentVariables"))
    have_env = _env_map(_get(live_spec, "worker.environmentVariables"))
    for name, value in sorted(want_env.items()):
        if have_env.get(name) != value:
            diffs.append(Violation("cr_mismatch", f"spec.worker.environmentVariables[{name}]", str(value),
                                   str(have_env.get(name))))
    return diffs


def immutable_changes(live_spec: Mapping[str, Any], desired_spec: Mapping[str, Any]) -> list[str]:
    """What the operator would reject on the existing endpoint whose spec is ``live_spec``: a section added that
    the CRD says cannot be added to an existing deployment (intelligentRoutingSpec), or an immutable field changed.
    Each entry names the field, the live and the wanted value; the caller says how to proceed (delete and
    recreate the endpoint deliberately, or revert the inventory)."""
    out = []
    added = set()
    for section in NOT_ADDABLE_SECTIONS:
        if _get(live_spec, section) is None and _get(desired_spec, section) is not None:
            added.add(section)
            out.append(f"spec.{section}: absent on the live endpoint, inventory adds {_get(desired_spec, section)!r} "
                       "(the CRD: adding this configuration to an existing deployment will be rejected)")
    for field in IMMUTABLE_FIELDS:
        if field.split(".", 1)[0] in added:
            continue
        have, want = _get(live_spec, field), _get(desired_spec, field)
        section = field.rsplit(".", 1)[0]
        if have is None and isinstance(_get(live_spec, section), Mapping):
            have = IMMUTABLE_DEFAULTS.get(field)
        if have is not None and have != want:
            out.append(f"spec.{field}: live {have!r}, inventory wants {want!r}")
    return out


# ---- the L2 overlay on the rendered Deployment --------------------------------------------------------------


def vllm_container_index(deployment: Mapping[str, Any]) -> int:
    """The operator names the vLLM container after the Deployment and puts it first (FACTS.md §2.3)."""
    containers = _get(deployment, "spec.template.spec.containers") or []
    name = _get(deployment, "metadata.name")
    for i, c in enumerate(containers):
        if c.get("name") == name:
            return i
    return 0


def l2_violations(pod_spec: Mapping[str, Any], container_name: str, settings: Settings,
                  pvc_name: str = C.CURVINE_PVC) -> list[Violation]:
    """Every way a pod spec (a Deployment template or a running pod) breaks cross-pod L2 sharing."""
    containers = pod_spec.get("containers") or []
    container = next((c for c in containers if c.get("name") == container_name), containers[0] if containers else {})
    env = container.get("env") or []
    urls = [e.get("value") for e in env if e.get("name") == C.ENV_REMOTE_URL]
    out: list[Violation] = []
    field = f"containers[{container.get('name')}].env"
    if len(urls) > 1:
        out.append(Violation("duplicate_l2_url", f"{field}[{C.ENV_REMOTE_URL}]", f"1 entry = {settings.l2_url}",
                             f"{len(urls)} entries: {', '.join(map(str, urls))}"))
    if urls and any(str(u).startswith("sagemaker-hyperpod://") for u in urls):
        out.append(Violation("operator_l2_url", f"{field}[{C.ENV_REMOTE_URL}]", settings.l2_url,
                             ", ".join(map(str, urls))))
    elif len(urls) == 1 and urls[0] != settings.l2_url:
        out.append(Violation("patch_lost_to_reconcile", f"{field}[{C.ENV_REMOTE_URL}]", settings.l2_url, str(urls[0])))
    elif not urls:
        out.append(Violation("patch_lost_to_reconcile", f"{field}[{C.ENV_REMOTE_URL}]", settings.l2_url, "absent"))
    envmap = _env_map(env)
    seed = envmap.get(C.ENV_HASHSEED)
    if seed != settings.hash_seed:
        out.append(Violation("hash_seed_missing", f"{field}[{C.ENV_HASHSEED}]", settings.hash_seed, str(seed)))
    serde = envmap.get(C.ENV_REMOTE_SERDE)
    if serde != settings.serde:
        out.append(Violation("serde_mismatch", f"{field}[{C.ENV_REMOTE_SERDE}]", settings.serde, str(serde)))
    vol = next((v for v in pod_spec.get("volumes") or [] if v.get("name") == C.L2_VOLUME_NAME), None)
    claim = _get(vol, "persistentVolumeClaim.claimName") if vol else None
    if claim != pvc_name:
        out.append(Violation("patch_lost_to_reconcile", f"volumes[{C.L2_VOLUME_NAME}]", f"pvc {pvc_name}",
                             f"pvc {claim}" if vol else "absent"))
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") == C.L2_VOLUME_NAME]
    if not any(m.get("mountPath") == C.L2_MOUNT_PATH for m in mounts):
        out.append(Violation("patch_lost_to_reconcile", f"containers[{container.get('name')}].volumeMounts",
                             f"{C.L2_VOLUME_NAME} at {C.L2_MOUNT_PATH}",
                             ", ".join(str(m.get("mountPath")) for m in mounts) or "absent"))
    return out


# What the L2 overlay (patch or Kyverno) is responsible for; seed and serde come from the CR's worker env.
OVERLAY_KINDS = frozenset({"duplicate_l2_url", "operator_l2_url", "patch_lost_to_reconcile"})


def overlay_violations(pod_spec: Mapping[str, Any], container_name: str, settings: Settings,
                       pvc_name: str = C.CURVINE_PVC) -> list[Violation]:
    return [v for v in l2_violations(pod_spec, container_name, settings, pvc_name) if v.kind in OVERLAY_KINDS]


def l2_patch(deployment: Mapping[str, Any], settings: Settings, pvc_name: str = C.CURVINE_PVC) -> list[dict[str, Any]]:
    """ONE JSON patch that leaves exactly one LMCACHE_REMOTE_URL (the fs:// URL, replacing the operator's entry
    wherever it sits), and adds the Curvine volume and mount if missing. ``test`` ops guard the indexes, so a
    concurrent re-render makes the patch fail instead of corrupting the env list. Empty when nothing to do."""
    idx = vllm_container_index(deployment)
    base = f"/spec/template/spec/containers/{idx}"
    spec = _get(deployment, "spec.template.spec") or {}
    container = (spec.get("containers") or [{}])[idx]
    env = list(container.get("env") or [])
    ops: list[dict[str, Any]] = []
    url_idx = [i for i, e in enumerate(env) if e.get("name") == C.ENV_REMOTE_URL]
    # Remove duplicates from the end so earlier indexes stay valid, then set the first one.
    for i in reversed(url_idx[1:]):
        ops += [{"op": "test", "path": f"{base}/env/{i}/name", "value": C.ENV_REMOTE_URL},
                {"op": "remove", "path": f"{base}/env/{i}"}]
    if url_idx:
        first = url_idx[0]
        if env[first].get("value") != settings.l2_url or "valueFrom" in env[first] or len(url_idx) > 1:
            ops += [{"op": "test", "path": f"{base}/env/{first}/name", "value": C.ENV_REMOTE_URL},
                    {"op": "replace", "path": f"{base}/env/{first}",
                     "value": {"name": C.ENV_REMOTE_URL, "value": settings.l2_url}}]
    else:
        path = f"{base}/env/-" if env else f"{base}/env"
        value: Any = {"name": C.ENV_REMOTE_URL, "value": settings.l2_url}
        ops.append({"op": "add", "path": path, "value": value if env else [value]})
    if not any(v.get("name") == C.L2_VOLUME_NAME for v in spec.get("volumes") or []):
        vol = {"name": C.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": pvc_name}}
        ops.append({"op": "add", "path": "/spec/template/spec/volumes/-" if spec.get("volumes")
                    else "/spec/template/spec/volumes", "value": vol if spec.get("volumes") else [vol]})
    mounts = container.get("volumeMounts") or []
    if not any(m.get("name") == C.L2_VOLUME_NAME and m.get("mountPath") == C.L2_MOUNT_PATH for m in mounts):
        mount = {"name": C.L2_VOLUME_NAME, "mountPath": C.L2_MOUNT_PATH}
        ops.append({"op": "add", "path": f"{base}/volumeMounts/-" if mounts else f"{base}/volumeMounts",
                    "value": mount if mounts else [mount]})
    return ops


def pvc_manifest(namespace: str, storage_class: str, size: str = "100Gi", name: str = C.CURVINE_PVC) -> dict[str, Any]:
    """The ReadWriteMany PVC the inference pods mount (one per endpoint namespace)."""
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE}},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": storage_class,
                 "resources": {"requests": {"storage": size}}},
    }


def kyverno_policy(settings: Settings, pvc_name: str = C.CURVINE_PVC,
                   name: str = "kvfleet-curvine-l2") -> dict[str, Any]:
    """The ClusterPolicy of `kyverno` mode: on every admission of a Deployment labelled tiered-kv/l2=curvine,
    inject the fs:// URL (env merges by name, so it replaces the operator's entry), the volume and the mount
    into the vLLM container — the one named after the Deployment, selected with a conditional anchor."""
    return {
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
        "metadata": {"name": name, "labels": {C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE},
                     "annotations": {"policies.kyverno.io/description":
                                     "Inject the Curvine L2 mount and LMCache fs:// URL into operator-rendered "
                                     "vLLM Deployments, so they survive every operator re-render."}},
        "spec": {
            "background": False,
            "rules": [{
                "name": "curvine-l2",
                "match": {"any": [{"resources": {"kinds": ["Deployment"],
                                                 "selector": {"matchLabels": {C.L2_LABEL: "curvine"}}}}]},
                "mutate": {"patchStrategicMerge": {"spec": {"template": {"spec": {
                    "containers": [{
                        "(name)": "{{request.object.metadata.name}}",
                        "env": [{"name": C.ENV_REMOTE_URL, "value": settings.l2_url},
                                {"name": C.ENV_REMOTE_SERDE, "value": settings.serde},
                                {"name": C.ENV_HASHSEED, "value": settings.hash_seed}],
                        "volumeMounts": [{"name": C.L2_VOLUME_NAME, "mountPath": C.L2_MOUNT_PATH}],
                    }],
                    "volumes": [{"name": C.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": pvc_name}}],
                }}}}},
            }],
        },
    }
