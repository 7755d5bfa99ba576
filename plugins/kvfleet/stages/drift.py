"""The drift reconciler: observe one cluster cheaply, classify with ``fleet.drift``, record in the history store,
and, when asked, remediate with the rollout's own reconcilers under the same cluster lease.

Called by the ``kvfleet_drift_check`` DAG (``kvfleet.airflow.drift``, one mapped task per cluster), by the
benchmark (``bench/drift_check.py``) and by the tests.

Observation cost is constant per cluster, whatever the number of endpoints: four cluster-wide LISTs
with the ``app.kubernetes.io/managed-by=kvfleet`` label selector (InferenceEndpointConfigs, Deployments, Pods,
PVCs — the operator copies the CR's labels onto the Deployment and its pod template, and stage 3 labels the
PVCs), one LIST of the operator's namespace (its controller, under the add-on's or the Helm chart's name), in
kyverno mode one GET of the ClusterPolicy and Kyverno's own state (``stages.kyverno.observe``: its CRD, one LIST of
its admission controller by label, its webhook configuration), ``helm get values``
of the Curvine release, one read of the Curvine master API through the pod proxy; on the AWS side
DescribeCluster (HyperPod and EKS, for the kube client), ListAddons and DescribeAddon per installed managed
add-on. Never one GET per endpoint. Lists are read as raw JSON (``_preload_content=False``): turning thousands of
pods into client models and back is most of the cost otherwise.

Remediation (off by default; the run's ``remediate`` Param, or per LOB ``remediate_drift``) never rolls back:
- the L2 overlay's kinds (``fleet.drift.PATCHABLE``: ``patch_lost_to_reconcile``, ``operator_l2_url``,
  ``duplicate_l2_url``, ``hash_seed_missing``, ``serde_mismatch``): stage 4's ``reconcile_wave`` on the affected
  endpoints, one batched safe patch (one operator pause) for all of them; an endpoint whose CR is wrong or
  absent too (``fleet.drift.NOT_PATCHABLE``) is refused and left to a rollout;
- ``operator_paused``: ``operator_pause.restore`` of a pause kvfleet made; a controller scaled to 0 outside
  kvfleet is reported, never undone (the same rule as ``operator_pause.pause``). A pause whose pauser is
  **dead** (the run named in the pause annotation holds no live lease on the cluster: its task stopped
  heartbeating, or Airflow says its run is no longer running — ``kvfleet.history.leases``) is reported at once,
  without the pause threshold, and restored under a lease taken over from the dead holder; the remediation
  records whom it restored the operator from and why that holder was judged dead;
- ``format_flag_set``: stage 3's ``reconcile``, which flips the flags false with ``--reuse-values``;
- ``kyverno_missing``: stage 2's Kyverno step (``stages.kyverno.reconcile``: install when allowed, else refused
  with the exact command), before the policy;
- ``policy_missing`` / ``policy_changed``: stage 4's ``ensure_kyverno_policy``.
Every remediation is written on its findings' history rows and as a step event (audit log).

Curvine data-loss watch: every check reads the master's file count and capacity and compares them with the
previous snapshot recorded in the history (``capacity_snapshots``, by a kvfleet action or by an earlier check).
A drop is a ``curvine_data_loss`` finding (critical), logged at ERROR, and the new snapshot is recorded.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvfleet.clients.curvine import CurvineMaster
from kvfleet.clients.helm import ReleaseNotFound
from kvfleet.clients.kube import api_error
from kvfleet.errors import GateRefused, KvfleetError, PermanentError
from kvfleet.fleet import constants as C
from kvfleet.fleet import drift as rules
from kvfleet.fleet.endpoint_spec import kyverno_policy
from kvfleet.fleet.inventory import Endpoint
from kvfleet.history.clusters import values_of
from kvfleet.history.leases import SUFFIX, Leases
from kvfleet.stages import curvine, endpoints, kyverno, operator_pause
from kvfleet.stages.addons import addon_diff
from kvfleet.stages.base import StageContext
from kvfleet.stages.locks import ClusterLock

log = logging.getLogger(__name__)
STAGE = "drift"
MANAGED = f"{C.MANAGED_BY_LABEL}={C.MANAGED_BY_VALUE}"
REQUEST_TIMEOUT = 20
OPERATOR_ZERO_WATCH = "operator_zero_replicas"


@dataclass
class DriftResult:
    cluster: str
    findings: list[rules.Finding]
    reachable: bool = True
    sync: dict[str, int] = field(default_factory=dict)
    remediations: list[dict[str, Any]] = field(default_factory=list)
    advice: str | None = None
    patch_losses_7d: int = 0
    observe_s: float = 0.0
    run_key: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "reachable": self.reachable, "findings": [f.as_dict() for f in self.findings],
                "sync": self.sync, "remediations": self.remediations, "advice": self.advice,
                "patch_losses_7d": self.patch_losses_7d, "observe_s": round(self.observe_s, 3)}


# ---- observation ----------------------------------------------------------------------------------------------


def _raw_or_none(fn: Callable[..., Any], *args: Any, what: str) -> Any:
    try:
        resp = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise api_error(exc, what) from exc
    try:
        return json.loads(resp.data or b"null")
    finally:
        resp.release_conn()


def _items(fn: Callable[..., Any], *args: Any, what: str) -> list[dict[str, Any]]:
    """One LIST across namespaces with the managed-by selector. A type that is not served (the operator's CRD
    before stage 2) has no objects: an empty list, not an error."""
    try:
        resp = fn(*args, label_selector=MANAGED, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise api_error(exc, what) from exc
    try:
        return list((json.loads(resp.data or b"null") or {}).get("items") or [])
    finally:
        resp.release_conn()


def observe(ctx: StageContext, now: datetime) -> rules.ClusterObservation:
    cl = ctx.cluster
    obs = rules.ClusterObservation(now=now)
    hp = ctx.hyperpod.require_cluster(cl.name)
    obs.tiered_mode, obs.tiered_percent = hp.tiered_storage.mode, hp.tiered_storage.memory_percent
    obs.node_recovery = hp.node_recovery
    eks = hp.eks_cluster_name
    installed = set(ctx.hyperpod.list_addons(eks))
    for name in C.ADDON_ORDER:
        live = ctx.hyperpod.describe_addon(eks, name) if name in installed else None
        if live is None:
            obs.addons[name] = None
            continue
        spec = cl.addon(name)
        diffs = addon_diff(live, spec.version, dict(spec.configuration) if spec.configuration is not None else None)
        obs.addons[name] = {"status": live.get("status"), "version": live.get("addonVersion"), "diffs": diffs}
    kube = ctx.kube
    obs.iecs = _items(kube.custom.list_cluster_custom_object, C.IEC_GROUP, C.IEC_VERSION, C.IEC_PLURAL,
                      what="list InferenceEndpointConfigs")
    obs.deployments = _items(kube.apps.list_deployment_for_all_namespaces, what="list Deployments")
    obs.pods = _items(kube.core.list_pod_for_all_namespaces, what="list Pods")
    obs.pvcs = _items(kube.core.list_persistent_volume_claim_for_all_namespaces, what="list PVCs")
    obs.operator = _observe_operator(kube)
    if cl.l2_injection == "kyverno":
        name = kyverno_policy(ctx.inventory.settings)["metadata"]["name"]
        obs.policy = _raw_or_none(kube.custom.get_cluster_custom_object, "kyverno.io", "v1", "clusterpolicies", name,
                                  what=f"read ClusterPolicy {name}")
        obs.policy_checked = True
        state = kyverno.observe(ctx)
        obs.kyverno = {"ready": kyverno.is_ready(state), "detail": kyverno.describe(state)}
    try:
        obs.curvine_values = ctx.helm.values(C.CURVINE_RELEASE, cl.curvine.namespace)
    except ReleaseNotFound:
        obs.curvine_error = "release not found"
    if obs.curvine_values is not None:
        try:
            overview = CurvineMaster(kube, cl.curvine.namespace).overview()
            obs.curvine_live_workers = overview.live_workers
            obs.curvine_overview = _overview_dict(overview)
        except (KvfleetError, ApiException, OSError, ValueError) as exc:
            obs.curvine_error = f"master API: {str(exc)[:200]}"
    obs.operator_zero_since = _operator_zero_since(ctx, obs.operator)
    obs.operator_pauser = _pauser_liveness(ctx, obs.operator, now)
    if obs.curvine_overview is not None:
        obs.curvine_previous = _previous_snapshot(ctx)
    return obs


def _observe_operator(kube: Any) -> dict[str, Any] | None:
    """The operator's controller as JSON, under either name (add-on or Helm) or the chart's labels: one LIST."""
    found = operator_pause.find_controller(kube)
    return dict(kube.api_client.sanitize_for_serialization(found[1])) if found else None


def _pauser_liveness(ctx: StageContext, operator: dict[str, Any] | None, now: datetime) -> dict[str, Any] | None:
    """Is the run named in the pause annotation alive (a live lease on this cluster)? None when not paused by
    kvfleet or when there is no history store to ask."""
    ann = ((operator or {}).get("metadata") or {}).get("annotations") or {}
    by = ann.get(C.PAUSED_BY_ANNOTATION)
    if not by or ctx.history is None:
        return None
    verdict = Leases(ctx.history.engine).holder_liveness(ctx.cluster.key, by, now=now,
                                                         holder_alive=ctx.holder_alive)
    return {"holder": by, "alive": verdict.alive, "reason": verdict.reason}


def _overview_dict(overview: Any) -> dict[str, Any]:
    raw = overview.as_dict() if hasattr(overview, "as_dict") else dict(getattr(overview, "__dict__", {}))
    return {k: raw.get(k) for k in ("capacity", "fs_used", "live_workers", "lost_workers", "files_total",
                                    "dir_total")}


def _previous_snapshot(ctx: StageContext) -> dict[str, Any] | None:
    """The latest Curvine snapshot recorded for this cluster (by a kvfleet action or an earlier check)."""
    if ctx.history is None:
        return None
    from sqlalchemy import text

    with ctx.history.engine.connect() as conn:
        row = conn.execute(text(
            "SELECT run_key, step, phase, at, capacity_bytes AS capacity, files_total FROM capacity_snapshots "
            "WHERE cluster = ANY(:c) AND files_total IS NOT NULL ORDER BY at DESC, id DESC LIMIT 1"),
            {"c": values_of(ctx.cluster.ref)}).mappings().first()
    return dict(row) if row else None


def _operator_zero_since(ctx: StageContext, operator: dict[str, Any] | None) -> datetime | None:
    """Date a hand scale-down (no kvfleet annotation says when) by the first check that saw it."""
    ann = ((operator or {}).get("metadata") or {}).get("annotations") or {}
    zero = operator is not None and not int((operator.get("spec") or {}).get("replicas") or 0) \
        and not ann.get(C.PAUSED_BY_ANNOTATION)
    if ctx.history is None:
        return None
    return ctx.history.drift.watch(ctx.cluster.key, OPERATOR_ZERO_WATCH, zero,
                             ctx.step_key.run_key if ctx.step_key else None)


# ---- the check ------------------------------------------------------------------------------------------------


def check(ctx: StageContext, *, remediate: bool = False, now: datetime | None = None) -> DriftResult:
    """Observe, classify, record; remediate what is asked. An unreachable cluster is a finding, not a failure."""
    cl = ctx.cluster
    now = now or datetime.now(UTC)
    run_key = ctx.step_key.run_key if ctx.step_key else f"adhoc/{now.isoformat()}"
    started = time.monotonic()
    try:
        obs = observe(ctx, now)
    except Exception as exc:  # any failure to observe: record it on this cluster, never fail the others
        log.warning("[%s] drift check could not observe the cluster: %s", cl.name, exc, exc_info=True)
        result = DriftResult(cl.key, [rules.unreachable(cl.key, f"{type(exc).__name__}: {exc}")], reachable=False,
                             observe_s=time.monotonic() - started, run_key=run_key)
        if ctx.history is not None:
            # Only this kind is in scope: what could not be observed stays as it was.
            result.sync = ctx.history.drift.sync(cl.key, [f.as_dict() for f in result.findings], run_key,
                                                    scope_kinds=["cluster_unreachable"])
        # Not a failure of the run: the finding says it (and one dead API server must not turn the check red).
        ctx.record(f"drift_check:{cl.name}", STAGE, "unreachable", reachable=False, error=str(exc)[:500])
        return result
    findings = rules.classify(ctx.inventory, cl.key, obs)
    result = DriftResult(cl.key, findings, observe_s=time.monotonic() - started, run_key=run_key)
    ctx.say(f"drift: {len(findings)} finding(s) in {result.observe_s:.2f}s"
            + "".join(f"\n  {f.text()}" for f in findings))
    for f in findings:
        if f.kind == "curvine_data_loss":
            log.error("[%s] CURVINE DATA LOSS: %s", cl.name, f.text())
            ctx.say(f"CURVINE DATA LOSS: {f.text()}")
    _record_snapshot(ctx, obs, now)
    if ctx.history is not None:
        result.sync = ctx.history.drift.sync(cl.key, [f.as_dict() for f in findings], run_key)
    moved = bool(result.sync.get("opened") or result.sync.get("resolved"))
    ctx.record(f"drift_check:{cl.name}", STAGE, "reported" if moved else "unchanged", findings=len(findings),
               kinds=sorted({f.kind for f in findings}), sync=result.sync)
    chosen = selected_for_remediation(ctx, findings, remediate)
    if chosen:
        result.remediations = remediate_findings(ctx, chosen, findings, holder=run_key, now=now)
        _resolve_remediated(ctx, result, now + timedelta(seconds=time.monotonic() - started))
    _advise(ctx, result, now)
    return result


def _resolve_remediated(ctx: StageContext, result: DriftResult, now: datetime) -> None:
    """Observe again after remediating: what a remediation changed and is no longer seen is resolved now
    (``remediated``), instead of staying open until the next check."""
    fixed = {fp for r in result.remediations if r["outcome"] == "changed" for fp in r["findings"]}
    if not fixed or ctx.history is None or ctx.dry_run:
        return
    try:
        obs = observe(ctx, now)
    except Exception as exc:  # the findings stay open; the next check resolves them
        log.warning("[%s] drift check could not observe again after remediating: %s", ctx.cluster.name, exc)
        result.sync["remediated_resolved"] = 0
        return
    still = {f.fingerprint for f in rules.classify(ctx.inventory, ctx.cluster.key, obs)}
    gone = sorted(fixed - still)
    result.sync["remediated_resolved"] = ctx.history.drift.resolve_remediated(ctx.cluster.key, gone, result.run_key)
    result.sync["remediated_still_seen"] = len(fixed & still)
    ctx.say(f"drift: after remediation, {len(gone)} finding(s) no longer seen (resolved), "
            f"{len(fixed & still)} still seen")


def _record_snapshot(ctx: StageContext, obs: rules.ClusterObservation, now: datetime) -> None:
    """This check's Curvine numbers, the baseline of the next check's data-loss watch."""
    if ctx.history is None or obs.curvine_overview is None:
        return
    run_key = ctx.step_key.run_key if ctx.step_key else None
    if run_key is not None and ctx.history.runs.get(run_key) is None:
        run_key = None  # an ad-hoc check (no run row to refer to)
    ctx.history.curvine.record_capacity(run_key=run_key, step=f"drift_check:{now.isoformat()}",
                                        cluster=ctx.cluster.key, phase="drift", overview=obs.curvine_overview)


def selected_for_remediation(ctx: StageContext, findings: Iterable[rules.Finding],
                             run_level: bool) -> list[rules.Finding]:
    """The run's Param covers everything; otherwise a LOB's ``remediate_drift`` covers its endpoints, and
    cluster-level drift only when every LOB with endpoints on the cluster has opted in."""
    findings = list(findings)
    if run_level:
        return findings
    opted = {lob.name for lob in ctx.inventory.lobs if lob.remediate_drift}
    lobs_here = {e.lob for e in ctx.inventory.endpoints_of(ctx.cluster.key)}
    cluster_ok = bool(lobs_here) and lobs_here <= opted
    return [f for f in findings if (f.lob in opted if f.endpoint is not None else cluster_ok)]


def _advise(ctx: StageContext, result: DriftResult, now: datetime) -> None:
    if ctx.history is None:
        return
    rows = ctx.history.queries.rows("drift_recurrence", cutoff=now - rules.ADVICE_WINDOW,
                                    kind="patch_lost_to_reconcile")
    result.patch_losses_7d = sum(int(r["occurrences"]) for r in rows if r["cluster"] in values_of(ctx.cluster.ref))
    result.advice = rules.kyverno_advice(ctx.cluster, result.patch_losses_7d)
    if result.advice:
        ctx.say(f"advice: {result.advice}")
        ctx.record(f"drift_advice:{ctx.cluster.name}", STAGE, "advised", recommend="kyverno",
                   patch_losses_7d=result.patch_losses_7d, advice=result.advice)


# ---- remediation --------------------------------------------------------------------------------------------


def remediate_findings(ctx: StageContext, chosen: list[rules.Finding], all_findings: list[rules.Finding], *,
                       holder: str, lock_wait_s: float = 60, now: datetime | None = None) -> list[dict[str, Any]]:
    """Fix what the rollout's reconcilers can fix, under the cluster lease; record each action on its findings.
    ``now`` is the check's clock: a lease whose holder died is judged (and taken over) at that time."""
    plan = rules.remediation_plan(chosen)
    policy = plan["ensure_policy"]
    engine = plan["ensure_kyverno"]
    if not any(plan.values()):
        return []
    base_now, base_mono = now or datetime.now(UTC), time.monotonic()
    lease: Any = ClusterLock(ctx.history, ctx.cluster.key, holder, "drift remediation", wait_s=lock_wait_s,
                             poll_s=1, progress=ctx.progress, holder_alive=ctx.holder_alive,
                             clock=lambda: base_now + timedelta(seconds=time.monotonic() - base_mono)) \
        if ctx.history is not None else nullcontext()
    done: list[dict[str, Any]] = []
    pauser: dict[str, Any] | None = None
    if plan["restore_operator"]:  # judged before this check takes the lease over from a dead pauser
        with_state = operator_pause.pause_state(ctx)
        pauser = _pauser_liveness(ctx, {"metadata": {"annotations": {
            C.PAUSED_BY_ANNOTATION: with_state["paused_by"]}}}, base_now)
    try:
        lease.__enter__()
    except GateRefused as exc:  # a rollout or an upgrade holds the cluster: report now, fix on a later check
        fixable = [f for group in plan.values() for f in group]
        return [_record(ctx, "all", fixable, "deferred", {"reason": str(exc)[:500]})]
    try:
        if plan["restore_operator"]:
            taken_from = getattr(lease, "taken_over_from", None)
            done.append(_act(ctx, "restore_operator", plan["restore_operator"],
                             lambda: _restore_operator(ctx, taken_from, pauser)))
        if plan["flip_format_flags"]:
            done.append(_act(ctx, "flip_format_flags", plan["flip_format_flags"],
                             lambda: {"curvine": curvine.reconcile(ctx).detail.get("hazard_fixed")}))
        engine_ok = True
        if engine:
            done.append(_act(ctx, "ensure_kyverno", engine,
                             lambda: {"kyverno": kyverno.reconcile(ctx).as_dict()["detail"]}))
            engine_ok = done[-1]["outcome"] == "changed"
        if policy and not engine_ok:  # no Kyverno to admit it: the policy waits for the one above
            done.append(_record(ctx, "ensure_kyverno_policy", policy, "refused", {
                "reason": "Kyverno is not there (see the ensure_kyverno remediation); the ClusterPolicy follows it"}))
        elif policy:
            done.append(_act(ctx, "ensure_kyverno_policy", policy,
                             lambda: {"policy": endpoints.ensure_kyverno_policy(ctx)}))
        if plan["patch_endpoints"]:
            done += _patch_endpoints(ctx, plan["patch_endpoints"], all_findings, holder)
    finally:
        lease.__exit__(None, None, None)
    return done


