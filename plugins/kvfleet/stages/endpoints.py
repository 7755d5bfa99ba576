"""Stage 4: deploy endpoints with the tiered KV cache, one (cluster, wave) at a time.

1. Apply each endpoint's InferenceEndpointConfig **while the operator runs** (its conversion webhook is served
   by the controller), refusing changes to immutable fields; wait for the rendered Deployment and
   ``DeploymentComplete``.
2. Put the L2 overlay on the rendered Deployments:
   - ``patch`` mode — batched per wave because the operator is one controller per cluster: pause the operator
     once, change every Deployment of the wave with its update strategy (chosen by
     ``fleet.plan.choose_strategy`` on the live GPU room):
       * ``rolling`` (2+ replicas): strategy maxSurge 0 / maxUnavailable 1 -> the JSON patch -> the Deployment
         controller replaces the pods one at a time, N-1 keep serving -> the original strategy back;
       * ``surge`` (a spare GPU): maxSurge 1 / maxUnavailable 0, all N keep serving;
       * ``scale-to-zero`` (the blog's sequence): scale to 0 -> the patch -> scale back;
     then verify the rendered objects, wait until every pod is Ready with the new env, and only then restore
     the operator (it re-renders a Deployment that is not fully available). Every patch is computed and
     checked (server dry run) before the pause: an endpoint without a valid patch, or whose asked strategy is
     unsafe here (rolling with one replica, surge without a spare GPU), is refused and never touched. The
     pause is inside the protected region; on any failure inside it every endpoint is put back (recorded
     replicas, original strategy) BEFORE the operator is restored. The restore runs in ``finally`` here and
     again as an Airflow teardown (another process, after a crash), and the drift check restores an operator
     whose pauser died (``stages.drift``);
   - ``kyverno`` mode — ensure the ClusterPolicy, make the operator re-render (a restart annotation starts a
     rollout; a Deployment that is not fully available is re-rendered, through admission), then verify the
     injection is there *after* the re-render. No operator pause is needed in this mode.
3. Check the Deployment and every running pod against the desired-state rules (``fleet.endpoint_spec``).
Nothing is touched on an endpoint that already satisfies every rule: a second run makes no mutating call.

Every change is a typed action (``fleet.actions``) computed here and applied by ``stages.executor``, which
renders the same list in a dry run (`kvfleet plan --diff`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import yaml

from kvfleet.clients.kube import call, get_or_none, wait_for
from kvfleet.errors import PermanentError
from kvfleet.fleet import constants as C
from kvfleet.fleet import hardware
from kvfleet.fleet.actions import (
    ORIGINAL_STRATEGY_ANNOTATION,
    Action,
    ApplyClusterPolicy,
    ApplyEndpointConfig,
    PatchDeployment,
    RerenderDeployment,
    Scale,
    SetRolloutStrategy,
    WaitPods,
    WaveItem,
    canonical,
    patch_wave_actions,
    strategy_repair_actions,
)
from kvfleet.fleet.endpoint_spec import (
    cr_differences,
    immutable_changes,
    kyverno_policy,
    l2_patch,
    l2_violations,
    overlay_violations,
    pod_is_live,
    render_iec,
)
from kvfleet.fleet.inventory import Endpoint
from kvfleet.fleet.plan import DEFAULT_STRATEGY, ROLLING, SURGE, StrategyChoice, choose_wave_strategies
from kvfleet.stages import executor, operator_pause
from kvfleet.stages.base import Outcome, StageContext

STAGE = "endpoint"


def _yaml_diff(before: Any, after: Any, name: str) -> str:
    a = yaml.safe_dump(before, sort_keys=True).splitlines(keepends=True) if before is not None else []
    b = yaml.safe_dump(after, sort_keys=True).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"live/{name}", f"desired/{name}"))


def _get_iec(ctx: StageContext, ep: Endpoint) -> dict[str, Any] | None:
    return get_or_none(ctx.kube.custom.get_namespaced_custom_object, C.IEC_GROUP, C.IEC_VERSION, ep.namespace,
                       C.IEC_PLURAL, ep.name)


def iec_action(ctx: StageContext, ep: Endpoint) -> ApplyEndpointConfig | None:
    """The create or update of an endpoint's CR, or None when it already matches. Refuses (PermanentError)
    a change to an immutable field: the operator rejects it on an existing endpoint."""
    desired = render_iec(ep, ctx.inventory.settings)
    live = _get_iec(ctx, ep)
    if live is not None:
        refused = immutable_changes(live.get("spec") or {}, desired["spec"])
        if refused:
            raise PermanentError(f"{ep.ref}: refused, immutable field(s) would change: {'; '.join(refused)}. The "
                                 "operator rejects this on an existing endpoint: delete and recreate the endpoint "
                                 "deliberately, or revert the inventory.")
        diffs = cr_differences(live.get("spec") or {}, desired["spec"])
        labels_ok = all((live["metadata"].get("labels") or {}).get(k) == v
                        for k, v in desired["metadata"]["labels"].items())
        if not diffs and labels_ok:
            return None
    before = {"metadata": {"labels": (live or {}).get("metadata", {}).get("labels")},
              "spec": (live or {}).get("spec")} if live else None
    patch = {"metadata": {"labels": desired["metadata"]["labels"]}, "spec": desired["spec"]}
    return ApplyEndpointConfig(ep.ref, ep.namespace, ep.name, live is None, canonical(desired if live is None
                                                                                       else patch),
                               diff=_yaml_diff(before, patch, ep.name))


def apply_iec(ctx: StageContext, ep: Endpoint) -> str:
    """Create or update the CR. Returns changed | unchanged | planned; refuses immutable changes."""
    action = iec_action(ctx, ep)
    if action is None:
        return "unchanged"
    executor.run(ctx, STAGE, [action])
    return "planned" if ctx.dry_run else "changed"


def wait_complete(ctx: StageContext, eps: list[Endpoint]) -> None:
    def check() -> tuple[bool, str]:
        states = []
        for ep in eps:
            iec = _get_iec(ctx, ep)
            dep = get_or_none(ctx.kube.apps.read_namespaced_deployment, ep.name, ep.namespace)
            state = ((iec or {}).get("status") or {}).get("state", "none")
            states.append((ep.name, state, dep is not None))
        pending = [f"{n}={s}" + ("" if d else "(no Deployment)") for n, s, d in states
                   if s != "DeploymentComplete" or not d]
        failed = [n for n, s, _ in states if s == "DeploymentFailed"]
        if failed:
            raise PermanentError(f"operator reports DeploymentFailed for {', '.join(failed)} on {ctx.cluster.name}")
        return not pending, "all DeploymentComplete" if not pending else "waiting: " + ", ".join(pending)

    wait_for(check, timeout_s=ctx.timeouts.pods_s, poll_s=min(ctx.poll_s, 1.0),
             what=f"[{ctx.cluster.name}] rendered Deployments", progress=ctx.progress)


def _deployment(ctx: StageContext, ep: Endpoint) -> dict[str, Any]:
    dep = executor.read_deployment(ctx, ep.namespace, ep.name)
    if dep is None:
        raise PermanentError(f"{ep.ref}: no Deployment {ep.key} rendered by the operator; never patching a "
                             "Deployment without its InferenceEndpointConfig")
    return dep


def _pods(ctx: StageContext, ep: Endpoint) -> list[dict[str, Any]]:
    return executor.list_pods(ctx, ep.namespace, ep.name)


def endpoint_violations(ctx: StageContext, ep: Endpoint, dep: dict[str, Any] | None = None,
                        pods: list[dict[str, Any]] | None = None) -> list[str]:
    """Desired-state rules on the Deployment template and on every running pod."""
    if not ep.l2:
        return []
    dep = dep or _deployment(ctx, ep)
    out = [f"deployment: {v.text()}" for v in l2_violations(dep["spec"]["template"]["spec"], ep.name,
                                                             ctx.inventory.settings)]
    for pod in pods if pods is not None else _pods(ctx, ep):
        if not pod_is_live(pod):
            continue
        out += [f"pod {pod['metadata']['name']}: {v.text()}"
                for v in l2_violations(pod["spec"], ep.name, ctx.inventory.settings)]
    return out


def _needs_overlay(ctx: StageContext, ep: Endpoint) -> bool:
    """The Deployment template, or a running pod, lacks the L2 overlay (a pod created before the patch counts)."""
    dep = _deployment(ctx, ep)
    if overlay_violations(dep["spec"]["template"]["spec"], ep.name, ctx.inventory.settings):
        return True
    return any(overlay_violations(p["spec"], ep.name, ctx.inventory.settings) for p in _pods(ctx, ep)
               if pod_is_live(p))


def _validated_patches(ctx: StageContext, eps: list[Endpoint]) -> tuple[dict[str, list[dict[str, Any]]],
                                                                          dict[str, str]]:
    """Compute every endpoint's patch and check it BEFORE anything is paused or scaled: a server-side dry run
    of the patch must give a Deployment with the overlay. Returns (patches, refused: key -> reason). An
    endpoint whose violations have no patch (empty) or whose patch would not fix them is refused, untouched."""
    patches: dict[str, list[dict[str, Any]]] = {}
    refused: dict[str, str] = {}
    for ep in eps:
        patch = l2_patch(_deployment(ctx, ep), ctx.inventory.settings)
        if not patch:
            refused[ep.key] = ("the L2 overlay is missing (on the Deployment or its pods) but the patch is empty: "
                               "nothing to patch, so nothing is scaled down. Pods older than the template: "
                               f"kubectl rollout restart deployment {ep.name} -n {ep.namespace}")
            continue
        if ctx.dry_run:
            patches[ep.key] = patch
            continue
        try:
            tried = call(ctx.kube.apps.patch_namespaced_deployment, ep.name, ep.namespace, patch, dry_run="All",
                         what=f"check the patch of {ep.key} (server dry run)")
        except PermanentError as exc:
            refused[ep.key] = f"the L2 patch is invalid (server dry run refused it): {exc}"
            continue
        spec = ctx.kube.api_client.sanitize_for_serialization(tried)["spec"]["template"]["spec"]
        bad = [v.text() for v in overlay_violations(spec, ep.name, ctx.inventory.settings)]
        if bad:
            refused[ep.key] = f"the L2 patch would not fix the Deployment: {'; '.join(bad)}"
            continue
        patches[ep.key] = patch
    return patches, refused


def live_spare_gpus(ctx: StageContext) -> int:
    """GPUs the scheduler could still place a pod on: every Ready, schedulable node's allocatable GPUs minus what
    its pods request, less what Pending pods are waiting for (one LIST of nodes, one of pods)."""
    nodes = [ctx.kube.api_client.sanitize_for_serialization(n)
             for n in call(ctx.kube.core.list_node, what="list nodes (GPU room)").items]
    pods = [ctx.kube.api_client.sanitize_for_serialization(p)
            for p in call(ctx.kube.core.list_pod_for_all_namespaces, what="list pods (GPU room)").items]
    return hardware.spare_gpus(nodes, pods, ctx.cluster.gpu_nodes.instance_type)


def _wave_items(ctx: StageContext, eps: list[Endpoint], patches: dict[str, list[dict[str, Any]]]
                ) -> tuple[list[WaveItem], dict[str, StrategyChoice], dict[str, str]]:
    """Observe each endpoint's Deployment (replicas, strategy) and choose its update strategy on the live GPU
    room. Returns (items, choices, refused: key -> reason); a refused endpoint is left untouched."""
    deps = {ep.key: _deployment(ctx, ep) for ep in eps}
    replicas = {ep.key: int(deps[ep.key]["spec"].get("replicas") or 0) for ep in eps}
    asked = []
    for ep in eps:
        strategy, where = ctx.inventory.update_strategy(ep)
        asked.append((ep.key, strategy, replicas[ep.key], where))
    # One LIST of nodes and one of pods, only when a choice depends on the GPU room.
    spare = live_spare_gpus(ctx) if any(a[1] in ("auto", "surge") for a in asked) else 0
    choices = choose_wave_strategies(asked, spare)
    items: list[WaveItem] = []
    refused: dict[str, str] = {}
    for ep in eps:
        choice = choices[ep.key]
        if choice.refused:
            refused[ep.key] = f"update strategy {choice.strategy}: {choice.refused}"
            continue
        temporary = {"rolling": ROLLING, "surge": SURGE}.get(choice.strategy)
        items.append(WaveItem(ep.ref, ep.namespace, ep.name, replicas[ep.key], choice.strategy,
                              canonical(patches[ep.key]),
                              canonical(deps[ep.key]["spec"].get("strategy") or DEFAULT_STRATEGY),
                              canonical(temporary) if temporary else None,
                              annotations_exist=bool(deps[ep.key]["metadata"].get("annotations"))))
        ctx.say(f"stage 4: {ep.key}: {choice.strategy} — {choice.reason}")
    return items, choices, refused


def _recover(ctx: StageContext, items: list[WaveItem], states: dict[str, str]) -> dict[str, str]:
    """After a failure inside the pause: every scale-to-zero endpoint scaled down goes back to its recorded
    replicas, every rolling/surge endpoint gets its original strategy back — all before the operator is
    restored. Returns each endpoint's result; never raises (the others still get theirs)."""
    out: dict[str, str] = {}
    for i in items:
        if i.strategy == "scale-to-zero" and states.get(i.key) in ("scaled_to_0", "patched"):
            undo: Action = Scale(i.endpoint, i.namespace, i.name, i.replicas)
            done, failed = f"scaled back to {i.replicas}", f"STILL AT 0: scale back to {i.replicas} failed"
        elif i.strategy != "scale-to-zero" and states.get(i.key) in ("strategy_set", "patched", "ready"):
            undo = SetRolloutStrategy(i.endpoint, i.namespace, i.name, i.original_strategy or "{}", restore=True)
            done, failed = "original strategy back", "strategy not restored"
        else:
            continue
        try:
            executor.run(ctx, STAGE, [undo])
            out[i.key] = done
        except Exception as exc:
            out[i.key] = f"{failed}: {str(exc)[:200]}"
            ctx.say(f"{failed.upper()} for {i.key}: {exc}")
    return out


