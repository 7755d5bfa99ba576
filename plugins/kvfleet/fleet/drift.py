"""Drift rules: compare one cluster's observed state with the inventory and name every difference.

Pure. Called by the drift reconciler (``kvfleet.stages.drift``), which gathers a :class:`ClusterObservation`
with a fixed number of LIST calls per cluster and hands it here; unit-tested without any cluster.

The endpoint rules are stage 4's own (``fleet.endpoint_spec``: ``l2_violations`` for the Deployment template,
``cr_differences`` for the CR), so "correct" is written once. The rest comes from the issue that asked for the
check and from the sources: a format flag left true wipes Curvine on the next pod start
(docs/reference/curvine.md#format-flags); pods that do not agree on ``PYTHONHASHSEED`` compute different LMCache keys,
so cross-pod sharing fails silently (docs/reference/hyperpod.md#what-the-operator-renders); an operator left paused
stops rendering every endpoint of the cluster, and one whose pauser is dead will never be restored by it; fewer Curvine
files or less capacity than at the last snapshot is L2 data lost (``curvine_data_loss``); a NodeRecovery the inventory
declares and the cluster does not have is ``node_recovery_mismatch`` (an undeclared one is never judged).

One kind per condition, so that an audit query by kind tells the truth: a missing add-on
(``addon_missing``), a status other than ACTIVE (``addon_not_active``), a wrong version or configuration
(``addon_version_mismatch``, ``addon_config_mismatch``), a missing operator controller (``operator_missing``), a
missing Curvine release (``curvine_release_missing``), an unreadable master (``curvine_master_unreadable``), a
changed ClusterPolicy (``policy_changed``), a Kyverno that is absent or not serving (``kyverno_missing``) are each
their own kind (migration 0007_drift_kinds renamed the rows
recorded under the older, overloaded kinds). The endpoint kinds the batched patch fixes are the L2 overlay's
(``PATCHABLE``, from ``fleet.overlay``); those that block it are the CR's (``NOT_PATCHABLE``).

A finding names its cluster by its key (account/region/name). Its fingerprint is ``cluster|kind|object|field``:
stable across checks (the actual value is not part of it), so the history store can open it once, touch it on
every check that still sees it, and resolve it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kvfleet.fleet import constants as C
from kvfleet.fleet.curvine_values import flags_of
from kvfleet.fleet.endpoint_spec import (
    OVERLAY_KINDS,
    cr_differences,
    kyverno_policy,
    l2_violations,
    pod_is_live,
    render_iec,
)
from kvfleet.fleet.inventory import Cluster, Endpoint, Inventory

# Severity says what the drift costs: critical = data loss waiting for a restart; high = the cache (or the
# fleet's ability to change it) is broken now; medium = wrong but working; low = bookkeeping.
SEVERITY: dict[str, str] = {
    "format_flag_set": "critical",
    "curvine_data_loss": "critical",  # L2 files or capacity dropped: the loss has happened

    "patch_lost_to_reconcile": "high",
    "duplicate_l2_url": "high",
    "operator_l2_url": "high",
    "hash_seed_missing": "high",
    "hash_seed_mismatch": "high",
    "serde_mismatch": "high",  # from the shared l2_violations rule: cachegen breaks the fs connector
    "pvc_unbound": "high",
    "operator_paused": "high",
    "operator_missing": "high",  # the operator's controller Deployment is absent: nothing renders endpoints
    "addon_missing": "high",  # a managed EKS add-on is not installed
    "addon_not_active": "high",  # installed, but its status is not ACTIVE
    "addon_version_mismatch": "high",
    "addon_config_mismatch": "high",
    "kyverno_missing": "high",  # kyverno mode, and Kyverno or its admission webhook is not there: nothing injects
    "policy_missing": "high",  # kyverno mode, and kvfleet's ClusterPolicy is absent
    "policy_changed": "high",  # present, but its spec is not kvfleet's
    "curvine_release_missing": "high",  # no Curvine release: no L2 at all
    "endpoint_missing": "high",
    "cluster_unreachable": "high",
    "stale_pods": "medium",
    "cr_mismatch": "medium",
    "tiered_storage_mismatch": "medium",
    "node_recovery_mismatch": "medium",  # the inventory declares node_recovery and the cluster has another value
    "curvine_workers_mismatch": "medium",
    "curvine_master_unreadable": "medium",  # the release is there, its master API could not be read
    "endpoint_unmanaged": "low",
}
KINDS = frozenset(SEVERITY)
# Fixed by stage 4's batched safe patch: every kind of the overlay's violations (fleet.overlay; the property tests
# prove the patch fixes each of them).
PATCHABLE = OVERLAY_KINDS
# Endpoint drift that makes the batched patch pointless: the CR itself is wrong or absent, and the operator would
# re-render from it. Such endpoints are reported and left to a rollout (stages.drift).
NOT_PATCHABLE = frozenset({"cr_mismatch", "endpoint_missing"})
# Fixed by stage 4's ensure_kyverno_policy (kyverno mode).
POLICY_KINDS = frozenset({"policy_missing", "policy_changed"})
# How often patch_lost_to_reconcile may recur on a patch-mode cluster before kyverno mode is advised.
ADVICE_THRESHOLD = 3
ADVICE_WINDOW = timedelta(days=7)


@dataclass(frozen=True)
class Finding:
    kind: str
    cluster: str
    object_ref: str  # Kind/namespace/name, or Kind/name for cluster-scoped objects
    field: str
    expected: str
    actual: str
    lob: str | None = None
    endpoint: str | None = None  # namespace/name

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown drift kind {self.kind!r}; known: {', '.join(sorted(KINDS))}")

    @property
    def severity(self) -> str:
        return SEVERITY[self.kind]

    @property
    def fingerprint(self) -> str:
        key = f"{self.cluster}|{self.kind}|{self.object_ref}|{self.field}"
        return hashlib.sha256(key.encode()).hexdigest()[:24]

    def as_dict(self) -> dict[str, Any]:
        """The shape ``DriftFindings.sync`` stores (and the DAG's XCom carries)."""
        return {"fingerprint": self.fingerprint, "kind": self.kind, "severity": self.severity,
                "cluster": self.cluster, "lob": self.lob, "endpoint": self.endpoint, "object_ref": self.object_ref,
                "field": self.field, "expected": self.expected, "actual": self.actual}

    def text(self) -> str:
        return (f"[{self.severity}] {self.kind} {self.object_ref} {self.field}: expected {self.expected!r}, "
                f"found {self.actual!r}")


@dataclass
class ClusterObservation:
    """What one pass of observation saw on one cluster. Raw API objects are plain JSON dicts.

    ``addons`` maps each managed add-on to ``None`` (not installed) or ``{"status", "version", "diffs"}`` where
    ``diffs`` are stage 2's own differences (``stages.addons.addon_diff``). ``curvine_values`` is None when the
    release is absent; ``curvine_live_workers`` None when the master API could not be read (``curvine_error``).
    ``operator_zero_since`` is when the drift check first saw the controller at 0 replicas without kvfleet's
    pause annotation (a hand scale-down), kept across checks by the history store. ``operator_pauser`` is
    ``{"holder", "alive", "reason"}`` for a kvfleet pause: whether the run that paused still holds a live lease.
    ``curvine_overview`` is the master's numbers now (``capacity``, ``files_total``, ...) and
    ``curvine_previous`` the last snapshot the history recorded for the cluster (``capacity``, ``files_total``,
    ``run_key``, ``step``, ``phase``, ``at``).
    """

    now: datetime
    tiered_mode: str | None = None
    tiered_percent: int | None = None
    node_recovery: str | None = None  # DescribeCluster's NodeRecovery (None: not returned)
    addons: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    operator: dict[str, Any] | None = None
    operator_zero_since: datetime | None = None
    operator_pauser: dict[str, Any] | None = None
    policy: dict[str, Any] | None = None
    policy_checked: bool = False
    kyverno: dict[str, Any] | None = None  # kyverno mode: {"ready": bool, "detail": str} (stages.kyverno.observe)
    curvine_values: dict[str, Any] | None = None
    curvine_live_workers: int | None = None
    curvine_error: str | None = None
    curvine_overview: dict[str, Any] | None = None
    curvine_previous: dict[str, Any] | None = None
    iecs: list[dict[str, Any]] = field(default_factory=list)
    deployments: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    pvcs: list[dict[str, Any]] = field(default_factory=list)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e.get("name"): e.get("value") for e in container.get("env") or []}