def _restore_operator(ctx: StageContext, lease_taken_from: str | None,
                      pauser: dict[str, Any] | None) -> dict[str, Any]:
    """Restore a kvfleet pause (this check holds the cluster's lease, so the pauser is not running a wave now:
    it finished without restoring, or it died). Records whom it restored it from and why."""
    state = operator_pause.pause_state(ctx)
    if not state["paused_by"]:
        raise PermanentError(
            f"the inference operator on {ctx.cluster.name} was scaled to {state['replicas']} outside kvfleet (no "
            f"{C.PAUSED_BY_ANNOTATION} annotation); kvfleet never undoes another holder's pause. Ask who paused "
            f"it, then: {operator_pause.scale_hint(ctx)}")
    result = operator_pause.restore(ctx)
    out = {**result, "restored_from": state["paused_by"], "paused_at": state["paused_at"],
           "lease_taken_over_from": lease_taken_from,
           "pauser": (pauser or {}).get("reason") if pauser and pauser.get("holder") == state["paused_by"]
           and not pauser.get("alive") else "the pause outlasted its threshold"}
    log.warning("[%s] operator restored by the drift check from %s (paused at %s): %s", ctx.cluster.name,
                state["paused_by"], state["paused_at"], out["pauser"])
    return out


def _patch_endpoints(ctx: StageContext, found: list[rules.Finding], all_findings: list[rules.Finding],
                     holder: str) -> list[dict[str, Any]]:
    by_ep: dict[str, list[rules.Finding]] = {}
    for f in found:
        by_ep.setdefault(str(f.endpoint), []).append(f)
    blocked = {f.endpoint for f in all_findings if f.kind in rules.NOT_PATCHABLE}
    declared: dict[str, Endpoint] = {e.key: e for e in ctx.inventory.endpoints_of(ctx.cluster.key)}
    out = []
    for key in sorted(k for k in by_ep if k in blocked):
        out.append(_record(ctx, "patch_endpoints", by_ep[key], "refused", {
            "reason": "the CR is wrong or absent too; the batched patch cannot fix it: run kvfleet_rollout "
                      f"for {ctx.cluster.name}:{key}"}))
    eps = [declared[k] for k in sorted(by_ep) if k not in blocked and k in declared]
    if eps:
        wave = [f for ep in eps for f in by_ep[ep.key]]
        out.append(_act(ctx, "patch_endpoints", wave, lambda: _patch_wave(ctx, eps, holder)))
    return out