def _progress(states: dict[str, str]) -> Callable[[Action], None]:
    """Follow a wave's actions into each endpoint's state (what ``_recover`` must undo)."""
    def done(a: Action) -> None:
        if isinstance(a, Scale):
            states[f"{a.namespace}/{a.name}"] = "scaled_to_0" if a.replicas == 0 else "scaled_back"
        elif isinstance(a, SetRolloutStrategy):
            states[f"{a.namespace}/{a.name}"] = "strategy_restored" if a.restore else "strategy_set"
        elif isinstance(a, PatchDeployment):
            states[f"{a.namespace}/{a.name}"] = "patched"
        elif isinstance(a, WaitPods) and a.new_env:
            states.update({key: "ready" for key, _ in a.want})
    return done


def patch_wave(ctx: StageContext, eps: list[Endpoint], holder: str) -> dict[str, Any]:
    """The patch sequence, batched: one operator pause for the whole wave, restore guaranteed.

    Every patch is computed and checked before the pause, and every endpoint's update strategy chosen; an
    endpoint without a valid patch, or whose asked strategy is unsafe here, is refused and never touched. The
    pause runs inside the protected region (a temporary error while pausing still restores). On any failure
    inside it, scale-to-zero endpoints go back to their recorded replicas and rolling/surge ones get their
    original strategy BEFORE the operator restore. The dry run renders the very same action list."""
    patches, refused = _validated_patches(ctx, eps)
    items, choices, unsafe = _wave_items(ctx, [ep for ep in eps if ep.key in patches], patches)
    refused.update(unsafe)
    strategies = {k: c.as_dict() for k, c in choices.items()}
    actions = patch_wave_actions(operator_pause.controller_name(ctx), holder, items)
    if ctx.dry_run:
        executor.run(ctx, STAGE, actions)
        return {"planned": [i.key for i in items], "refused": refused, "strategies": strategies}
    states: dict[str, str] = {i.key: "pending" for i in items}

    def put_back(exc: BaseException) -> None:
        recovered = _recover(ctx, items, states)
        ctx.record(f"wave_state:{holder}", "endpoint", "failed", states=states,
                   replicas={i.key: i.replicas for i in items}, scaled_back=recovered,
                   strategies={i.key: i.strategy for i in items}, error=str(exc)[:500])

    _run_paused(ctx, actions, holder, on_done=_progress(states), on_failure=put_back)
    return {"states": states, "refused": refused, "strategies": strategies}


