"""Task bodies of the `kvfleet_rollout` DAG. The DAG file only wires these together.

Task structure (one run): ``plan`` -> a mapped task group per cluster -> ``finish``. Inside a cluster's group:
``cluster_stages`` (takes the cluster lease and a parallelism slot, then stages 1–3) -> ``wave_0`` (the canary)
-> ``gate_0`` -> ``wave_1`` -> ``gate_1`` -> ... -> ``wave_{SLOTS-1}`` -> ``release`` (teardown: restore the
operator if this run paused it, release lease and slot).

What each exit path does with the lease and the slot (issue 14):
- a task that ends normally with more of its run to come **parks** the lease (``ClusterLock.park``: no
  heartbeat, the gate's ttl; free at once when Airflow says the run is no longer running);
- a task that fails (any exception, a permanent error, SIGTERM) **releases** the lease, and ``cluster_stages``
  its slot too; a retry takes them again;
- ``release`` is a teardown with no setup task, so it runs once everything upstream is done whatever their
  states (success, failed, upstream_failed, skipped by a gate, aborted) and releases both;
- a task killed with SIGKILL stops heartbeating: its lease is free 60 s later (``ACTIVE_TTL_S``), and the drift
  check restores an operator that the dead task left paused.

Why wave *slots*: Airflow cannot loop, and a human gate must be a task of its own. So a cluster's plan waves
are laid onto ``SLOTS`` slots: slot k runs plan wave k, and the last slot runs every remaining wave in order
(its inner gates stop on a failure and pause — stop, recorded as ``paused_for_review`` — on an inconclusive
verification; a later run resumes). Mapping is per cluster only, so 1,000 endpoints on 10 clusters is 10
instances per task, far below ``max_map_length`` (1024).

Each task parses the run's Params once into a frozen ``RolloutRequest`` (``kvfleet.airflow.request``: defaults
from ``kvfleet.airflow.params``) and reads only that; each task body sits behind the task boundary
(``kvfleet.airflow.boundary``), which classifies whatever it raises.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kvfleet.airflow.boundary import task_boundary
from kvfleet.airflow.context import airflow_run_alive as airflow_run_alive  # its former home
from kvfleet.airflow.context import cluster_context, run_info, scoped
from kvfleet.airflow.params import WAVE_SLOTS
from kvfleet.airflow.request import RolloutRequest
from kvfleet.airflow.request import refuse_unknown_conf as refuse_unknown_conf  # its former home
from kvfleet.clients.kube import sleep_or_stop
from kvfleet.errors import LeaseWaitTimeout, PermanentError
from kvfleet.fleet import gates
from kvfleet.fleet.inventory import Endpoint
from kvfleet.fleet.plan import make_plan, render_plan_text
from kvfleet.history.leases import ACTIVE_TTL_S, PARKED_TTL_S, SUFFIX, Leases
from kvfleet.history.repo import History, StepEvent
from kvfleet.stages import addons, curvine, endpoints, operator_pause, tiered_storage, verify
from kvfleet.stages.base import StageContext, poll_seconds
from kvfleet.stages.locks import ClusterLock

log = logging.getLogger(__name__)
SLOTS = WAVE_SLOTS  # the DAG file lays out the same number of slots (one place: airflow/params.py)
LEASE_TTL_S = ACTIVE_TTL_S  # while a task runs (heartbeat every 20 s)
PARKED_LEASE_TTL_S = PARKED_TTL_S  # between tasks of the run: the gate's 2 h response timeout and a margin


def rollout_context(cluster: str, req: RolloutRequest) -> StageContext:
    """A cluster's stage context for this run's request (scope, dry run, AWS connection)."""
    return cluster_context(cluster, req.fleet, lobs=req.lobs, clusters=req.clusters, endpoints=req.endpoints,
                           dry_run=req.dry_run, aws_conn_id=req.aws_conn_id)


def _lease(ctx: StageContext, req: RolloutRequest) -> ClusterLock:
    info = run_info()
    return ClusterLock(ctx.history or History(), ctx.cluster.name, info.run_key, "rollout", ttl_s=LEASE_TTL_S,
                       wait_s=req.lock_wait_s, poll_s=min(poll_seconds() * 5, 10),
                       progress=ctx.say, holder_alive=ctx.holder_alive, park_ttl_s=PARKED_LEASE_TTL_S)


def _slot_prefix(run_key: str) -> str:
    return f"slot:{run_key}:"


def _slot_holder(run_key: str, cluster: str) -> str:
    return f"{run_key}{SUFFIX}{cluster}"


def _slot(history: History, run_key: str, cluster: str, limit: int, wait_s: float, say: Any) -> str:
    """One of ``limit`` parallelism slots of this run (``max_parallel_clusters``), as leases in the same table,
    parked for the whole run (released by the teardown, or at once when ``cluster_stages`` fails)."""
    leases = Leases(history.engine)
    holder = _slot_holder(run_key, cluster)
    started = time.monotonic()
    while True:
        for i in range(limit):
            name = f"{_slot_prefix(run_key)}{i}"
            row = leases.try_take(name, holder, "rollout parallelism", PARKED_LEASE_TTL_S)
            if row.get("holder") == holder:
                leases.park(name, holder, PARKED_LEASE_TTL_S)
                return name
        if time.monotonic() - started > wait_s:
            raise LeaseWaitTimeout(f"no parallelism slot free for {cluster} after {wait_s:.0f}s "
                              f"(max_parallel_clusters={limit})")
        say(f"waiting for one of {limit} parallel cluster slots")
        sleep_or_stop(min(poll_seconds() * 5, 10), f"[{cluster}] parallelism slot wait")


def _release_all(history: History, run_key: str, cluster: str) -> dict[str, int]:
    leases = Leases(history.engine)
    return {"lease": int(leases.release(cluster, run_key)),
            "slots": leases.release_all(_slot_prefix(run_key), _slot_holder(run_key, cluster))}


@task_boundary
def plan_rollout(params: dict[str, Any]) -> dict[str, Any]:
    """Validate the inventory and the scope, compute the plan, and open the run in the history store."""
    info = run_info()
    req = RolloutRequest.from_params(params)
    inv = scoped(req.fleet, lobs=req.lobs, clusters=req.clusters, endpoints=req.endpoints)
    verify.check_prompt_length(req.prompt_tokens, inv.settings.chunk_size)
    plan = make_plan(inv, wave_size=req.wave_size, canary=req.canary)
    log.info("%s", render_plan_text(plan))
    history = History()
    history.start_run(info.run_key, dag_id=info.dag_id, run_id=info.run_id, trigger=info.trigger,
                      triggered_by=info.triggered_by, params=params, plan=plan.as_dict())
    history.record_step(info.step_key, StepEvent(step="plan", stage="plan", outcome="planned",
                                                 detail={"clusters": len(plan.clusters),
                                                         "endpoints": len(inv.endpoints),
                                                         "dry_run": req.dry_run}),
                        actor=info.actor)
    return plan.as_dict()


def cluster_names(plan: dict[str, Any]) -> list[str]:
    return [c["cluster"] for c in plan["clusters"]]


@task_boundary
def run_cluster_stages(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    req = RolloutRequest.from_params(params)
    ctx = rollout_context(cluster, req)
    info = run_info()
    lease: ClusterLock | None = None
    history = ctx.history or History()
    try:
        if not ctx.dry_run:
            _slot(history, info.run_key, cluster, req.max_parallel_clusters, req.lock_wait_s, ctx.say)
            lease = _lease(ctx, req).acquire()
        outcomes = [stage.reconcile(ctx) for stage in (tiered_storage, addons, curvine)]
        drift_report = _remediate_drift(ctx) if req.remediate_drift and not ctx.dry_run else None
    except BaseException:
        # Every failure path frees what this task took: a retry takes it again; the teardown has nothing left.
        if lease is not None:
            lease.release()
        released = _release_all(history, info.run_key, cluster) if not ctx.dry_run else {}
        ctx.say(f"cluster stages failed: lease and slot released ({released})")
        raise
    else:
        if lease is not None:
            lease.park()
    finally:
        ctx.close()
    for o in outcomes:
        log.info("[%s] %s: %s", cluster, o.stage, o.outcome)
    return {"cluster": cluster, "stages": [o.as_dict() for o in outcomes], "drift": drift_report}


def _remediate_drift(ctx: StageContext) -> dict[str, Any]:
    """``remediate_drift``: the drift check with remediation, under this run's lease, before the waves move
    (a format flag left true, an operator left paused, patches lost to a re-render)."""
    from kvfleet.stages import drift

    result = drift.check(ctx, remediate=True)
    return {"findings": len(result.findings), "remediations": len(result.remediations or [])}


def _slot_waves(plan: dict[str, Any], cluster: str, slot: int) -> list[dict[str, Any]]:
    waves: list[dict[str, Any]] = next(c["waves"] for c in plan["clusters"] if c["cluster"] == cluster)
    return waves[slot:] if slot == SLOTS - 1 else waves[slot:slot + 1]


def _mark(ctx: StageContext, eps: list[Endpoint], outcome: str, reason: str) -> None:
    for ep in eps:
        ctx.record(f"endpoint:{ep.key}", "endpoint", outcome, endpoint=ep.key, lob=ep.lob, reason=reason)
        ctx.say(f"{outcome}: {ep.key} ({reason})")


def _verify_and_record(ctx: StageContext, ep: Endpoint, req: RolloutRequest, step: str) -> dict[str, Any]:
    result = verify.verify_endpoint(ctx, ep, req.prompt_tokens, tolerance=req.speedup_tolerance).as_dict()
    if ctx.history is not None and ctx.step_key is not None:
        ctx.history.record_verification(ctx.step_key, step, result)
    ctx.say(f"stage 5: {ep.key}: {result['verdict']} hit {result['hit_ratio']} cold {result['ttft_cold_ms']} ms "
            f"warm {result['ttft_warm_ms']} ms speedup {result['speedup']}x (expected {result['expected_speedup']}x)"
            + (f" — {result['diagnosis']}" if result.get("diagnosis") else ""))
    return result


def _run_one_wave(ctx: StageContext, wave: dict[str, Any], eps: list[Endpoint], req: RolloutRequest,
                  holder: str) -> tuple[str, dict[str, str]]:
    ctx.say(f"wave {wave['wave']} ({wave['kind']}): {', '.join(e.key for e in eps)}")
    outcomes = endpoints.reconcile_wave(ctx, eps, holder=holder)
    broken = {str(o.endpoint): "fail — " + "; ".join(o.detail.get("violations") or [o.detail.get("reason", "")])[:300]
              for o in outcomes if o.outcome in ("failed", "refused")}
    if ctx.dry_run:
        return "none", {}
    if not req.gated:
        return ("fail" if broken else "pass"), broken
    bake = req.bake_s
    if bake:
        ctx.say(f"baking {bake:.0f}s before the gate")
        sleep_or_stop(bake, f"[{ctx.cluster.name}] bake")
    results = {ep.key: _verify_and_record(ctx, ep, req, f"verify:{wave['wave']}:{ep.key}") for ep in eps
               if ep.key not in broken}
    verdict = gates.wave_verdict([*results.values(), *({"verdict": "fail"} for _ in broken)])
    ctx.record(f"gate:{wave['wave']}", "gate", "passed" if verdict == "pass" else verdict,
               verdicts={k: v["verdict"] for k, v in results.items()})
    return verdict, {**broken, **{k: v["verdict"] + (f" — {v['diagnosis']}" if v.get("diagnosis") else "")
                                  for k, v in results.items()}}


@task_boundary
def run_wave_slot(cluster: str, slot: int, plan: dict[str, Any], previous: dict[str, Any] | None,
                  params: dict[str, Any]) -> dict[str, Any]:
    """Run this slot's wave(s) unless an earlier gate stopped or aborted the cluster."""
    req = RolloutRequest.from_params(params)
    ctx = rollout_context(cluster, req)
    info = run_info()
    waves = _slot_waves(plan, cluster, slot)
    by_ref = {e.ref: e for e in ctx.inventory.endpoints_of(cluster)}
    out: dict[str, Any] = {"cluster": cluster, "slot": slot, "waves": [w["wave"] for w in waves], "endpoints": {},
                           "review": [], "verdict": "none", "has_next": False}
    decision = (previous or {}).get("decision", gates.CONTINUE)
    lease: ClusterLock | None = None
    try:
        if not waves:
            return {**out, "carry": decision if decision in (gates.STOP, gates.ABORT) else None,
                    "reason": (previous or {}).get("reason")}
        all_eps = [by_ref[e["ref"]] for w in waves for e in w["endpoints"]]
        if decision in (gates.STOP, gates.ABORT):
            outcome = "skipped_by_gate" if decision == gates.STOP else "aborted"
            _mark(ctx, all_eps, outcome, (previous or {}).get("reason", ""))
            return {**out, "verdict": "stopped", "carry": decision, "reason": (previous or {}).get("reason")}
        skip = set((previous or {}).get("skip") or [])
        if not ctx.dry_run:
            lease = _lease(ctx, req).acquire()  # re-entrant for this run; fails naming another holder
        for i, wave in enumerate(waves):
            eps = [by_ref[e["ref"]] for e in wave["endpoints"] if by_ref[e["ref"]].key not in skip]
            verdict, detail = _run_one_wave(ctx, wave, eps, req, info.run_key)
            out["endpoints"].update(detail)
            out["verdict"] = verdict
            out["review"] = [k for k, v in detail.items() if v.startswith(("degraded", "unverifiable"))]
            rest = [by_ref[e["ref"]] for w in waves[i + 1:] for e in w["endpoints"]]
            if rest and verdict == "fail" and req.gated:
                _mark(ctx, rest, "skipped_by_gate", f"wave {wave['wave']} failed its gate")
                return {**out, "verdict": "fail", "carry": gates.STOP}
            if rest and verdict == "review" and req.gated:
                _mark(ctx, rest, "paused_for_review", f"wave {wave['wave']} inconclusive; re-run after review")
                return {**out, "carry": gates.STOP}
        out["has_next"] = slot < SLOTS - 1 and bool(_slot_waves(plan, cluster, slot + 1))
        return out
    except BaseException:
        if lease is not None:  # a failed wave frees the cluster; its retry (or the teardown) takes over
            lease.release()
            lease = None
        raise
    finally:
        if lease is not None:
            lease.park()
        ctx.close()


