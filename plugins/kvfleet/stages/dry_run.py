"""`kvfleet plan --diff`: what a rollout would change, per cluster and endpoint, observed from the live fleet
without Airflow — the same reconcilers as the DAG, in dry-run mode (observe, diff, print; change nothing).

Output: the AWS calls with their parameters, the helm commands with values, and the CR and Deployment patches as
unified diffs, in plan order. A change the rollout would refuse (stage 4's ``immutable_changes``: an immutable CR
field changed, or intelligentRoutingSpec added to an existing endpoint, which the operator rejects) is printed as
REFUSED with the reason and how to proceed, and the command exits 2.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

from kvfleet.fleet.inventory import Inventory
from kvfleet.fleet.plan import Plan
from kvfleet.stages import addons, curvine, endpoints, tiered_storage
from kvfleet.stages.base import PlannedAction, StageContext


@dataclass(frozen=True)
class Refusal:
    """An endpoint change the rollout would refuse, and why (the reason names field, live and wanted value)."""

    cluster: str
    endpoint: str
    reason: str


def cluster_diff(inv: Inventory, plan: Plan, cluster: str, aws_conn_id: str | None = None,
                 refusals: list[Refusal] | None = None) -> list[PlannedAction]:
    """The planned actions of one cluster; refused endpoint changes are appended to ``refusals`` when given."""
    ctx = StageContext(inventory=inv, cluster=inv.cluster(cluster), dry_run=True, aws_conn_id=aws_conn_id,
                       progress=lambda msg: None)
    try:
        for stage in (tiered_storage, addons, curvine):
            stage.reconcile(ctx)
        if any(p.stage == addons.STAGE for p in ctx.planned):
            ctx.plan(endpoints.STAGE, "then stage 4 on every endpoint of the plan (the operator is not there yet)")
            return ctx.planned
        for wave in plan.waves_of(cluster):
            outcomes = endpoints.reconcile_wave(ctx, list(wave.endpoints), holder="dry-run")
            if refusals is not None:
                refusals.extend(Refusal(cluster, o.endpoint or "?", str(o.detail.get("reason", "")))
                                for o in outcomes if o.outcome == "refused")
        return ctx.planned
    finally:
        ctx.close()


def print_fleet_diff(inv: Inventory, plan: Plan, out: Any = sys.stdout) -> int:
    """Print every cluster's planned changes; 0, or 2 when the plan holds a change the rollout would refuse."""
    logging.getLogger("kvfleet").setLevel(logging.WARNING)
    total = 0
    refusals: list[Refusal] = []
    for cp in plan.clusters:
        before = len(refusals)
        actions = cluster_diff(inv, plan, cp.cluster, refusals=refusals)
        total += len(actions)
        print(f"=== cluster {cp.cluster}: {len(actions)} change(s)", file=out)
        for a in actions:
            print(f"[{a.endpoint or cp.cluster}] {a.action}", file=out)
            for line in (a.diff or "").splitlines():
                print(f"    {line}", file=out)
        for r in refusals[before:]:
            print(f"[{r.endpoint}] REFUSED: {r.reason}", file=out)
    print(f"\n{total} change(s) in total; nothing was changed (dry run)", file=out)
    if refusals:
        print(f"{len(refusals)} endpoint change(s) would be refused (see REFUSED above): revert those endpoints in "
              "the inventory, or delete and recreate them deliberately", file=out)
        return 2
    return 0
