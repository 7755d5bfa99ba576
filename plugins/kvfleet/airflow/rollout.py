"""Task bodies of the `kvfleet_rollout` DAG. The DAG file only wires these together.

Called inside Airflow task processes (or `dag.test()`): every function reads its Params, calls the pure
planner and the stage reconcilers, and records into the history store.

Task structure (per run): ``plan`` -> a mapped task group per cluster [``cluster_stages`` (stages 1–3) ->
``cluster_waves`` (waves in plan order: stage 4, then stage 5 per wave) -> ``restore_operator`` (teardown)] ->
``finish`` (summary per LOB). Mapping is per cluster, so 1,000 endpoints on 10 clusters is 10 mapped
instances per task, far below ``max_map_length``.
"""

from __future__ import annotations

import logging
from typing import Any

from kvfleet.airflow.context import run_info
from kvfleet.airflow.errors import permanent_fails_fast
from kvfleet.fleet.inventory import Inventory, load_inventory
from kvfleet.fleet.plan import make_plan, render_plan_text
from kvfleet.history.repo import History, StepEvent
from kvfleet.stages import addons, curvine, endpoints, tiered_storage, verify
from kvfleet.stages.base import StageContext

log = logging.getLogger(__name__)


def scoped_inventory(params: dict[str, Any]) -> Inventory:
    inv = load_inventory(params["fleet"])
    return inv.select(lobs=params.get("lobs") or None, clusters=params.get("clusters") or None,
                      endpoints=params.get("endpoints") or None)


def _context(cluster: str, params: dict[str, Any]) -> StageContext:
    info = run_info()
    inv = scoped_inventory(params)
    return StageContext(inventory=inv, cluster=inv.cluster(cluster), step_key=info.step_key, actor=info.actor,
                        dry_run=bool(params.get("dry_run")), history=History(),
                        aws_conn_id=params.get("aws_conn_id") or "aws_default")


@permanent_fails_fast
def plan_rollout(params: dict[str, Any]) -> dict[str, Any]:
    """Validate the inventory and the scope, compute the plan, and open the run in the history store."""
    info = run_info()
    inv = scoped_inventory(params)
    plan = make_plan(inv, wave_size=params.get("wave_size"), canary=params.get("canary", True))
    log.info("%s", render_plan_text(plan))
    history = History()
    history.start_run(info.run_key, dag_id=info.dag_id, run_id=info.run_id, trigger=info.trigger,
                      triggered_by=info.triggered_by, params=params, plan=plan.as_dict())
    history.record_step(info.step_key, StepEvent(step="plan", stage="plan", outcome="planned",
                                                 detail={"clusters": len(plan.clusters),
                                                         "endpoints": len(inv.endpoints),
                                                         "dry_run": bool(params.get("dry_run"))}),
                        actor=info.actor)
    return plan.as_dict()


def cluster_names(plan: dict[str, Any]) -> list[str]:
    return [c["cluster"] for c in plan["clusters"]]


@permanent_fails_fast
def run_cluster_stages(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    ctx = _context(cluster, params)
    try:
        outcomes = [stage.reconcile(ctx) for stage in (tiered_storage, addons, curvine)]
    finally:
        ctx.close()
    for o in outcomes:
        log.info("[%s] %s: %s", cluster, o.stage, o.outcome)
    return {"cluster": cluster, "stages": [o.as_dict() for o in outcomes],
            "planned": [p.as_dict() for p in ctx.planned]}


@permanent_fails_fast
def run_cluster_waves(cluster: str, plan: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    ctx = _context(cluster, params)
    info = run_info()
    waves = next(c["waves"] for c in plan["clusters"] if c["cluster"] == cluster)
    by_ref = {e.ref: e for e in ctx.inventory.endpoints_of(cluster)}
    report: list[dict[str, Any]] = []
    try:
        for wave in waves:
            eps = [by_ref[e["ref"]] for e in wave["endpoints"]]
            ctx.say(f"wave {wave['wave']} ({wave['kind']}): {', '.join(e.key for e in eps)}")
            outcomes = endpoints.reconcile_wave(ctx, eps, holder=info.run_key,
                                                fail_after_scale_down=bool(params.get("_drill_fail_after_scale_down")))
            results = []
            if not ctx.dry_run and params.get("gate", "verify") != "none":
                for ep in eps:
                    results.append(_verify_and_record(ctx, ep, params, step=f"verify:{wave['wave']}:{ep.key}"))
            report.append({"wave": wave["wave"], "kind": wave["kind"], "endpoints": [o.as_dict() for o in outcomes],
                           "verifications": results})
    finally:
        ctx.close()
    return {"cluster": cluster, "waves": report, "planned": [p.as_dict() for p in ctx.planned]}


def _verify_and_record(ctx: StageContext, ep: Any, params: dict[str, Any], step: str) -> dict[str, Any]:
    result = verify.verify_endpoint(ctx, ep, int(params.get("prompt_tokens") or 2000)).as_dict()
    if ctx.history is not None and ctx.step_key is not None:
        ctx.history.record_verification(ctx.step_key, step, result)
    ctx.say(f"stage 5: {ep.key}: {result['verdict']} hit {result['hit_ratio']} cold {result['ttft_cold_ms']} ms "
            f"warm {result['ttft_warm_ms']} ms speedup {result['speedup']}x (expected {result['expected_speedup']}x)"
            + (f" — {result['diagnosis']}" if result.get("diagnosis") else ""))
    return result


def restore_operator(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    """Teardown: restore the operator if THIS run paused it (a no-op otherwise). Runs even when the waves task
    failed or its worker died between pause and restore."""
    from kvfleet.stages import operator_pause

    ctx = _context(cluster, params)
    if ctx.dry_run:
        return {"restored": False, "reason": "dry run"}
    info = run_info()
    try:
        result = operator_pause.restore(ctx, holder=info.run_key)
        if result.get("restored"):
            ctx.record(f"teardown_restore:{cluster}", "operator", "changed", action="restored by teardown", **result)
        return result
    finally:
        ctx.close()


@permanent_fails_fast
def finish_rollout(plan: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    info = run_info()
    history = History()
    rows = history.query("rollout_by_lob", run_key=info.run_key)
    lines = [f"{'LOB':<12}{'moved':>7}{'same':>7}{'skipped':>9}{'failed':>8}{'pass':>6}{'other':>7}"
             f"{'hit':>7}{'speedup':>9}{'expected':>10}"]
    for r in rows:
        lines.append(f"{r['lob']:<12}{r['moved']:>7}{r['unchanged']:>7}{r['skipped']:>9}{r['failed']:>8}"
                     f"{r['verified_pass']:>6}{r['verified_other']:>7}{_f(r['avg_hit_ratio']):>7}"
                     f"{_f(r['avg_speedup']):>9}{_f(r['avg_expected']):>10}")
    log.info("rollout summary per line of business\n%s", "\n".join(lines))
    summary = {"steps": len(history.steps(info.run_key)), "dry_run": bool(params.get("dry_run")),
               "clusters": cluster_names(plan), "lobs": rows}
    history.end_run(info.run_key, "success", summary)
    return {"lobs": len(rows)}


def _f(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}"
