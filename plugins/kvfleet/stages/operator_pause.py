"""Pausing and restoring the HyperPod Inference Operator — the one cluster-wide, availability-critical lever of
stage 4's `patch` mode.

The operator's reconcile loop overwrites direct Deployment patches, so the blog's safe sequence scales its
controller to 0 first and restores it only after the patched pods are Ready. Whoever pauses records it on the
controller Deployment itself (annotations: who, when, the replica count to restore), so that:
- ``restore`` is idempotent and can run from a teardown task in another process after a crash;
- the drift check can flag an operator left paused, and by whom, and restore it when the pauser is dead;
- a pause by someone else is never silently undone by kvfleet;
- a pause by the same run (a retried task: the holder is the run key, never the task try) is recognised as its
  own and carried on, not refused.

The controller is found wherever it is installed (docs/reference/hyperpod.md#inference-operator-controller): the EKS
add-on names it ``hyperpod-inference-controller-manager``, the Helm chart
``hyperpod-inference-operator-controller-manager`` (both in ``hyperpod-inference-system``). Lookup: one LIST of that
namespace, then either name, else the chart's labels (``control-plane`` = either name, or
``app.kubernetes.io/name=hyperpod-inference-operator``); the name found is remembered for the context.

A wave's pause and restore are typed actions (``fleet.actions.PauseOperator``/``RestoreOperator``, built by
:func:`pause_action`/:func:`restore_action`) that ``stages.executor`` applies through :func:`apply_pause` and
:func:`restore`, or renders in a dry run.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from kvfleet.clients.kube import StopRequested, call, get_or_none, stop_requested, wait_for
from kvfleet.errors import GateRefused, PermanentError
from kvfleet.fleet import constants as C
from kvfleet.fleet.actions import PauseOperator, RestoreOperator
from kvfleet.history.leases import run_key_of
from kvfleet.stages.base import StageContext

_MEMO = "operator_deployment"


def find_controller(kube: Any) -> tuple[str, Any] | None:
    """(name, Deployment) of the operator's controller on this cluster, or None. One LIST of the operator's
    namespace (kvfleet's RBAC lists Deployments cluster-wide; a GET of a name it is not granted would be a 403),
    then: a known name (add-on first, then Helm), else the chart's labels, so an add-on install, a Helm install
    or a renamed install are all found."""
    items = call(kube.apps.list_namespaced_deployment, C.OPERATOR_NAMESPACE,
                 what="find the inference operator's controller").items
    by_name = {str(d.metadata.name): d for d in items}
    for name in C.OPERATOR_DEPLOYMENTS:
        if name in by_name:
            return name, by_name[name]
    for dep in items:
        labels = dep.metadata.labels or {}
        if labels.get(C.OPERATOR_CONTROL_PLANE_LABEL) in C.OPERATOR_DEPLOYMENTS or \
                labels.get(C.OPERATOR_NAME_LABEL) == C.OPERATOR_NAME_VALUE:
            return str(dep.metadata.name), dep
    return None


def controller_name(ctx: StageContext) -> str:
    """The controller Deployment's name on this cluster (the add-on's name when none is installed yet)."""
    if _MEMO not in ctx.memo:
        _controller(ctx)
    return str(ctx.memo.get(_MEMO, C.OPERATOR_DEPLOYMENT))


def _controller(ctx: StageContext) -> Any:
    name = ctx.memo.get(_MEMO)
    dep = get_or_none(ctx.kube.apps.read_namespaced_deployment, name, C.OPERATOR_NAMESPACE) if name else None
    if dep is None:
        found = find_controller(ctx.kube)
        if found is None:
            raise PermanentError(f"operator controller not found in {C.OPERATOR_NAMESPACE} on {ctx.cluster.name} "
                                 f"(looked for {' and '.join(C.OPERATOR_DEPLOYMENTS)} and the chart's labels): "
                                 "run stage 2 (operator add-ons) first")
        ctx.memo[_MEMO], dep = found
    return dep


def scale_hint(ctx: StageContext, replicas: int = 1) -> str:
    return f"kubectl scale deployment {controller_name(ctx)} -n {C.OPERATOR_NAMESPACE} --replicas={replicas}"


def pause_state(ctx: StageContext) -> dict[str, Any]:
    dep = _controller(ctx)
    ann = dep.metadata.annotations or {}
    return {"name": dep.metadata.name, "replicas": dep.spec.replicas or 0,
            "ready": getattr(dep.status, "ready_replicas", None) or 0,
            "paused_by": ann.get(C.PAUSED_BY_ANNOTATION), "paused_at": ann.get(C.PAUSED_AT_ANNOTATION),
            "restore_to": ann.get(C.PAUSED_REPLICAS_ANNOTATION)}


def same_run(a: str | None, b: str | None) -> bool:
    """Two holders act for the same run (``dag/run`` and ``dag/run#suffix``)."""
    return bool(a) and bool(b) and run_key_of(str(a)) == run_key_of(str(b))


def require_running(ctx: StageContext) -> None:
    """Custom resources are applied while the operator runs: its conversion webhook is served by the controller."""
    state = pause_state(ctx)
    if state["ready"] < 1:
        who = f" (paused by {state['paused_by']} at {state['paused_at']})" if state["paused_by"] else ""
        raise GateRefused(f"the inference operator on {ctx.cluster.name} has no ready replica{who}; its conversion "
                          "webhook is down, so InferenceEndpointConfigs cannot be applied. Restore it first "
                          f"({scale_hint(ctx)}).")


def pause_action(ctx: StageContext, holder: str) -> PauseOperator:
    """The pause a wave needs (applied by ``stages.executor``, which calls :func:`apply_pause`)."""
    return PauseOperator(controller_name(ctx), holder)


def restore_action(ctx: StageContext, holder: str) -> RestoreOperator:
    """The restore that ends a wave's pause (applied by ``stages.executor``, which calls :func:`restore`)."""
    return RestoreOperator(controller_name(ctx), holder)


def pause(ctx: StageContext, holder: str) -> int:
    """Pause now (outside a stage's action list). Returns the replica count to restore."""
    return apply_pause(ctx, pause_action(ctx, holder))


def apply_pause(ctx: StageContext, action: PauseOperator) -> int:
    """Scale the controller to 0, recording who and when. Returns the replica count to restore. A pause already
    made by the same run (a retry after a temporary error) is carried on; another holder's pause is refused."""
    holder = action.holder
    state = pause_state(ctx)
    if state["paused_by"] and not same_run(state["paused_by"], holder):
        raise GateRefused(f"the inference operator on {ctx.cluster.name} is already paused by {state['paused_by']} "
                          f"since {state['paused_at']}; refusing to take over another holder's pause")
    if state["paused_by"]:
        ctx.say(f"operator already paused by this run ({state['paused_by']} since {state['paused_at']}): "
                "carrying on with that pause")
    restore_to = int(state["restore_to"] or state["replicas"] or 1)
    now = state["paused_at"] or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with ctx.write_ahead(action.kind, f"Deployment {C.OPERATOR_NAMESPACE}/{state['name']} by {holder}"):
        call(ctx.kube.apps.patch_namespaced_deployment, state["name"], C.OPERATOR_NAMESPACE,
             {"metadata": {"annotations": {C.PAUSED_BY_ANNOTATION: state["paused_by"] or holder,
                                           C.PAUSED_AT_ANNOTATION: now,
                                           C.PAUSED_REPLICAS_ANNOTATION: str(restore_to)}},
              "spec": {"replicas": 0}}, what="pause the inference operator")
    ctx.say(f"operator paused (scaled to 0 by {holder}; will restore to {restore_to})")
    wait_for(lambda: (pause_state(ctx)["ready"] == 0, f"ready {pause_state(ctx)['ready']}"),
             timeout_s=ctx.timeouts.pods_s, poll_s=min(ctx.poll_s, 0.5),
             what=f"[{ctx.cluster.name}] operator controller at 0", progress=ctx.progress)
    return restore_to


def restore(ctx: StageContext, holder: str | None = None, *, wait: bool = True) -> dict[str, Any]:
    """Scale the controller back and clear the pause annotations. A no-op when nobody (or another run, if
    ``holder`` is given) paused it. Waits until the controller is Ready again."""
    state = pause_state(ctx)
    if not state["paused_by"]:
        return {"restored": False, "reason": "not paused by kvfleet", **state}
    if holder is not None and not same_run(state["paused_by"], holder):
        return {"restored": False, "reason": f"paused by {state['paused_by']}, not {holder}", **state}
    replicas = int(state["restore_to"] or 1)
    with ctx.write_ahead(RestoreOperator.kind, f"Deployment {C.OPERATOR_NAMESPACE}/{state['name']} paused by "
                         f"{state['paused_by']} to {replicas}"):
        call(ctx.kube.apps.patch_namespaced_deployment, state["name"], C.OPERATOR_NAMESPACE,
             {"metadata": {"annotations": {C.PAUSED_BY_ANNOTATION: None, C.PAUSED_AT_ANNOTATION: None,
                                           C.PAUSED_REPLICAS_ANNOTATION: None}},
              "spec": {"replicas": replicas}}, what="restore the inference operator")
    started = time.monotonic()
    # After a stop (SIGTERM) the restore's PATCH still goes through (``stages.base.AFTER_STOP_KINDS``), but its
    # wait does not hold the task (Airflow's SIGKILL follows): the restore is made, the controller comes back by
    # itself, and the result says its readiness was not seen.
    awaited = wait and not stop_requested()
    if awaited:
        try:
            wait_for(lambda: (pause_state(ctx)["ready"] >= 1, f"ready {pause_state(ctx)['ready']}"),
                     timeout_s=ctx.timeouts.pods_s, poll_s=min(ctx.poll_s, 0.5),
                     what=f"[{ctx.cluster.name}] operator controller restored", progress=ctx.progress)
        except StopRequested:
            awaited = False
    out = {"restored": True, "replicas": replicas, "was_paused_by": state["paused_by"],
           "paused_at": state["paused_at"]}
    if wait and not awaited:
        out["ready_awaited"] = False
        ctx.say(f"operator restored to {replicas} replica(s); not waiting for it to be Ready (a stop was requested)")
    else:
        ctx.say(f"operator restored to {replicas} replica(s) ({time.monotonic() - started:.1f}s)")
    return out
