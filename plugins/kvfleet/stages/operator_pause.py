"""Pausing and restoring the HyperPod Inference Operator — the one cluster-wide, availability-critical lever of
stage 4's `patch` mode.

The operator's reconcile loop overwrites direct Deployment patches, so the blog's safe sequence scales its
controller to 0 first and restores it only after the patched pods are Ready. Whoever pauses records it on the
controller Deployment itself (annotations: who, when, the replica count to restore), so that:
- ``restore`` is idempotent and can run from a teardown task in another process after a crash;
- the drift check can flag an operator left paused, and by whom;
- a pause by someone else is never silently undone by kvfleet.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from kvfleet.clients.kube import call, get_or_none, wait_for
from kvfleet.errors import GateRefused, PermanentError
from kvfleet.fleet import constants as C
from kvfleet.stages.base import StageContext, poll_seconds


def _controller(ctx: StageContext) -> Any:
    dep = get_or_none(ctx.kube.apps.read_namespaced_deployment, C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE)
    if dep is None:
        raise PermanentError(f"operator controller {C.OPERATOR_NAMESPACE}/{C.OPERATOR_DEPLOYMENT} not found on "
                             f"{ctx.cluster.name}: run stage 2 (operator add-ons) first")
    return dep


def pause_state(ctx: StageContext) -> dict[str, Any]:
    dep = _controller(ctx)
    ann = dep.metadata.annotations or {}
    return {"replicas": dep.spec.replicas or 0, "ready": getattr(dep.status, "ready_replicas", None) or 0,
            "paused_by": ann.get(C.PAUSED_BY_ANNOTATION), "paused_at": ann.get(C.PAUSED_AT_ANNOTATION),
            "restore_to": ann.get(C.PAUSED_REPLICAS_ANNOTATION)}


def require_running(ctx: StageContext) -> None:
    """Custom resources are applied while the operator runs: its conversion webhook is served by the controller."""
    state = pause_state(ctx)
    if state["ready"] < 1:
        who = f" (paused by {state['paused_by']} at {state['paused_at']})" if state["paused_by"] else ""
        raise GateRefused(f"the inference operator on {ctx.cluster.name} has no ready replica{who}; its conversion "
                          "webhook is down, so InferenceEndpointConfigs cannot be applied. Restore it first "
                          f"(kubectl scale deployment {C.OPERATOR_DEPLOYMENT} -n {C.OPERATOR_NAMESPACE} --replicas=1).")


def pause(ctx: StageContext, holder: str) -> int:
    """Scale the controller to 0, recording who and when. Returns the replica count to restore."""
    state = pause_state(ctx)
    if state["paused_by"] and state["paused_by"] != holder:
        raise GateRefused(f"the inference operator on {ctx.cluster.name} is already paused by {state['paused_by']} "
                          f"since {state['paused_at']}; refusing to take over another holder's pause")
    restore_to = int(state["restore_to"] or state["replicas"] or 1)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    call(ctx.kube.apps.patch_namespaced_deployment, C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE,
         {"metadata": {"annotations": {C.PAUSED_BY_ANNOTATION: holder, C.PAUSED_AT_ANNOTATION: now,
                                       C.PAUSED_REPLICAS_ANNOTATION: str(restore_to)}},
          "spec": {"replicas": 0}}, what="pause the inference operator")
    ctx.say(f"operator paused (scaled to 0 by {holder}; will restore to {restore_to})")
    wait_for(lambda: (pause_state(ctx)["ready"] == 0, f"ready {pause_state(ctx)['ready']}"),
             timeout_s=ctx.timeouts.pods_s, poll_s=min(poll_seconds(), 0.5),
             what=f"[{ctx.cluster.name}] operator controller at 0", progress=ctx.progress)
    return restore_to


def restore(ctx: StageContext, holder: str | None = None, *, wait: bool = True) -> dict[str, Any]:
    """Scale the controller back and clear the pause annotations. A no-op when nobody (or someone else, if
    ``holder`` is given) paused it. Waits until the controller is Ready again."""
    state = pause_state(ctx)
    if not state["paused_by"]:
        return {"restored": False, "reason": "not paused by kvfleet", **state}
    if holder is not None and state["paused_by"] != holder:
        return {"restored": False, "reason": f"paused by {state['paused_by']}, not {holder}", **state}
    replicas = int(state["restore_to"] or 1)
    call(ctx.kube.apps.patch_namespaced_deployment, C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE,
         {"metadata": {"annotations": {C.PAUSED_BY_ANNOTATION: None, C.PAUSED_AT_ANNOTATION: None,
                                       C.PAUSED_REPLICAS_ANNOTATION: None}},
          "spec": {"replicas": replicas}}, what="restore the inference operator")
    started = time.monotonic()
    if wait:
        wait_for(lambda: (pause_state(ctx)["ready"] >= 1, f"ready {pause_state(ctx)['ready']}"),
                 timeout_s=ctx.timeouts.pods_s, poll_s=min(poll_seconds(), 0.5),
                 what=f"[{ctx.cluster.name}] operator controller restored", progress=ctx.progress)
    ctx.say(f"operator restored to {replicas} replica(s) ({time.monotonic() - started:.1f}s)")
    return {"restored": True, "replicas": replicas, "was_paused_by": state["paused_by"]}
