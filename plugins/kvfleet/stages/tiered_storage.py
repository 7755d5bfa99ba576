"""Stage 1: HyperPod tiered storage (the L1 host-DRAM tier's daemon), as an idempotent reconciler.

Observe ``DescribeCluster``; if ``TieredStorageConfig`` already matches the inventory, record "unchanged" and
make no call. Otherwise ``UpdateCluster`` with the config **and the cluster's current NodeRecovery sent back**
(the service refuses tiered storage alone — DOMAIN.md stage 1), wait for InService (failing at once with the
FailureMessage on a terminal state), then verify DaemonSet ``aws-hyperpod/ai-toolkit`` has a ready pod per node.
"""

from __future__ import annotations

from kvfleet.clients.hyperpod import TieredStorage, validate_tiered_storage
from kvfleet.clients.kube import get_or_none, wait_for
from kvfleet.fleet import constants as C
from kvfleet.stages.base import Outcome, StageContext, poll_seconds

STAGE = "tiered_storage"


def _matches(live: TieredStorage, mode: str, percent: int) -> bool:
    if mode == "Disable":
        return live.mode == "Disable"
    return live.mode == "Enable" and live.memory_percent == percent


def _verify_daemonset(ctx: StageContext, mode: str, nodes: int) -> str:
    apps = ctx.kube.apps

    def check() -> tuple[bool, str]:
        ds = get_or_none(apps.read_namespaced_daemon_set, C.AI_TOOLKIT_DAEMONSET, C.AI_TOOLKIT_NAMESPACE)
        if mode == "Disable":
            return ds is None, "ai-toolkit absent" if ds is None else "ai-toolkit still present"
        if ds is None:
            return False, "ai-toolkit DaemonSet not created yet"
        ready = getattr(ds.status, "number_ready", None) or 0
        desired = getattr(ds.status, "desired_number_scheduled", None) or 0
        return ready == desired == nodes, f"ai-toolkit ready {ready}/{desired} on {nodes} nodes"

    return wait_for(check, timeout_s=ctx.timeouts.pods_s, poll_s=poll_seconds(),
                    what=f"[{ctx.cluster.name}] {C.AI_TOOLKIT_NAMESPACE}/{C.AI_TOOLKIT_DAEMONSET}",
                    progress=ctx.progress)


def reconcile(ctx: StageContext) -> Outcome:
    cl = ctx.cluster
    mode, percent = cl.tiered_storage_mode, cl.memory_percent
    validate_tiered_storage(mode, percent)  # before any call: botocore checks neither range nor enum
    hp = ctx.hyperpod.require_cluster(cl.name)
    live = hp.tiered_storage
    desired = f"Mode={mode}" + (f",InstanceMemoryAllocationPercentage={percent}" if mode == "Enable" else "")
    if _matches(live, mode, percent):
        ctx.say(f"stage 1: tiered storage already {desired}; nothing to do")
        return ctx.record("tiered_storage", STAGE, "unchanged", mode=mode, memory_percent=percent)
    node_recovery = hp.node_recovery or cl.node_recovery
    action = (f"aws sagemaker update-cluster --cluster-name {cl.name} --tiered-storage-config {desired} "
              f"--node-recovery {node_recovery}")
    before = f"Mode={live.mode},InstanceMemoryAllocationPercentage={live.memory_percent}"
    if ctx.dry_run:
        ctx.plan(STAGE, action, diff=f"- TieredStorageConfig {before}\n+ TieredStorageConfig {desired}")
        return ctx.record("tiered_storage", STAGE, "planned", action=action, before=before)
    if hp.status != "InService":
        hp = ctx.hyperpod.wait_cluster(cl.name, timeout_s=ctx.timeouts.cluster_update_s, poll_s=poll_seconds(),
                                       progress=ctx.say)
    ctx.say(f"stage 1: {action}")
    ctx.hyperpod.update_tiered_storage(cl.name, mode, percent, node_recovery)
    ctx.hyperpod.wait_cluster(cl.name, timeout_s=ctx.timeouts.cluster_update_s, poll_s=poll_seconds(),
                              progress=ctx.say)
    nodes = len(ctx.hyperpod.list_cluster_nodes(cl.name))
    state = _verify_daemonset(ctx, mode, nodes)
    return ctx.record("tiered_storage", STAGE, "changed", before=before, after=desired, node_recovery=node_recovery,
                      verified=state)
