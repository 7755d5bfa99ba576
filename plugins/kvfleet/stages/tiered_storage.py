"""Stage 1: HyperPod tiered storage (the L1 host-DRAM tier's daemon), as an idempotent reconciler.

Observe ``DescribeCluster``; if ``TieredStorageConfig`` already matches the inventory (and NodeRecovery too,
when the inventory declares it), record "unchanged" and make no call. Otherwise ``UpdateCluster`` with the config
**and a NodeRecovery** (the service refuses tiered storage alone — docs/reference/hyperpod.md#noderecovery-rule), wait
for InService (failing at once with the FailureMessage on a terminal state), then verify DaemonSet
``aws-hyperpod/ai-toolkit`` has a ready pod per node.

NodeRecovery:
- **declared** in the inventory (``node_recovery:`` present; ``Cluster.node_recovery`` not None):
  kvfleet reconciles the cluster to it. A difference alone is an ``UpdateCluster`` with NodeRecovery only (no
  TieredStorageConfig, so the ai-toolkit daemon is left alone); the change is recorded with the value before.
- **not declared**: the live value is sent back unchanged, as before — a platform team's choice made outside
  kvfleet stays. The drift check reports a declared value the cluster does not have (``node_recovery_mismatch``)
  and judges nothing when it is not declared.

The change is one typed action (``fleet.actions.UpdateCluster``) that ``stages.executor`` applies, or renders in a
dry run. The stage is split (``base.Pending``): ``act`` observes and makes the change, and hands the waits to its
caller (InService, then the ai-toolkit daemon ready on every node; the rollout defers them to Airflow's
triggerer), checking in between what the service applied; ``finish`` records. ``reconcile`` runs both,
waiting in the worker.
"""

from __future__ import annotations

from typing import Any

from kvfleet.clients.hyperpod import CLUSTER_FAILED, CLUSTER_OK, TieredStorage, validate_tiered_storage
from kvfleet.clients.kube import wait_for
from kvfleet.errors import ConvergenceTimeout, PermanentError
from kvfleet.fleet import constants as C
from kvfleet.fleet.actions import UpdateCluster
from kvfleet.stages import executor, readiness
from kvfleet.stages.base import Outcome, Pending, StageContext
from kvfleet.stages.converge import converge

STAGE = "tiered_storage"


def _matches(live: TieredStorage, mode: str, percent: int) -> bool:
    if mode == "Disable":
        return live.mode == "Disable"
    return live.mode == "Enable" and live.memory_percent == percent


def _verify_daemonset(ctx: StageContext, mode: str, nodes: int) -> str:
    return wait_for(lambda: readiness.ai_toolkit(ctx.kube, mode=mode, nodes=nodes), timeout_s=ctx.timeouts.pods_s,
                    poll_s=ctx.poll_s, what=f"[{ctx.cluster.name}] {readiness.WHAT['ai_toolkit']}",
                    progress=ctx.progress)


def node_recovery_target(ctx: StageContext, live: str | None) -> tuple[str, str]:
    """(the NodeRecovery to send, where it comes from): the inventory's value when it declares one
    ("declared": kvfleet reconciles the cluster to it), else the live value sent back unchanged ("live")."""
    cl = ctx.cluster
    declared = cl.node_recovery
    if declared is not None:
        if declared not in C.NODE_RECOVERY_VALUES:
            raise PermanentError(f"clusters.{cl.name}.node_recovery: {declared!r} is not one of Automatic, None; "
                                 "set one of them, or remove the key to keep the cluster's live value")
        return declared, "declared"
    return live or C.NODE_RECOVERY_DEFAULT, "live"


def reconcile(ctx: StageContext) -> Outcome:
    """Stage 1 to its end in this process (``act``, waiting in the worker, ``finish``)."""
    return converge(ctx, act, finish)


