"""Typed actions: every change a reconciler makes (or waits for), as data.

Called from the stages (``stages.tiered_storage``, ``stages.addons``, ``stages.curvine``, ``stages.endpoints``,
``stages.operator_pause``), which compute a list of actions from what they observed, and from
``stages.executor``, which either applies each action through the clients (with its write-ahead record) or renders
it for the dry run (`kvfleet plan --diff`). One list serves both, so the dry run shows exactly the calls the
rollout makes (docs/architecture.md, "One desired state, typed actions"; controller-runtime's dry run runs the same path
up to the write).

Pure: no I/O. Each action renders the ``kubectl``/``aws``/``helm`` command that would have the same effect, marked as an
equivalent (kvfleet itself calls the Kubernetes and AWS APIs, not those commands). Two actions are equal when
they would make the same call: a human diff travels along (``diff``) but takes no part in equality.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_values as cv

EQUIVALENT_MARK: Final = "(equivalent)"
# On a Deployment while kvfleet's temporary rolling/surge strategy is on it: the strategy to put back.
ORIGINAL_STRATEGY_ANNOTATION: Final = "kvfleet.io/original-strategy"


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class UpdateCluster:
    """HyperPod UpdateCluster: TieredStorageConfig (None: NodeRecovery alone) and NodeRecovery (always sent)."""

    kind: ClassVar[str] = "update_cluster"
    mutating: ClassVar[bool] = True
    cluster: str
    mode: str | None  # None: NodeRecovery only, the ai-toolkit daemon is left alone
    memory_percent: int | None
    node_recovery: str
    diff: str | None = field(default=None, compare=False)
    endpoint: None = None

    @property
    def tiered_storage(self) -> str | None:
        if self.mode is None:
            return None
        return f"Mode={self.mode}" + (f",InstanceMemoryAllocationPercentage={self.memory_percent}"
                                      if self.mode == "Enable" else "")

    def target(self) -> str:
        ts = f"TieredStorageConfig {self.tiered_storage}, " if self.tiered_storage else ""
        return f"HyperPod cluster {self.cluster}: {ts}NodeRecovery {self.node_recovery}"

    def equivalent(self) -> str:
        ts = f" --tiered-storage-config {self.tiered_storage}" if self.tiered_storage else ""
        return f"aws sagemaker update-cluster --cluster-name {self.cluster}{ts} --node-recovery {self.node_recovery}"


@dataclass(frozen=True)
class CreateAddon:
    """EKS CreateAddon (resolveConflicts OVERWRITE: a Helm-installed operator's objects are taken over)."""

    kind: ClassVar[str] = "create_addon"
    mutating: ClassVar[bool] = True
    eks_cluster: str
    name: str
    version: str | None
    configuration: str | None  # canonical JSON, or None
    resolve_conflicts: str
    diff: str | None = field(default=None, compare=False)
    endpoint: None = None

    def target(self) -> str:
        return f"EKS add-on {self.eks_cluster}/{self.name} {self.version or '(default version)'}"

    def config(self) -> dict[str, Any] | None:
        return dict(json.loads(self.configuration)) if self.configuration is not None else None

    def equivalent(self) -> str:
        return _addon_line("create-addon", self)


@dataclass(frozen=True)
class UpdateAddon:
    """EKS UpdateAddon (resolveConflicts PRESERVE: a platform team's own changes survive)."""

    kind: ClassVar[str] = "update_addon"
    mutating: ClassVar[bool] = True
    eks_cluster: str
    name: str
    version: str | None
    configuration: str | None
    resolve_conflicts: str
    diff: str | None = field(default=None, compare=False)
    endpoint: None = None

    def target(self) -> str:
        return f"EKS add-on {self.eks_cluster}/{self.name} {self.version or '(default version)'}"

    def config(self) -> dict[str, Any] | None:
        return dict(json.loads(self.configuration)) if self.configuration is not None else None

    def equivalent(self) -> str:
        return _addon_line("update-addon", self)


def _addon_line(verb: str, a: CreateAddon | UpdateAddon) -> str:
    version = f" --addon-version {a.version}" if a.version else ""
    config = f" --configuration-values '{a.configuration}'" if a.configuration is not None else ""
    return (f"aws eks {verb} --cluster-name {a.eks_cluster} --addon-name {a.name}{version}{config} "
            f"--resolve-conflicts {a.resolve_conflicts}")


@dataclass(frozen=True)
class ApplyEndpointConfig:
    """Create (with its namespace when missing) or update an InferenceEndpointConfig; ``body`` is canonical JSON:
    the whole object on create, ``{metadata: {labels}, spec}`` (a merge patch) on update."""

    kind: ClassVar[str] = "apply_iec"
    mutating: ClassVar[bool] = True
    endpoint: str  # the fleet-wide ref, cluster:namespace/name
    namespace: str
    name: str
    create: bool
    body: str
    diff: str | None = field(default=None, compare=False)

    def target(self) -> str:
        return f"InferenceEndpointConfig {self.namespace}/{self.name}"

    def equivalent(self) -> str:
        return (f"kubectl apply -n {self.namespace} -f -   # {'create' if self.create else 'update'} "
                f"{C.IEC_KIND} {self.name}")


@dataclass(frozen=True)
class PauseOperator:
    """Scale the inference operator's controller to 0, annotated with the holder (``stages.operator_pause``)."""

    kind: ClassVar[str] = "pause_operator"
    mutating: ClassVar[bool] = True
    controller: str
    holder: str
    endpoint: None = None
    diff: None = None

    def target(self) -> str:
        return f"Deployment {C.OPERATOR_NAMESPACE}/{self.controller} by {self.holder}"

    def equivalent(self) -> str:
        return (f"kubectl annotate deployment {self.controller} -n {C.OPERATOR_NAMESPACE} "
                f"{C.PAUSED_BY_ANNOTATION}={self.holder} && kubectl scale deployment {self.controller} "
                f"-n {C.OPERATOR_NAMESPACE} --replicas=0")


@dataclass(frozen=True)
class RestoreOperator:
    """Scale the controller back to its recorded replicas and clear the pause annotations; waits until Ready."""

    kind: ClassVar[str] = "restore_operator"
    mutating: ClassVar[bool] = True
    controller: str
    holder: str
    endpoint: None = None
    diff: None = None

    def target(self) -> str:
        return f"Deployment {C.OPERATOR_NAMESPACE}/{self.controller} paused by {self.holder}"

    def equivalent(self) -> str:
        return (f"kubectl scale deployment {self.controller} -n {C.OPERATOR_NAMESPACE} --replicas=<recorded> "
                f"&& kubectl annotate deployment {self.controller} -n {C.OPERATOR_NAMESPACE} "
                f"{C.PAUSED_BY_ANNOTATION}-   # only after every pod is Ready")


@dataclass(frozen=True)
class Scale:
    kind: ClassVar[str] = "scale"
    mutating: ClassVar[bool] = True
    endpoint: str
    namespace: str
    name: str
    replicas: int
    diff: None = None

    def target(self) -> str:
        return f"Deployment {self.namespace}/{self.name} replicas={self.replicas}"

    def equivalent(self) -> str:
        return f"kubectl scale deployment {self.name} -n {self.namespace} --replicas={self.replicas}"


@dataclass(frozen=True)
class PatchDeployment:
    """One JSON patch (RFC 6902) on a rendered Deployment; ``patch`` is canonical JSON."""

    kind: ClassVar[str] = "patch_deployment"
    mutating: ClassVar[bool] = True
    endpoint: str
    namespace: str
    name: str
    patch: str
    diff: None = None

    def ops(self) -> list[dict[str, Any]]:
        return list(json.loads(self.patch))

    def target(self) -> str:
        return f"Deployment {self.namespace}/{self.name}"

    def equivalent(self) -> str:
        return f"kubectl patch deployment {self.name} -n {self.namespace} --type=json -p '{self.patch}'"


@dataclass(frozen=True)
class SetRolloutStrategy:
    """Replace a Deployment's ``spec.strategy`` (canonical JSON): the temporary one of a rolling or surge update,
    which also records the original in the annotation ``ORIGINAL_STRATEGY_ANNOTATION`` (``original``), or the
    original back (``restore``), which removes that annotation. A strategy change alone starts no rollout. The
    annotation lets a later run put back what a run killed mid-wave left (``stages.endpoints``)."""

    kind: ClassVar[str] = "set_rollout_strategy"
    mutating: ClassVar[bool] = True
    endpoint: str
    namespace: str
    name: str
    strategy: str
    restore: bool = False
    original: str | None = None  # set with a temporary strategy: recorded on the Deployment
    annotations_exist: bool = True  # the live object has metadata.annotations (JSON patch adds the map if not)
    diff: None = None

    def ops(self) -> list[dict[str, Any]]:
        ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/strategy", "value": json.loads(self.strategy)}]
        if self.restore:
            ops.append({"op": "remove", "path": f"/metadata/annotations/{_pointer(ORIGINAL_STRATEGY_ANNOTATION)}"})
        elif self.original is not None and self.annotations_exist:
            ops.append({"op": "add", "path": f"/metadata/annotations/{_pointer(ORIGINAL_STRATEGY_ANNOTATION)}",
                        "value": self.original})
        elif self.original is not None:
            ops.append({"op": "add", "path": "/metadata/annotations",
                        "value": {ORIGINAL_STRATEGY_ANNOTATION: self.original}})
        return ops

    def target(self) -> str:
        return f"Deployment {self.namespace}/{self.name} strategy {self.strategy}"

    def equivalent(self) -> str:
        why = "   # the original strategy back" if self.restore else ""
        return (f"kubectl patch deployment {self.name} -n {self.namespace} --type=json -p "
                f"'{_compact(self.ops())}'{why}")


def _pointer(key: str) -> str:
    """A map key as one JSON Pointer token (RFC 6901: ~ -> ~0, / -> ~1)."""
    return key.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class VerifyRendered:
    """Read the Deployment back: the L2 overlay is there (and ``strategy``, when given, is the live one)."""

    kind: ClassVar[str] = "verify_rendered"
    mutating: ClassVar[bool] = False
    endpoint: str
    namespace: str
    name: str
    strategy: str | None = None
    diff: None = None

    def target(self) -> str:
        return f"Deployment {self.namespace}/{self.name}"

    def equivalent(self) -> str:
        return (f"kubectl get deployment {self.name} -n {self.namespace} -o yaml   # check the L2 overlay"
                + (" and the strategy" if self.strategy else ""))


@dataclass(frozen=True)
class WaitPods:
    """Wait until each Deployment has exactly ``want`` pods, all Ready (with the L2 overlay when ``new_env``).
    ``want`` holds (namespace/name, replicas) pairs in wave order."""

    kind: ClassVar[str] = "wait_pods"
    mutating: ClassVar[bool] = False
    want: tuple[tuple[str, int], ...]
    new_env: bool
    endpoint: None = None
    diff: None = None

    def target(self) -> str:
        return ", ".join(f"{k}={n}" for k, n in self.want)

    def equivalent(self) -> str:
        parts = []
        for key, n in self.want:
            ns, name = key.split("/", 1)
            parts.append(f"kubectl rollout status deployment {name} -n {ns}" if n else
                         f"kubectl wait pods -l app={name} -n {ns} --for=delete")
        return " && ".join(parts) + ("   # every pod Ready with the L2 overlay" if self.new_env else "")


@dataclass(frozen=True)
class WaitRolledOut:
    """Wait until each Deployment is observed and fully available at ``want`` replicas (status.observedGeneration
    caught up with metadata.generation, updated = available = replicas = want). Before the operator comes back:
    it re-renders a Deployment that is not fully available, and every patch bumped the generation."""

    kind: ClassVar[str] = "wait_rolled_out"
    mutating: ClassVar[bool] = False
    want: tuple[tuple[str, int], ...]
    endpoint: None = None
    diff: None = None

    def target(self) -> str:
        return ", ".join(f"{k}={n}" for k, n in self.want)

    def equivalent(self) -> str:
        return " && ".join(f"kubectl rollout status deployment {key.split('/', 1)[1]} -n {key.split('/', 1)[0]}"
                           for key, _ in self.want) + "   # observed and fully available"


@dataclass(frozen=True)
class RerenderDeployment:
    """Kyverno mode: annotate the pod template (a rollout), so the operator re-renders through admission. The
    timestamp is taken when applied."""

    kind: ClassVar[str] = "rerender_deployment"
    mutating: ClassVar[bool] = True
    endpoint: str
    namespace: str
    name: str
    diff: None = None

    def target(self) -> str:
        return f"Deployment {self.namespace}/{self.name}"

    def equivalent(self) -> str:
        return (f"kubectl patch deployment {self.name} -n {self.namespace} -p "
                "'{\"spec\":{\"template\":{\"metadata\":{\"annotations\":{\"kvfleet.io/rerender-requested-at\":"
                "\"<now>\"}}}}}'   # rollout -> the operator re-renders through Kyverno admission")


@dataclass(frozen=True)
class ApplyClusterPolicy:
    """Patch the spec of kvfleet's Kyverno ClusterPolicy (the L2 overlay's injection) back to the desired one;
    ``body`` is canonical JSON. Never a create: the policy comes with the kvfleet-bootstrap bundle."""

    kind: ClassVar[str] = "apply_cluster_policy"
    mutating: ClassVar[bool] = True
    name: str
    body: str  # the whole desired ClusterPolicy; the patch sends its spec only
    diff: str | None = field(default=None, compare=False)
    endpoint: None = None

    def target(self) -> str:
        return f"ClusterPolicy {self.name}"

    def equivalent(self) -> str:
        return (f"kubectl patch clusterpolicies.kyverno.io {self.name} --type merge -p '{{\"spec\": ...}}'"
                "   # the spec of k8s/kyverno/curvine-l2-policy.yaml, rendered for the inventory")


# ---- stage 3: Curvine (helm releases and the objects around them) ---------------------------------------------


def values_digest(values: Mapping[str, Any]) -> str:
    """The digest of the values file kvfleet writes for ``values`` (dotted keys, ``\\.`` for a literal dot, or
    nested): ``tree_digest`` of the nested tree. The executor checks the file it hands helm against it, so a
    journal entry says what helm was given."""
    return tree_digest(cv.nested(values))


def tree_digest(tree: Any) -> str:
    """sha256 (first 16 hex digits) of a values tree (as loaded from a values file) as canonical JSON."""
    return hashlib.sha256(_compact(tree).encode()).hexdigest()[:16]


def _values_comment(values: Mapping[str, Any], digest: str) -> str:
    pairs = cv.flatten(cv.nested(values))
    text = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(pairs.items()))
    return f"{_values_file(digest)}: {text}"


