"""`kvfleet plan --diff`: what a rollout would change, per cluster and endpoint, observed from the live fleet
without Airflow — the same reconcilers as the DAG, in dry-run mode (observe, diff, print; change nothing).

Output: the AWS calls with their parameters, the helm commands with values, and the CR and Deployment patches as
unified diffs, in plan order.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from kvfleet.fleet.inventory import Inventory
from kvfleet.fleet.plan import Plan
from kvfleet.stages import addons, curvine, endpoints, tiered_storage
from kvfleet.stages.base import PlannedAction, StageContext


def cluster_diff(inv: Inventory, plan: Plan, cluster: str, aws_conn_id: str | None = None) -> list[PlannedAction]:
    ctx = StageContext(inventory=inv, cluster=inv.cluster(cluster), dry_run=True, aws_conn_id=aws_conn_id,
                       progress=lambda msg: None)
    try:
        for stage in (tiered_storage, addons, curvine):
            stage.reconcile(ctx)
        if any(p.stage == addons.STAGE for p in ctx.planned):
            ctx.plan(endpoints.STAGE, "then stage 4 on every endpoint of the plan (the operator is not there yet)")
            return ctx.planned
        for wave in plan.waves_of(cluster):
            endpoints.reconcile_wave(ctx, list(wave.endpoints), holder="dry-run")
        return ctx.planned
    finally:
        ctx.close()


def print_fleet_diff(inv: Inventory, plan: Plan, out: Any = sys.stdout) -> int:
    logging.getLogger("kvfleet").setLevel(logging.WARNING)
    total = 0
    for cp in plan.clusters:
        actions = cluster_diff(inv, plan, cp.cluster)
        total += len(actions)
        print(f"=== cluster {cp.cluster}: {len(actions)} change(s)", file=out)
        for a in actions:
            print(f"[{a.endpoint or cp.cluster}] {a.action}", file=out)
            for line in (a.diff or "").splitlines():
                print(f"    {line}", file=out)
    print(f"\n{total} change(s) in total; nothing was changed (dry run)", file=out)
    return 0