def _patch_wave(ctx: StageContext, eps: list[Endpoint], holder: str) -> dict[str, Any]:
    """Stage 4's wave on the drifted endpoints. An endpoint the wave refused or could not converge makes the
    remediation refused (recorded with the wave's reasons), never "changed"."""
    outcomes = [o.as_dict() for o in endpoints.reconcile_wave(ctx, eps, holder=f"{holder}{SUFFIX}drift")]
    bad = [o for o in outcomes if o["outcome"] in ("refused", "failed")]
    if bad:
        raise PermanentError("stage 4 did not converge: " + "; ".join(
            f"{o['endpoint']} {o['outcome']}: {o['detail'].get('reason') or o['detail'].get('violations')}"
            for o in bad))
    return {"endpoints": outcomes}


def _act(ctx: StageContext, action: str, found: list[rules.Finding],
         fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    ctx.say(f"drift remediation: {action} for {len(found)} finding(s)")
    try:
        detail = fn()
    except PermanentError as exc:
        return _record(ctx, action, found, "refused", {"reason": str(exc)[:500]})
    except Exception as exc:
        _record(ctx, action, found, "failed", {"error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        raise
    return _record(ctx, action, found, "changed", detail)


def _record(ctx: StageContext, action: str, found: list[rules.Finding], outcome: str,
            detail: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"action": action, "outcome": outcome, "findings": [f.fingerprint for f in found],
             "kinds": sorted({f.kind for f in found}), "objects": sorted({f.object_ref for f in found}),
             "run_key": ctx.step_key.run_key if ctx.step_key else None,
             "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "detail": detail}
    if ctx.history is not None:
        for f in found:
            ctx.history.drift.record_remediation(f.fingerprint, {k: v for k, v in entry.items() if k != "findings"})
    ctx.record(f"drift_remediate:{action}:{outcome}", STAGE, outcome, action=action, findings=entry["findings"],
               kinds=entry["kinds"], objects=entry["objects"], detail=detail)
    if outcome != "changed":
        ctx.say(f"drift remediation {action}: {outcome}: {detail}")
    return entry