def _values_file(digest: str) -> str:
    return f"values-{digest}.yaml"


def _helm_line(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in ["helm", *words])


@dataclass(frozen=True)
class HelmInstall:
    """``helm install`` of a chart version from a repository, values only as a YAML file kvfleet writes (``-f``,
    never ``--set``). ``values`` is canonical JSON of the dotted keys; ``values_digest`` the file's content
    digest (``values_digest``). ``why`` is part of the audit target (e.g. ``format flags true``)."""

    kind: ClassVar[str] = "helm_install"
    mutating: ClassVar[bool] = True
    release: str
    chart: str
    namespace: str
    repo: str
    version: str
    values: str
    values_digest: str
    why: str | None = None
    endpoint: None = None
    diff: None = None

    def values_map(self) -> dict[str, Any]:
        return dict(json.loads(self.values))

    def target(self) -> str:
        return f"release {self.namespace}/{self.release} {self.version}" + (f" ({self.why})" if self.why else "")

    def equivalent(self) -> str:
        return (_helm_line(["install", self.release, self.chart, "--repo", self.repo, "--version", self.version,
                            "-n", self.namespace, "-f", _values_file(self.values_digest)])
                + f"   # {_values_comment(self.values_map(), self.values_digest)}")


@dataclass(frozen=True)
class HelmUpgrade:
    """``helm upgrade`` (``--reuse-values`` unless ``reuse_values`` is false) with a values file, as ``HelmInstall``.
    ``why`` names the change in the audit target (``format flags false``); ``when`` says when it runs in its
    sequence (rendered only). A chart upgrade (``reset_then_reuse``) passes ``--reset-then-reuse-values`` and a
    second values file last (``last_values``, its digest ``last_digest``: the format flags false, so they win)."""

    kind: ClassVar[str] = "helm_upgrade"
    mutating: ClassVar[bool] = True
    release: str
    chart: str
    namespace: str
    repo: str
    version: str
    values: str
    values_digest: str
    reuse_values: bool = True
    why: str | None = None
    when: str | None = None
    reset_then_reuse: bool = False
    last_values: str | None = None  # canonical JSON: a second values file, after --reset-then-reuse-values
    last_digest: str | None = None
    endpoint: None = None
    diff: str | None = field(default=None, compare=False)  # the values diff, for a person

    def values_map(self) -> dict[str, Any]:
        return dict(json.loads(self.values))

    def last_values_map(self) -> dict[str, Any] | None:
        return dict(json.loads(self.last_values)) if self.last_values is not None else None

    def target(self) -> str:
        return f"release {self.namespace}/{self.release} {self.why or self.version}"

    def files(self) -> list[tuple[str, dict[str, Any]]]:
        """The values files of the command, in order, by the name the equivalent gives them (their digest)."""
        out = [(_values_file(self.values_digest), self.values_map())] if self.values_map() else []
        last = self.last_values_map()
        return out + ([(_values_file(self.last_digest or ""), last)] if last is not None else [])

    def equivalent(self) -> str:
        words = ["upgrade", self.release, self.chart, "--repo", self.repo, "--version", self.version,
                 "-n", self.namespace]
        words += ["--reuse-values"] if self.reuse_values else []
        values = self.values_map()
        words += ["-f", _values_file(self.values_digest)] if values else []
        words += ["--reset-then-reuse-values"] if self.reset_then_reuse else []
        last = self.last_values_map()
        words += ["-f", _values_file(self.last_digest or "")] if last is not None else []
        notes = [_values_comment(values, self.values_digest)] if values else []
        notes += [_values_comment(last, self.last_digest or "")] if last is not None else []
        notes += [self.when] if self.when else []
        return _helm_line(words) + (f"   # {'; '.join(notes)}" if notes else "")