def act(ctx: StageContext, progress: dict[str, Any]) -> Pending | None:
    """Observe, decide and make the one change (``UpdateCluster``), or record that none is needed (or, in a dry
    run, the change it would make). Returns the wait the change needs (``base.Pending``): the caller waits for
    InService, in the worker or deferred, then calls ``act`` again (None: go on to ``finish``)."""
    if "done" in progress:
        return None
    if "daemon" in progress:
        return _daemon(ctx, progress)
    if "decision" in progress:
        return _applied(ctx, progress)
    cl = ctx.cluster
    mode, percent = cl.tiered_storage.mode, cl.tiered_storage.memory_percent
    validate_tiered_storage(mode, percent)  # before any call: botocore checks neither range nor enum
    hp = ctx.hyperpod.require_cluster(cl.name)
    live = hp.tiered_storage
    node_recovery, source = node_recovery_target(ctx, hp.node_recovery)
    desired = f"Mode={mode}" + (f",InstanceMemoryAllocationPercentage={percent}" if mode == "Enable" else "")
    tiered_ok = _matches(live, mode, percent)
    recovery_ok = source == "live" or hp.node_recovery == node_recovery
    if not ctx.dry_run and hp.status not in CLUSTER_OK and hp.status not in CLUSTER_FAILED:
        # A change in flight (an earlier try's, whose configuration may already read as the desired one, or one
        # made by hand): wait for InService, then observe again, before deciding there is nothing to do.
        return Pending("before:cluster", f"HyperPod cluster {cl.name} is {hp.status}", ctx.timeouts.cluster_update_s)
    if tiered_ok and recovery_ok:
        ctx.say(f"stage 1: tiered storage already {desired}, NodeRecovery {node_recovery} ({source}); "
                "nothing to do")
        progress["done"] = ctx.record("tiered_storage", STAGE, "unchanged", mode=mode, memory_percent=percent,
                                      node_recovery=node_recovery, node_recovery_source=source).as_dict()
        return None
    before = f"Mode={live.mode},InstanceMemoryAllocationPercentage={live.memory_percent}"
    diff = [] if tiered_ok else [f"- TieredStorageConfig {before}", f"+ TieredStorageConfig {desired}"]
    if not recovery_ok:
        diff += [f"- NodeRecovery {hp.node_recovery}", f"+ NodeRecovery {node_recovery} (declared in the inventory)"]
    action = UpdateCluster(cl.name, None if tiered_ok else mode, None if tiered_ok else percent, node_recovery,
                           diff="\n".join(diff))
    if ctx.dry_run:
        executor.run(ctx, STAGE, [action])
        progress["done"] = ctx.record("tiered_storage", STAGE, "planned", action=action.equivalent(),
                                      before=before, node_recovery_before=hp.node_recovery,
                                      node_recovery=node_recovery, node_recovery_source=source).as_dict()
        return None
    if hp.status in CLUSTER_FAILED:
        raise PermanentError(f"HyperPod cluster {cl.name} is {hp.status}: {hp.failure_message or 'no FailureMessage'}")
    ctx.say(f"stage 1: {action.equivalent()}")
    executor.run(ctx, STAGE, [action])
    progress["decision"] = {"mode": mode, "percent": percent, "desired": desired, "before": before,
                            "tiered_ok": tiered_ok, "recovery_ok": recovery_ok, "node_recovery": node_recovery,
                            "source": source, "node_recovery_before": hp.node_recovery}
    return Pending("after:cluster", f"UpdateCluster {cl.name}", ctx.timeouts.cluster_update_s)


def _applied(ctx: StageContext, progress: dict[str, Any]) -> Pending | None:
    """After the change: one look at the cluster (not InService yet: the same wait again); once InService, what
    the service applied, then the ai-toolkit daemon (``_daemon``)."""
    cl, d = ctx.cluster, progress["decision"]
    verdict, after = ctx.hyperpod.cluster_wait_state(cl.name)
    if after is None:
        raise PermanentError(f"HyperPod cluster {cl.name!r} not found in {cl.region} after UpdateCluster")
    if verdict == "failure":
        raise PermanentError(f"HyperPod cluster {cl.name} is {after.status}: "
                             f"{after.failure_message or 'no FailureMessage'}")
    if verdict != "success":
        return Pending("after:cluster", f"HyperPod cluster {cl.name} is {after.status}", ctx.timeouts.cluster_update_s)
    if after.node_recovery is not None and after.node_recovery != d["node_recovery"]:
        raise PermanentError(f"HyperPod cluster {cl.name}: NodeRecovery is {after.node_recovery} after "
                             f"UpdateCluster asked for {d['node_recovery']}")
    if not d["tiered_ok"] and not _matches(after.tiered_storage, d["mode"], d["percent"]):
        # InService with the old configuration: the update was not seen yet (or was undone). Temporary: the
        # task's retry observes again and sends the change if it is still missing.
        raise ConvergenceTimeout(f"HyperPod cluster {cl.name} is InService with TieredStorageConfig "
                                 f"Mode={after.tiered_storage.mode},InstanceMemoryAllocationPercentage="
                                 f"{after.tiered_storage.memory_percent} after UpdateCluster asked for {d['desired']}")
    if d["tiered_ok"]:
        progress["daemon"] = None
        return None
    progress["daemon"] = {"args": {"mode": d["mode"], "nodes": len(ctx.hyperpod.list_cluster_nodes(cl.name))},
                          "state": None}
    return _daemon(ctx, progress)


def _daemon(ctx: StageContext, progress: dict[str, Any]) -> Pending | None:
    """One look at the ai-toolkit daemon (``stages.readiness.ai_toolkit``): not ready, a wait for the caller."""
    daemon = progress["daemon"]
    if daemon is None or daemon["state"]:
        return None
    ready, state = readiness.ai_toolkit(ctx.kube, **daemon["args"])
    daemon["state"] = state if ready else None
    if ready:
        return None
    return Pending("after:ai_toolkit", f"stage 1: {state}", ctx.timeouts.pods_s, check="ai_toolkit",
                   args=dict(daemon["args"]))


def finish(ctx: StageContext, progress: dict[str, Any]) -> Outcome:
    """After the change and its waits: record what changed and the daemon's state; or the outcome ``act``
    already recorded."""
    if "done" in progress:
        return Outcome.from_dict(progress["done"])
    d, daemon = progress["decision"], progress["daemon"]
    detail: dict[str, Any] = {"node_recovery": d["node_recovery"], "node_recovery_source": d["source"]}
    if not d["recovery_ok"]:
        detail["node_recovery_before"] = d["node_recovery_before"]
    if daemon is None:
        return ctx.record("tiered_storage", STAGE, "changed", before=d["desired"], after=d["desired"], **detail)
    # Ready already when the caller waited: one read.
    state = daemon["state"] or _verify_daemonset(ctx, daemon["args"]["mode"], daemon["args"]["nodes"])
    return ctx.record("tiered_storage", STAGE, "changed", before=d["before"], after=d["desired"], verified=state,
                      **detail)