def _container(pod_spec: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    containers = pod_spec.get("containers") or []
    return next((c for c in containers if c.get("name") == name), containers[0] if containers else {})


def parse_time(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


# ---- endpoints ----------------------------------------------------------------------------------------------


def pod_matches_template(pod: Mapping[str, Any], template_spec: Mapping[str, Any], container: str) -> bool:
    """Whether a pod runs what its Deployment's template says now, on the fields drift cares about: the vLLM
    container's image, env and mounts, and the pod's volumes. (A pod keeps the spec it was created with, so a
    template patch leaves stale pods until they are replaced.)"""
    have, want = _container(pod.get("spec") or {}, container), _container(template_spec, container)
    for key in ("image", "env", "volumeMounts"):
        if (have.get(key) or None) != (want.get(key) or None):
            return False
    vols = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    return all(vols.get(v.get("name")) == v for v in template_spec.get("volumes") or [])


def endpoint_findings(ep: Endpoint, inv: Inventory, iec: Mapping[str, Any] | None, dep: Mapping[str, Any] | None,
                      pods: Sequence[Mapping[str, Any]], cluster: str) -> list[Finding]:
    """``cluster``: the key of the cluster observed (how every finding names its cluster)."""
    settings = inv.settings

    def f(kind: str, obj: str, fld: str, expected: str, actual: str) -> Finding:
        return Finding(kind, cluster, obj, fld, expected, actual, lob=ep.lob, endpoint=ep.key)

    iec_ref = f"{C.IEC_KIND}/{ep.key}"
    if iec is None:
        return [f("endpoint_missing", iec_ref, "metadata", f"present, labelled {C.MANAGED_BY_LABEL}="
                  f"{C.MANAGED_BY_VALUE}", "absent")]
    out = [f(v.kind, iec_ref, v.field, v.expected, v.actual)
           for v in cr_differences(iec.get("spec") or {}, render_iec(ep, settings)["spec"])]
    dep_ref = f"Deployment/{ep.key}"
    if dep is None:
        out.append(f("endpoint_missing", dep_ref, "metadata", "rendered by the operator", "absent"))
        return out
    template = ((dep.get("spec") or {}).get("template") or {}).get("spec") or {}
    if ep.l2:
        out += [f(v.kind, dep_ref, f"spec.template.spec.{v.field}", v.expected, v.actual)
                for v in l2_violations(template, ep.name, settings)]
    live = [p for p in pods if pod_is_live(p)]
    stale = sorted(p["metadata"]["name"] for p in live if not pod_matches_template(p, template, ep.name))
    if stale:
        out.append(f("stale_pods", f"Pod/{ep.key}", "spec", f"all {len(live)} pods on the current template",
                     f"{len(stale)} stale: {', '.join(stale)}"))
    if ep.l2 and len(live) > 1:
        seeds = {p["metadata"]["name"]: _env(_container(p.get("spec") or {}, ep.name)).get(C.ENV_HASHSEED)
                 for p in live}
        if len(set(seeds.values())) > 1:
            out.append(f("hash_seed_mismatch", f"Pod/{ep.key}", f"env[{C.ENV_HASHSEED}]",
                         f"{settings.hash_seed} on every pod",
                         ", ".join(f"{n}={v}" for n, v in sorted(seeds.items()))))
    return out


def pvc_findings(cluster: str, inv: Inventory, pvcs: Iterable[Mapping[str, Any]]) -> list[Finding]:
    by_key = {_key(p): p for p in pvcs}
    out = []
    for ns in sorted({e.namespace for e in inv.endpoints_of(cluster) if e.l2}):
        pvc = by_key.get(f"{ns}/{C.CURVINE_PVC}")
        phase = ((pvc or {}).get("status") or {}).get("phase") if pvc else "absent"
        if phase != "Bound":
            out.append(Finding("pvc_unbound", cluster, f"PersistentVolumeClaim/{ns}/{C.CURVINE_PVC}", "status.phase",
                               "Bound", str(phase or "Pending")))
    return out


def unmanaged_findings(cluster: str, inv: Inventory, iecs: Iterable[Mapping[str, Any]]) -> list[Finding]:
    declared = {e.key for e in inv.endpoints_of(cluster)}
    out = []
    for iec in iecs:
        key = _key(iec)
        if key not in declared:
            lob = ((iec.get("metadata") or {}).get("labels") or {}).get(C.LOB_LABEL)
            out.append(Finding("endpoint_unmanaged", cluster, f"{C.IEC_KIND}/{key}", f"metadata.labels"
                               f"[{C.MANAGED_BY_LABEL}]", "only on endpoints in the inventory",
                               f"{C.MANAGED_BY_VALUE}, but not in {inv.source}", lob=lob, endpoint=key))
    return out


# ---- cluster --------------------------------------------------------------------------------------------------


def tiered_storage_findings(cl: Cluster, mode: str | None, percent: int | None) -> list[Finding]:
    want_on = cl.tiered_storage.mode == "Enable"
    ok = (mode == "Enable" and percent == cl.tiered_storage.memory_percent) if want_on else mode == "Disable"
    if ok:
        return []
    want = cl.tiered_storage.mode + (f",InstanceMemoryAllocationPercentage={cl.tiered_storage.memory_percent}"
                                     if cl.tiered_storage.mode == "Enable" else "")
    have = f"{mode}" + (f",InstanceMemoryAllocationPercentage={percent}" if mode == "Enable" else "")
    return [Finding("tiered_storage_mismatch", cl.key, f"HyperPodCluster/{cl.name}", "TieredStorageConfig",
                    f"Mode={want}", f"Mode={have}")]


def node_recovery_findings(cl: Cluster, live: str | None) -> list[Finding]:
    """A declared NodeRecovery that the cluster does not have; nothing when it is not declared, nor
    when DescribeCluster did not return one (``live`` None: nothing to compare)."""
    want = cl.node_recovery
    if want is None or live is None or live == want:
        return []
    return [Finding("node_recovery_mismatch", cl.key, f"HyperPodCluster/{cl.name}", "NodeRecovery", want, live)]


def addon_findings(cl: Cluster, addons: Mapping[str, Mapping[str, Any] | None]) -> list[Finding]:
    out = []
    for name in C.ADDON_ORDER:
        live = addons.get(name)
        ref = f"EksAddon/{name}"
        if live is None:
            out.append(Finding("addon_missing", cl.key, ref, "status", "ACTIVE", "not installed"))
            continue
        if live.get("status") != "ACTIVE":
            out.append(Finding("addon_not_active", cl.key, ref, "status", "ACTIVE", str(live.get("status"))))
        spec = cl.addon(name)
        for diff in live.get("diffs") or []:
            if diff.startswith("version") and spec.version:
                out.append(Finding("addon_version_mismatch", cl.key, ref, "addonVersion", spec.version,
                                   str(live.get("version"))))
            elif diff.startswith("configurationValues"):
                out.append(Finding("addon_config_mismatch", cl.key, ref, "configurationValues",
                                   "as in the inventory", "differs"))
    return out


def operator_findings(cl: Cluster, inv: Inventory, operator: Mapping[str, Any] | None, now: datetime,
                      zero_since: datetime | None, pauser: Mapping[str, Any] | None = None) -> list[Finding]:
    """An operator left paused. A kvfleet pause is reported once it lasts longer than the threshold, or at once
    when its pauser is dead (``pauser["alive"]`` False: no live lease, its run ended)."""
    name = ((operator or {}).get("metadata") or {}).get("name") or C.OPERATOR_DEPLOYMENT
    ref = f"Deployment/{C.OPERATOR_NAMESPACE}/{name}"
    if operator is None:
        return [Finding("operator_missing", cl.key, f"Deployment/{C.OPERATOR_NAMESPACE}/{C.OPERATOR_DEPLOYMENT}",
                        "metadata", "the operator's controller Deployment (add-on or Helm name)", "absent")]
    ann = (operator.get("metadata") or {}).get("annotations") or {}
    replicas = int((operator.get("spec") or {}).get("replicas") or 0)
    by = ann.get(C.PAUSED_BY_ANNOTATION)
    since = parse_time(ann.get(C.PAUSED_AT_ANNOTATION)) if by else zero_since
    if not by and replicas > 0:
        return []
    dead = bool(by) and pauser is not None and pauser.get("holder") == by and pauser.get("alive") is False
    threshold = timedelta(minutes=inv.settings.operator_pause_threshold_minutes)
    if not dead and since is not None and now - since < threshold:
        return []
    who = f"kvfleet run {by}" if by else "someone outside kvfleet (no pause annotation)"
    when = since.strftime("%Y-%m-%dT%H:%M:%SZ") if since else "an unknown time"
    state = f"; its pauser is dead: {pauser.get('reason')}" if dead and pauser else ""
    return [Finding("operator_paused", cl.key, ref, "spec.replicas",
                    f">= 1 (paused at most {inv.settings.operator_pause_threshold_minutes} min, and only by a "
                    "live run)", f"{replicas}, paused by {who} since {when}{state}")]


def curvine_loss_findings(cl: Cluster, overview: Mapping[str, Any] | None,
                          previous: Mapping[str, Any] | None) -> list[Finding]:
    """L2 files or capacity lower than at the last recorded snapshot (a kvfleet action or an earlier check)."""
    if not overview or not previous:
        return []
    ref = f"HelmRelease/{cl.curvine.namespace}/{C.CURVINE_RELEASE}"
    where = (f"{previous.get('phase')} snapshot of {previous.get('step')}"
             + (f" ({previous.get('run_key')})" if previous.get("run_key") else "")
             + (f" at {previous['at']:%Y-%m-%dT%H:%M:%SZ}" if isinstance(previous.get("at"), datetime) else ""))
    out = []
    for fld, now_key, prev_key in (("files_total", "files_total", "files_total"), ("capacity", "capacity", "capacity")):
        before, after = previous.get(prev_key), overview.get(now_key)
        if before is None or after is None or int(after) >= int(before):
            continue
        out.append(Finding("curvine_data_loss", cl.key, ref, fld, f">= {int(before)} (the {where})",
                           f"{int(after)}: {int(before) - int(after)} lost"))
    return out


def curvine_findings(cl: Cluster, values: Mapping[str, Any] | None, live_workers: int | None,
                     error: str | None) -> list[Finding]:
    ref = f"HelmRelease/{cl.curvine.namespace}/{C.CURVINE_RELEASE}"
    if values is None:
        return [Finding("curvine_release_missing", cl.key, ref, "release", "deployed", error or "absent")]
    out = [Finding("format_flag_set", cl.key, ref, f"cluster.{flag}", "false", "true")
           for flag, on in flags_of(values).items() if on]
    want = cl.curvine_workers
    master = f"CurvineMaster/{cl.curvine.namespace}/{C.CURVINE_MASTER_STS}-0"
    if live_workers is None:
        out.append(Finding("curvine_master_unreadable", cl.key, master, "live_workers", str(want),
                           f"unknown: {error or 'master API unreadable'}"))
    elif live_workers != want:
        out.append(Finding("curvine_workers_mismatch", cl.key, master, "live_workers", str(want), str(live_workers)))
    return out


def kyverno_findings(cl: Cluster, state: Mapping[str, Any] | None) -> list[Finding]:
    """Kyverno absent, or its admission controller not available or its webhook not registered: the ClusterPolicy
    (present or not) injects nothing into the operator's renders."""
    if state is None or state.get("ready"):
        return []
    return [Finding("kyverno_missing", cl.key, "Deployment/kyverno/kyverno-admission-controller", "status",
                    "available, with MutatingWebhookConfiguration kyverno-resource-mutating-webhook-cfg",
                    str(state.get("detail") or "not ready"))]


def policy_findings(cl: Cluster, inv: Inventory, policy: Mapping[str, Any] | None) -> list[Finding]:
    desired = kyverno_policy(inv.settings)
    ref = f"ClusterPolicy/{desired['metadata']['name']}"
    if policy is None:
        return [Finding("policy_missing", cl.key, ref, "metadata", "present (kyverno mode)", "absent")]
    if policy.get("spec") != desired["spec"]:
        return [Finding("policy_changed", cl.key, ref, "spec", "kvfleet's policy unchanged", "changed")]
    return []


# ---- the whole cluster --------------------------------------------------------------------------------------


def classify(inv: Inventory, cluster: str, obs: ClusterObservation) -> list[Finding]:
    """Every finding on one cluster, in a stable order (cluster first, then endpoints by key)."""
    cl = inv.cluster(cluster)
    out = tiered_storage_findings(cl, obs.tiered_mode, obs.tiered_percent)
    out += node_recovery_findings(cl, obs.node_recovery)
    out += addon_findings(cl, obs.addons)
    out += operator_findings(cl, inv, obs.operator, obs.now, obs.operator_zero_since, obs.operator_pauser)
    out += curvine_findings(cl, obs.curvine_values, obs.curvine_live_workers, obs.curvine_error)
    out += curvine_loss_findings(cl, obs.curvine_overview, obs.curvine_previous)
    if cl.l2_injection == "kyverno":
        out += kyverno_findings(cl, obs.kyverno)
    if cl.l2_injection == "kyverno" and obs.policy_checked and any(e.l2 for e in inv.endpoints_of(cluster)):
        out += policy_findings(cl, inv, obs.policy)
    out += pvc_findings(cl.key, inv, obs.pvcs)
    iecs = {_key(o): o for o in obs.iecs}
    deps = {_key(o): o for o in obs.deployments}
    pods: dict[str, list[dict[str, Any]]] = {}
    for pod in obs.pods:
        meta = pod.get("metadata") or {}
        app = (meta.get("labels") or {}).get("app")
        pods.setdefault(f"{meta.get('namespace')}/{app}", []).append(pod)
    for ep in sorted(inv.endpoints_of(cluster), key=lambda e: e.key):
        out += endpoint_findings(ep, inv, iecs.get(ep.key), deps.get(ep.key), pods.get(ep.key, []), cl.key)
    out += unmanaged_findings(cl.key, inv, obs.iecs)
    return out


def unreachable(cluster: str, error: str) -> Finding:
    """``cluster``: its key (account/region/name); the object is the HyperPod cluster, by its name."""
    return Finding("cluster_unreachable", cluster, f"Cluster/{cluster.rsplit('/', 1)[-1]}", "api", "reachable",
                   error[:300])


def kyverno_advice(cl: Cluster, patch_losses: int) -> str | None:
    """The run summary's advice when the operator keeps overwriting the patch on a patch-mode cluster."""
    if cl.l2_injection != "patch" or patch_losses < ADVICE_THRESHOLD:
        return None
    return (f"{cl.name}: patch_lost_to_reconcile {patch_losses} times in {ADVICE_WINDOW.days} days; switch it to "
            f"kyverno mode (clusters.{cl.name}.l2_injection: kyverno) so a ClusterPolicy re-injects the L2 "
            "overlay on every operator render")


def remediation_plan(findings: Iterable[Finding]) -> dict[str, list[Finding]]:
    """What the drift reconciler can fix with the rollout's own reconcilers, by action; the rest is reported."""
    plan: dict[str, list[Finding]] = {"restore_operator": [], "flip_format_flags": [], "patch_endpoints": [],
                                      "ensure_kyverno": [], "ensure_policy": []}
    for f in findings:
        if f.kind == "kyverno_missing":
            plan["ensure_kyverno"].append(f)
        elif f.kind in POLICY_KINDS:
            plan["ensure_policy"].append(f)
        elif f.kind == "operator_paused":
            plan["restore_operator"].append(f)
        elif f.kind == "format_flag_set":
            plan["flip_format_flags"].append(f)
        elif f.kind in PATCHABLE:
            plan["patch_endpoints"].append(f)
    return plan