def helm_install(release: str, chart: str, namespace: str, *, repo: str, version: str,
                 values: Mapping[str, Any], why: str | None = None) -> HelmInstall:
    """A ``HelmInstall`` of ``values`` (dotted or nested keys), its digest computed."""
    return HelmInstall(release, chart, namespace, repo, version, _compact(dict(values)), values_digest(values),
                       why)


def helm_upgrade(release: str, chart: str, namespace: str, *, repo: str, version: str,
                 values: Mapping[str, Any], reuse_values: bool = True, why: str | None = None,
                 when: str | None = None, reset_then_reuse: bool = False,
                 last_values: Mapping[str, Any] | None = None) -> HelmUpgrade:
    """A ``HelmUpgrade`` of ``values`` (dotted or nested keys; ``last_values``: the file after
    ``--reset-then-reuse-values``), digests computed."""
    return HelmUpgrade(release, chart, namespace, repo, version, _compact(dict(values)), values_digest(values),
                       reuse_values=reuse_values, why=why, when=when, reset_then_reuse=reset_then_reuse,
                       last_values=_compact(dict(last_values)) if last_values is not None else None,
                       last_digest=values_digest(last_values) if last_values is not None else None)


@dataclass(frozen=True)
class HelmRollback:
    """``helm rollback`` to ``revision`` (chosen by the caller: every format flag false in its stored values and
    objects); ``from_revision`` is the failed one, for the audit target."""

    kind: ClassVar[str] = "helm_rollback"
    mutating: ClassVar[bool] = True
    release: str
    namespace: str
    revision: int
    from_revision: int
    endpoint: None = None
    diff: None = None

    def target(self) -> str:
        return f"release {self.namespace}/{self.release} revision {self.from_revision} -> {self.revision}"

    def equivalent(self) -> str:
        return _helm_line(["rollback", self.release, str(self.revision), "-n", self.namespace])