def ensure_kyverno_policy(ctx: StageContext) -> str:
    desired = kyverno_policy(ctx.inventory.settings)
    name = desired["metadata"]["name"]
    live = get_or_none(ctx.kube.custom.get_cluster_custom_object, "kyverno.io", "v1", "clusterpolicies", name)
    if live is None:  # the bootstrap bundle creates it: kvfleet may only get and patch it
        from kvfleet.fleet.bootstrap_bundle import missing_policy

        raise PermanentError(missing_policy(ctx.inventory.source, ctx.cluster.name, name))
    if live.get("spec") == desired["spec"]:
        return "unchanged"
    executor.run(ctx, STAGE, [ApplyClusterPolicy(name, canonical(desired),
                                                 diff=_yaml_diff(live.get("spec"), desired["spec"], name))])
    return "planned" if ctx.dry_run else "changed"


def kyverno_wave(ctx: StageContext, eps: list[Endpoint]) -> dict[str, Any]:
    """Make the operator re-render each Deployment that lacks the injection, then verify it after the re-render
    (no operator pause: the operator's own strategy rolls the pods)."""
    actions: list[Action] = [RerenderDeployment(ep.ref, ep.namespace, ep.name) for ep in eps]
    actions.append(WaitPods(tuple((ep.key, ep.replicas) for ep in eps), new_env=True))
    executor.run(ctx, STAGE, actions)
    return {"planned" if ctx.dry_run else "rerendered": [ep.key for ep in eps]}


