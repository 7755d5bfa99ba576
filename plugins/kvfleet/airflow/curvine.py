"""Task bodies of the on-demand `kvfleet_curvine_upgrade` and `kvfleet_curvine_scale_out` DAGs.

Called from ``dags/kvfleet_curvine_upgrade.py`` and ``dags/kvfleet_curvine_scale_out.py``; the stage logic lives in
``kvfleet.stages.curvine_upgrade`` and ``kvfleet.stages.curvine_scale``. Each mapped task works on one cluster and
holds that cluster's lease (holder: the run key) while it changes anything. Gate refusals are ``GateRefused``
(a PermanentError), so the task fails without spending retries.

Upgrade run: ``scope`` (run opened, Params checked; an override touching a format flag — by a key at any depth
or by a value naming one — is refused here, before any cluster is touched; overrides reach helm as a values
file) -> ``preflight`` per cluster (every gate, read-only, and the exact helm command and values
diff — this is the whole run when ``dry_run``) -> ``approval_route`` (the human gate when the ``approval`` Param
asks for it: by default for production clusters) -> ``upgrade`` per cluster -> ``summary``.
"""

from __future__ import annotations

import logging
from typing import Any

from kvfleet.airflow import halt
from kvfleet.airflow import params as kvparams
from kvfleet.airflow.boundary import task_boundary
from kvfleet.airflow.context import narrowed, pin_inventory, run_info, scoped_inventory, stage_context
from kvfleet.errors import GateRefused, PermanentError
from kvfleet.fleet import curvine_gates
from kvfleet.history.keys import StepEvent
from kvfleet.history.repos import HistoryRepos
from kvfleet.history.runs import Runs
from kvfleet.outcomes import Status
from kvfleet.stages import curvine_scale, curvine_upgrade
from kvfleet.stages.curvine_scale import ScaleRequest
from kvfleet.stages.curvine_upgrade import UpgradeRequest

log = logging.getLogger(__name__)



def _open(params: dict[str, Any], stage: str, detail: dict[str, Any]) -> tuple[list[str], Any, HistoryRepos]:
    from kvfleet.fleet.pinning import inventory_of

    info = run_info()
    pinned = pin_inventory(params["fleet"])
    history = HistoryRepos.on()  # the run pinned before its scope is judged (a refusal's notification reads it)
    history.runs.start(info.run_key, dag_id=info.dag_id, run_id=info.run_id, trigger=info.trigger,
                      triggered_by=info.triggered_by, params=params, inventory=pinned)
    inv = narrowed(inventory_of(pinned), clusters=params.get("clusters") or None)
    clusters = [c.key for c in inv.clusters]
    if not params.get("dry_run"):  # a freeze (or a stop) of its scope: the run does not start
        halt.refuse_start(history, info.step_key, run_key=info.run_key, actor=info.actor, clusters=clusters,
                          lobs={e.lob for e in inv.endpoints})
    history.runs.record_step(info.step_key, StepEvent("scope", stage, Status.PLANNED, detail={
        "clusters": clusters, "inventory": pinned.revision, **detail}), actor=info.actor)
    return clusters, info, history


def _held(ctx: Any, stage: str) -> dict[str, Any] | None:
    """A safe point before a cluster's upgrade or scale-out starts: a freeze or a stop given since the run started
    holds it (recorded frozen or stopped, nothing changed there), or None."""
    held = halt.held(ctx)
    if held is not None:
        ctx.record(f"{stage}:{ctx.cluster.name}", stage, held["outcome"], reason=held["reason"])
        log.warning("[%s] %s held: %s", ctx.cluster.name, stage, held["reason"])
        return {"outcome": held["outcome"], "reason": held["reason"]}
    return None


# ---- upgrade ---------------------------------------------------------------------------------------------------


_UPGRADE = kvparams.curvine_upgrade_params()
_SCALE = kvparams.curvine_scale_out_params()


def _param(params: dict[str, Any], key: str, declared: dict[str, Any]) -> Any:
    """A Param's value, or its default from ``airflow/params.py`` (the one place defaults live) when absent."""
    value = params.get(key)
    return declared[key].value if value is None or value == "" else value


def upgrade_request(params: dict[str, Any]) -> UpgradeRequest:
    version = str(params.get("version") or "").strip()
    if not version:
        raise PermanentError("the `version` Param is required: the Curvine chart version to upgrade to "
                             "(e.g. 0.3.3-alpha)")
    raw = params.get("overrides") or {}
    if not isinstance(raw, dict):
        raise PermanentError(f"the `overrides` Param must be an object of dotted keys to values, got {raw!r:.80} "
                             "(e.g. {\"config.log.level\": \"DEBUG\"})")
    # before anything else, on the raw form (nested, lists and all): an override touching a format flag
    curvine_gates.refuse_flag_overrides("the selected clusters", raw)
    return UpgradeRequest(
        version=version, overrides=curvine_gates.normalize_overrides(raw),
        rollback=bool(_param(params, "rollback", _UPGRADE)),
        timeout_s=float(_param(params, "timeout_minutes", _UPGRADE)) * 60,
        expired_allowance=int(params.get("expired_files_allowance") or 0),
        lock_wait_s=float(params.get("lock_wait_minutes") or 0) * 60, l2_check=params.get("l2_check") or "file")


@task_boundary
def open_upgrade(params: dict[str, Any]) -> list[str]:
    refused: GateRefused | None = None
    try:
        upgrade_request(params)  # Params checked; an override touching a format flag is refused here
    except GateRefused as exc:
        refused = exc
    clusters, info, history = _open(params, curvine_upgrade.STAGE, {"version": params.get("version"),
                                                                    "dry_run": bool(params.get("dry_run"))})
    _hold_to_policy(params, info, history)
    if refused is not None:
        history.runs.record_step(info.step_key, StepEvent("overrides", curvine_upgrade.STAGE, "refused",
                                                     detail={"reason": str(refused)}), actor=info.actor)
        raise refused
    return clusters