@dataclass(frozen=True)
class CreateStorageClass:
    """Create a StorageClass (``body``: canonical JSON). Its parameters are immutable: a differing one is only
    reported, never replaced."""

    kind: ClassVar[str] = "create_storage_class"
    mutating: ClassVar[bool] = True
    name: str
    body: str
    endpoint: None = None
    diff: None = None

    def target(self) -> str:
        return f"StorageClass {self.name}"

    def equivalent(self) -> str:
        body = json.loads(self.body)
        params = ", ".join(f"{k} {v}" for k, v in sorted((body.get("parameters") or {}).items()))
        return (f"kubectl create -f -   # StorageClass {self.name}: provisioner {body.get('provisioner')}"
                + (f", {params}" if params else ""))


@dataclass(frozen=True)
class CreatePvc:
    """Create a PersistentVolumeClaim (``body``: canonical JSON)."""

    kind: ClassVar[str] = "create_pvc"
    mutating: ClassVar[bool] = True
    namespace: str
    name: str
    body: str
    endpoint: None = None
    diff: None = None

    def target(self) -> str:
        return f"PersistentVolumeClaim {self.namespace}/{self.name}"

    def equivalent(self) -> str:
        spec = json.loads(self.body).get("spec") or {}
        return (f"kubectl create -n {self.namespace} -f -   # PersistentVolumeClaim {self.name} "
                f"({', '.join(spec.get('accessModes') or [])}, class {spec.get('storageClassName')})")


