"""Running a split stage (``act``/``finish``, ``stages.base.Pending``) to its end in this process: the waits a
stage hands back are waited for here, in the worker (the CLI, the drift remediation, the tests). The rollout
defers them to Airflow's triggerer instead (``kvfleet.airflow.rollout``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvfleet.clients.kube import wait_for
from kvfleet.stages import readiness
from kvfleet.stages.base import Outcome, Pending, StageContext


def settle(ctx: StageContext, pending: Pending) -> None:
    """Wait for ``pending`` in this process (``HyperPodClient.wait_cluster``/``wait_addon``, or the readiness
    check polled with ``clients.kube.wait_for``)."""
    if pending.check is not None:
        name, args = pending.check, dict(pending.args or {})
        wait_for(lambda: readiness.check(ctx.kube, name, args), timeout_s=pending.timeout_s, poll_s=ctx.poll_s,
                 what=f"[{ctx.cluster.name}] {readiness.WHAT[name]}", progress=ctx.progress)
    elif pending.addon is None:
        ctx.hyperpod.wait_cluster(ctx.cluster.name, timeout_s=pending.timeout_s, poll_s=ctx.poll_s,
                                  progress=ctx.say)
    else:
        ctx.hyperpod.wait_addon(pending.eks or ctx.hyperpod.require_cluster(ctx.cluster.name).eks_cluster_name,
                                pending.addon, timeout_s=pending.timeout_s, poll_s=ctx.poll_s, progress=ctx.say)


def converge(ctx: StageContext, act: Callable[[StageContext, dict[str, Any]], Pending | None],
             finish: Callable[[StageContext, dict[str, Any]], Outcome]) -> Outcome:
    """A split stage run to its end in this process: act, wait in the worker, act again, ..., finish."""
    progress: dict[str, Any] = {}
    while (pending := act(ctx, progress)) is not None:
        settle(ctx, pending)
    return finish(ctx, progress)