def _refuse(ctx: StageContext, eps: list[Endpoint], reasons: dict[str, str]) -> list[Outcome]:
    out = []
    for ep in eps:
        ctx.say(f"REFUSED {ep.ref}: {reasons[ep.key]}")
        out.append(ctx.record(f"endpoint:{ep.key}", STAGE, "refused", endpoint=ep.key, lob=ep.lob,
                              reason=reasons[ep.key]))
    return out


def _apply_crs(ctx: StageContext, eps: list[Endpoint]) -> tuple[dict[str, str], list[Outcome]]:
    results: dict[str, str] = {}
    outcomes: list[Outcome] = []
    for ep in eps:
        try:
            results[ep.key] = apply_iec(ctx, ep)
        except PermanentError as exc:
            outcomes.append(ctx.record(f"endpoint:{ep.key}", STAGE, "refused", endpoint=ep.key, lob=ep.lob,
                                       reason=str(exc)))
            ctx.say(f"REFUSED {ep.ref}: {exc}")
    return results, outcomes


def _put_overlay(ctx: StageContext, ready_eps: list[Endpoint], needs: list[Endpoint], holder: str) -> dict[str, Any]:
    if needs and ctx.cluster.l2_injection == "kyverno":
        return {"policy": ensure_kyverno_policy(ctx), **kyverno_wave(ctx, needs)}
    if needs:
        return patch_wave(ctx, needs, holder)
    if ctx.cluster.l2_injection == "kyverno" and any(ep.l2 for ep in ready_eps):
        return {"policy": ensure_kyverno_policy(ctx)}
    return {}