Action = (UpdateCluster | CreateAddon | UpdateAddon | ApplyEndpointConfig | PauseOperator | RestoreOperator | Scale
          | PatchDeployment | SetRolloutStrategy | VerifyRendered | WaitPods | WaitRolledOut | RerenderDeployment
          | ApplyClusterPolicy | HelmInstall | HelmUpgrade | HelmRollback | CreateStorageClass
          | CreatePvc)


def canonical(value: Any) -> str:
    """The JSON text an action carries for a structured value (sorted keys, no spaces): equal values, equal text."""
    return _compact(value)


def render(action: Action) -> str:
    """The one line a dry run prints for an action: its command equivalent, marked as such."""
    return f"{EQUIVALENT_MARK} {action.equivalent()}"


@dataclass(frozen=True)
class WaveItem:
    """One endpoint of a patch wave, as observed and decided before anything changes."""

    endpoint: str  # ref
    namespace: str
    name: str
    replicas: int  # live spec.replicas, restored by scale-to-zero
    strategy: str  # rolling | surge | scale-to-zero
    patch: str  # the L2 JSON patch (canonical JSON), checked by a server dry run
    original_strategy: str | None = None  # the Deployment's spec.strategy (canonical JSON), restored
    temporary_strategy: str | None = None  # rolling/surge: the RollingUpdate fields used while patching
    annotations_exist: bool = True  # the live Deployment has metadata.annotations

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def patch_wave_actions(controller: str, holder: str, items: list[WaveItem]) -> list[Action]:
    """The patch mode's sequence for one wave, one operator pause for all
    (docs/reference/hyperpod.md#what-the-operator-renders):

    pause the operator -> rolling/surge endpoints get their temporary strategy -> scale-to-zero endpoints go to
    0 and their pods are gone -> one JSON patch per endpoint, read back -> scale-to-zero endpoints back to their
    replicas -> every pod Ready with the overlay (rolling/surge: the Deployment controller replaces the pods
    while the operator is paused, N-1 or N keep serving) -> the original strategies back, read back -> restore
    the operator, last: it re-renders a Deployment that is not fully available."""
    if not items:
        return []
    rolled = [i for i in items if i.strategy != "scale-to-zero"]
    zeroed = [i for i in items if i.strategy == "scale-to-zero"]
    out: list[Action] = [PauseOperator(controller, holder)]
    out += [SetRolloutStrategy(i.endpoint, i.namespace, i.name, i.temporary_strategy or "{}",
                               original=i.original_strategy, annotations_exist=i.annotations_exist)
            for i in rolled]
    out += [Scale(i.endpoint, i.namespace, i.name, 0) for i in zeroed]
    if zeroed:
        out.append(WaitPods(tuple((i.key, 0) for i in zeroed), new_env=False))
    for i in items:
        out += [PatchDeployment(i.endpoint, i.namespace, i.name, i.patch), VerifyRendered(i.endpoint, i.namespace,
                                                                                          i.name)]
    out += [Scale(i.endpoint, i.namespace, i.name, i.replicas) for i in zeroed]
    out.append(WaitPods(tuple((i.key, i.replicas) for i in items), new_env=True))
    for i in rolled:
        original = i.original_strategy or "{}"
        out += [SetRolloutStrategy(i.endpoint, i.namespace, i.name, original, restore=True),
                VerifyRendered(i.endpoint, i.namespace, i.name, strategy=original)]
    out.append(WaitRolledOut(tuple((i.key, i.replicas) for i in items)))
    out.append(RestoreOperator(controller, holder))
    return out


def strategy_repair_actions(controller: str, holder: str,
                            left: list[tuple[SetRolloutStrategy, int]]) -> list[Action]:
    """Put back the original strategies a killed run left (``left``: each restore with the Deployment's
    replicas), inside a pause of their own: a strategy patch bumps the generation, and a running operator would
    re-render the Deployment (dropping the L2 overlay) until the Deployment controller has observed it."""
    if not left:
        return []
    return [PauseOperator(controller, holder), *[a for a, _ in left],
            WaitRolledOut(tuple((f"{a.namespace}/{a.name}", n) for a, n in left)), RestoreOperator(controller, holder)]
