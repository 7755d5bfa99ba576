"""Task bodies of the `kvfleet_rollout` DAG. The DAG file only wires these together.

Called inside Airflow task processes (or `dag.test()`); every function reads its Params, calls the pure
planner and the stage reconcilers, and records into the history store.
"""

from __future__ import annotations

import logging
from typing import Any

from kvfleet.airflow.context import run_info
from kvfleet.airflow.errors import permanent_fails_fast
from kvfleet.fleet.inventory import Inventory, load_inventory
from kvfleet.fleet.plan import make_plan, render_plan_text
from kvfleet.history.repo import History, StepEvent

log = logging.getLogger(__name__)


def scoped_inventory(params: dict[str, Any]) -> Inventory:
    inv = load_inventory(params["fleet"])
    return inv.select(lobs=params.get("lobs") or None, clusters=params.get("clusters") or None,
                      endpoints=params.get("endpoints") or None)


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


@permanent_fails_fast
def finish_rollout(plan: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    info = run_info()
    history = History()
    steps = history.steps(info.run_key)
    summary = {"steps": len(steps), "dry_run": bool(params.get("dry_run")),
               "clusters": [c["cluster"] for c in plan["clusters"]]}
    history.end_run(info.run_key, "success", summary)
    return summary