@task_boundary
def release_cluster(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    """Teardown: restore the operator if THIS run paused it, then release the lease and the slot. Runs even
    when ``cluster_stages`` or a wave failed, was skipped or aborted, or its worker died between pause and
    restore (a teardown without a setup task: trigger rule all-done)."""
    ctx = rollout_context(cluster, RolloutRequest.from_params(params))
    info = run_info()
    history = ctx.history or History()
    result: dict[str, Any] = {"restored": False}
    try:
        if not ctx.dry_run:
            result = operator_pause.restore(ctx, holder=info.run_key)
            if result.get("restored"):
                ctx.record(f"teardown_restore:{cluster}", "operator", "changed", action="restored by teardown",
                           **result)
        return result
    finally:
        # Released even when the restore fails (the task still fails, and fails the run): a pause left behind by
        # a run that holds no lease is a dead pauser's, which the drift check restores.
        result["released"] = _release_all(history, info.run_key, cluster)
        ctx.close()


@task_boundary
def finish_rollout(plan: dict[str, Any], last_slots: list[Any] | None, params: dict[str, Any]) -> dict[str, Any]:
    info = run_info()
    req = RolloutRequest.from_params(params)
    history = History()
    if req.dry_run:
        _print_dry_run(history, info.run_key)
    rows = history.query("rollout_by_lob", run_key=info.run_key)
    lines = [f"{'LOB':<12}{'moved':>7}{'same':>7}{'skipped':>9}{'failed':>8}{'pass':>6}{'other':>7}"
             f"{'hit':>7}{'speedup':>9}{'expected':>10}"]
    for r in rows:
        lines.append(f"{r['lob'] or '-':<12}{r['moved']:>7}{r['unchanged']:>7}{r['skipped']:>9}{r['failed']:>8}"
                     f"{r['verified_pass']:>6}{r['verified_other']:>7}{_f(r['avg_hit_ratio']):>7}"
                     f"{_f(r['avg_speedup']):>9}{_f(r['avg_expected']):>10}")
    log.info("rollout summary per line of business\n%s", "\n".join(lines))
    steps = history.steps(info.run_key)
    aborted = [{"cluster": s["cluster"], "reason": (s["detail"] or {}).get("reason")} for s in steps
               if s["outcome"] == "aborted"]
    summary = {"steps": len(steps), "dry_run": req.dry_run,
               "clusters": cluster_names(plan), "lobs": rows, "aborted": aborted}
    history.end_run(info.run_key, "aborted" if aborted else "success", summary)
    if aborted:
        raise PermanentError("rollout aborted at a gate: " + "; ".join(sorted({f"{g['cluster']}: {g['reason']}"
                                                                              for g in aborted})))
    return {"lobs": len(rows)}


def _print_dry_run(history: History, run_key: str) -> None:
    actions = history.query("planned_actions", run_key=run_key)
    lines = [f"DRY RUN: {len(actions)} change(s) would be made"]
    for a in actions:
        where = a["cluster"] + (f" {a['endpoint']}" if a["endpoint"] else "")
        lines.append(f"[{where}] {a['action']}")
        if a["diff"]:
            lines.extend("    " + line for line in a["diff"].splitlines())
    log.info("%s", "\n".join(lines))


def _f(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}"