def _hold_to_policy(params: dict[str, Any], info: Any, history: HistoryRepos) -> None:
    """An upgrade asking for less approval than the policy of a LOB its clusters serve (``lobs[].policy.
    curvine_approval``) is refused before anything changes, recorded as a ``policy`` step; a dry run is not."""
    from kvfleet.airflow.context import scoped
    from kvfleet.fleet.inventory.policy import below, unanswerable
    from kvfleet.fleet.plan import policy_in_scope

    if params.get("dry_run"):
        return
    inv = scoped(info.run_key, clusters=params.get("clusters") or None)
    asked = str(params.get("approval") or "auto")
    lowered = [*below(policy_in_scope(inv), inv.source, curvine_approval=asked),
               *(unanswerable(policy_in_scope(inv), inv.source, info.triggered_by) if asked != "never" else [])]
    if lowered:
        history.runs.record_step(info.step_key, StepEvent("policy", curvine_upgrade.STAGE, "refused",
                                                          detail={"refused": lowered}), actor=info.actor)
        raise PermanentError("the upgrade does not meet its LOBs' policy; nothing was changed: "
                             + "; ".join(lowered))


@task_boundary
def approval_route(clusters: list[str], params: dict[str, Any]) -> str:
    """Which path leads to the upgrade: the human approval, or straight on. ``clusters``: what the scope task
    returned, the clusters' keys (a run scoped before revision 0011 returned their bare names: a production
    cluster named so still asks for approval)."""
    mode = params.get("approval") or "auto"
    if params.get("dry_run") or mode == "never":
        return kvparams.CURVINE_NO_APPROVAL_TASK
    production = [c.key for c in scoped_inventory({"clusters": params.get("clusters") or None}).clusters
                  if c.production and (c.key in clusters or c.name in clusters)]
    if mode == "always" or production:
        log.info("approval required (%s): %s", mode, ", ".join(production or clusters))
        return kvparams.CURVINE_APPROVE_TASK
    return kvparams.CURVINE_NO_APPROVAL_TASK


@task_boundary
def preflight_cluster(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    """Every gate, read-only, and the exact command and values diff (the whole run when dry_run)."""
    ctx = stage_context(cluster, params)
    ctx.dry_run = True
    try:
        out = curvine_upgrade.upgrade(ctx, upgrade_request(params), holder=run_info().run_key)
    finally:
        ctx.close()
    return {"cluster": cluster, "outcome": out.outcome, "command": out.detail.get("command"),
            "diff": out.detail.get("diff"), "revision": out.detail.get("revision"),
            "chart_version": out.detail.get("chart_version")}


@task_boundary
def upgrade_cluster(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    if params.get("dry_run"):
        return {"cluster": cluster, "outcome": "planned"}
    ctx = stage_context(cluster, params)
    try:
        if (held := _held(ctx, curvine_upgrade.STAGE)) is not None:
            return {"cluster": cluster, **held}
        out = curvine_upgrade.upgrade(ctx, upgrade_request(params), holder=run_info().run_key)
    finally:
        ctx.close()
    d = out.detail
    return {"cluster": cluster, "outcome": out.outcome, "from_revision": d.get("from_revision"),
            "to_revision": d.get("to_revision"), "flags": d.get("flags")}


@task_boundary
def summarize(results: list[dict[str, Any]] | None, params: dict[str, Any]) -> dict[str, Any]:
    info = run_info()
    rows = [r for r in results or [] if r]
    for r in rows:
        log.info("%s", "  ".join(f"{k}={v}" for k, v in r.items()))
    outcomes = {o: sum(1 for r in rows if r["outcome"] == o) for o in sorted({r["outcome"] for r in rows})}
    Runs().end(info.run_key, "success", {"clusters": rows, "outcomes": outcomes,
                                                "dry_run": bool(params.get("dry_run"))})
    return outcomes


# ---- scale-out ---------------------------------------------------------------------------------------------------


def scale_request(params: dict[str, Any]) -> ScaleRequest:
    target = params.get("target_workers")
    return ScaleRequest(target=int(target) if target not in (None, "") else None,
                        all_eligible=bool(params.get("all_eligible")),
                        allow_scale_in=bool(params.get("allow_scale_in")),
                        threshold=float(_param(params, "threshold_percent", _SCALE)) / 100,
                        timeout_s=float(_param(params, "timeout_minutes", _SCALE)) * 60,
                        lock_wait_s=float(params.get("lock_wait_minutes") or 0) * 60)


@task_boundary
def open_scale(params: dict[str, Any]) -> list[str]:
    req = scale_request(params)
    clusters, _info, _history = _open(params, curvine_scale.STAGE, {
        "mode": "on_demand" if req.on_demand else "detect", "dry_run": bool(params.get("dry_run"))})
    return clusters


@task_boundary
def scale_cluster(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    ctx = stage_context(cluster, params)
    try:
        if (held := _held(ctx, curvine_scale.STAGE)) is not None:
            return {"cluster": cluster, **held}
        out = curvine_scale.scale(ctx, scale_request(params), holder=run_info().run_key)
    finally:
        ctx.close()
    d = out.detail
    decision = d.get("decision") or {}
    return {"cluster": cluster, "outcome": out.outcome, "mode": decision.get("mode"),
            "from_workers": d.get("from_workers", decision.get("current")),
            "to_workers": d.get("to_workers", decision.get("target")), "reasons": decision.get("reasons") or [],
            "capacity_after": d.get("capacity_after")}
