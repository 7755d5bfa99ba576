"""`kvfleet plan --diff`: what a rollout would change, per cluster and endpoint, observed from the live fleet
without Airflow — the same reconcilers as the DAG, in dry-run mode (observe, diff, print; change nothing).

Output, in plan order: the typed actions the stages computed (``fleet.actions``; the very list
``stages.executor`` applies in a real run, each printed as its kubectl/aws/helm equivalent and marked so — the
Curvine stage's helm installs and upgrades with the digest of the values file helm would get), with the CR and
ClusterPolicy diffs; and per endpoint the update strategy it gets and why. A change the rollout
would refuse (stage 4's ``immutable_changes``: an immutable CR field changed, or intelligentRoutingSpec added to
an existing endpoint, which the operator rejects; an update strategy unsafe on the live cluster) is printed as
REFUSED with the reason and how to proceed, and the command exits 2.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvfleet.fleet.actions import EQUIVALENT_MARK, Action
from kvfleet.fleet.inventory import Inventory
from kvfleet.fleet.plan import Plan
from kvfleet.stages import addons, curvine, endpoints, executor, tiered_storage
from kvfleet.stages.base import Outcome, StageContext

if TYPE_CHECKING:
    from kvfleet.clients.identity import Identity
    from kvfleet.fleet.inventory import Cluster


@dataclass(frozen=True)
class Refusal:
    """An endpoint change the rollout would refuse, and why (the reason names field, live and wanted value)."""

    cluster: str
    endpoint: str
    reason: str


@dataclass(frozen=True)
class ClusterDiff:
    """One cluster's dry run: the typed actions the stages computed (the executor's journal, in order: stages
    1 to 4), the lines a human needs besides them (the update strategy of each endpoint and why, what cannot be
    computed yet), and the refusals."""

    cluster: str
    actions: tuple[Action, ...]
    notes: tuple[tuple[str, str], ...]  # (target, text)
    refusals: tuple[Refusal, ...]


def _notes_and_refusals(cluster: str, outcomes: list[Outcome]) -> tuple[list[tuple[str, str]], list[Refusal]]:
    notes: list[tuple[str, str]] = []
    refusals: list[Refusal] = []
    for o in outcomes:
        target = f"{cluster}:{o.endpoint}"
        if o.outcome == "refused":
            refusals.append(Refusal(cluster, o.endpoint or "?", str(o.detail.get("reason", ""))))
        strategy = o.detail.get("update_strategy")
        if strategy:
            notes.append((target, f"update strategy {strategy['strategy']}: {strategy['why']}"))
        if o.detail.get("note"):
            notes.append((target, str(o.detail["note"])))
    return notes, refusals


def observe_cluster(inv: Inventory, plan: Plan, cluster: str, aws_conn_id: str | None = None,
                    holder: str = "dry-run", identity: Identity | None = None) -> ClusterDiff:
    """Run every stage of one cluster in dry-run mode against the live cluster; nothing is changed. ``holder``:
    who the operator pause would be recorded for (a rollout's dry run passes its run key); ``identity``: who to
    act as (else the base identity ``aws_conn_id`` and the cluster's account role)."""
    cl = inv.cluster(cluster)
    ctx = StageContext(inventory=inv, cluster=cl, dry_run=True, aws_conn_id=aws_conn_id,
                       identity=identity, progress=lambda msg: None)
    # shown by its name, unless the inventory has several clusters of that name (then by its key)
    cluster = cl.name if [c.name for c in inv.clusters].count(cl.name) == 1 else cl.key
    notes: list[tuple[str, str]] = []
    refusals: list[Refusal] = []
    try:
        for stage in (tiered_storage, addons, curvine):
            stage.reconcile(ctx)
        if any(p.stage == addons.STAGE for p in ctx.planned):
            notes.append((cluster, "then stage 4 on every endpoint of the plan (the operator is not there yet)"))
        else:
            for wave in plan.waves_of(cl.key):
                more_notes, more_refusals = _notes_and_refusals(
                    cluster, endpoints.reconcile_wave(ctx, list(wave.endpoints), holder=holder))
                notes += more_notes
                refusals += more_refusals
        return ClusterDiff(cluster, tuple(executor.journal(ctx)), tuple(notes), tuple(refusals))
    finally:
        ctx.close()


def print_cluster_diff(d: ClusterDiff, out: Any) -> int:
    """Print one cluster's dry run, in the order a real run applies the actions; returns the number of changes
    (mutating actions)."""
    changes = sum(1 for a in d.actions if a.mutating)
    print(f"=== cluster {d.cluster}: {changes} change(s)", file=out)
    for a in d.actions:
        _print_action(d.cluster, a, out)
    for target, text in d.notes:
        print(f"[{target}] note: {text}", file=out)
    for r in d.refusals:
        print(f"[{r.endpoint}] REFUSED: {r.reason}", file=out)
    return changes


def _print_action(cluster: str, a: Action, out: Any) -> None:
    print(f"[{a.endpoint or cluster}] {EQUIVALENT_MARK} {a.equivalent()}", file=out)
    for line in (a.diff or "").splitlines():
        print(f"    {line}", file=out)


def print_fleet_diff(inv: Inventory, plan: Plan, out: Any = sys.stdout,
                     identity: Callable[[Inventory, Cluster], Identity] | None = None) -> int:
    """Print every cluster's planned changes; 0, or 2 when the plan holds a change the rollout would refuse.
    ``identity``: who to act as on each cluster (else the environment's credentials and its account's role)."""
    logging.getLogger("kvfleet").setLevel(logging.WARNING)
    total = 0
    refusals: list[Refusal] = []
    print(f"Lines marked {EQUIVALENT_MARK} are the kubectl/aws/helm commands equivalent to the calls kvfleet would "
          "make (it calls the Kubernetes and AWS APIs, not kubectl or aws; its helm commands pass a values file "
          "it writes, named here by its digest).", file=out)
    for cp in plan.clusters:
        cl = inv.cluster(cp.key)
        d = observe_cluster(inv, plan, cp.key, identity=identity(inv, cl) if identity is not None else None)
        total += print_cluster_diff(d, out)
        refusals += d.refusals
    print(f"\n{total} change(s) in total; nothing was changed (dry run)", file=out)
    if refusals:
        print(f"{len(refusals)} endpoint change(s) would be refused (see REFUSED above, each says what to do): "
              "revert those endpoints in the inventory, change their update_strategy, or delete and recreate them "
              "deliberately", file=out)
        return 2
    return 0