def _judge(ctx: StageContext, ep: Endpoint, cr: str, overlaid: bool, overlay: dict[str, Any]) -> Outcome:
    moved = cr in ("changed", "planned") or overlaid
    remaining = [] if ctx.dry_run else endpoint_violations(ctx, ep)
    if remaining:
        # Recorded, not raised: the wave's gate turns a failed endpoint into "stop this cluster's later
        # waves", and the other endpoints of the wave keep their outcome.
        ctx.say(f"FAILED {ep.ref}: desired state not reached: {'; '.join(remaining)}")
        return ctx.record(f"endpoint:{ep.key}", STAGE, "failed", endpoint=ep.key, lob=ep.lob, violations=remaining)
    detail: dict[str, Any] = {"cr": cr, "overlay": ctx.cluster.l2_injection if overlaid else None}
    strategy = (overlay.get("strategies") or {}).get(ep.key)
    if strategy is not None:
        detail["update_strategy"] = strategy
    if ctx.dry_run and cr == "planned" and ep.l2 and not overlaid:
        detail["note"] = (f"then the L2 overlay ({ctx.cluster.l2_injection} mode), computed once the operator has "
                          "rendered the Deployment")
    outcome = "planned" if ctx.dry_run and moved else "changed" if moved else "unchanged"
    return ctx.record(f"endpoint:{ep.key}", STAGE, outcome, endpoint=ep.key, lob=ep.lob, **detail)


def leftover_strategies(ctx: StageContext, eps: list[Endpoint], holder: str) -> list[Action]:
    """A run killed inside a rolling/surge wave leaves its temporary strategy on the Deployment, with the
    original recorded next to it (``ORIGINAL_STRATEGY_ANNOTATION``). Called with the cluster's lease held and the
    operator running, so no wave is in progress: the actions that put the originals back (in a pause)."""
    left = []
    for ep in eps:
        dep = executor.read_deployment(ctx, ep.namespace, ep.name)
        original = ((dep or {}).get("metadata", {}).get("annotations") or {}).get(ORIGINAL_STRATEGY_ANNOTATION)
        if dep is not None and original:
            left.append((SetRolloutStrategy(ep.ref, ep.namespace, ep.name, str(original), restore=True),
                         int(dep["spec"].get("replicas") or 0)))
    return strategy_repair_actions(operator_pause.controller_name(ctx), holder, left)


def _run_paused(ctx: StageContext, actions: list[Action], holder: str,
                on_done: Callable[[Action], None] | None = None,
                on_failure: Callable[[BaseException], None] | None = None) -> None:
    """Apply a sequence that starts with PauseOperator and ends with RestoreOperator: the restore runs whatever
    happens, after ``on_failure`` has put the endpoints back."""
    if ctx.dry_run or not actions:
        executor.run(ctx, STAGE, actions)
        return
    try:
        executor.run(ctx, STAGE, actions[:-1], on_done=on_done)
    except BaseException as exc:
        if on_failure is not None:
            on_failure(exc)
        raise
    finally:
        executor.run(ctx, STAGE, actions[-1:])  # RestoreOperator, always last


def reconcile_wave(ctx: StageContext, eps: list[Endpoint], *, holder: str) -> list[Outcome]:
    operator_pause.require_running(ctx)
    _run_paused(ctx, leftover_strategies(ctx, eps, holder), holder)
    results, outcomes = _apply_crs(ctx, eps)
    live_eps = [ep for ep in eps if ep.key in results]
    # In a dry run a CR still to be created has no Deployment yet: nothing to observe for the overlay.
    ready_eps = [ep for ep in live_eps if not (ctx.dry_run and results[ep.key] == "planned"
                                               and _get_iec(ctx, ep) is None)]
    if not ctx.dry_run:
        wait_complete(ctx, live_eps)
    needs = [ep for ep in ready_eps if ep.l2 and _needs_overlay(ctx, ep)]
    overlay = _put_overlay(ctx, ready_eps, needs, holder)
    unpatched: dict[str, str] = dict(overlay.get("refused") or {})
    outcomes += _refuse(ctx, [ep for ep in live_eps if ep.key in unpatched], unpatched)
    outcomes += [_judge(ctx, ep, results[ep.key], ep in needs, overlay)
                 for ep in live_eps if ep.key not in unpatched]
    return outcomes
