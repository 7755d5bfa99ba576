"""Stage 4: deploy endpoints with the tiered KV cache, one (cluster, wave) at a time.

1. Apply each endpoint's InferenceEndpointConfig **while the operator runs** (its conversion webhook is served
   by the controller), refusing changes to immutable fields; wait for the rendered Deployment and
   ``DeploymentComplete``.
2. Put the L2 overlay on the rendered Deployments:
   - ``patch`` mode — the blog's safe sequence, batched per wave because the operator is one controller per
     cluster: pause the operator once -> scale the wave's Deployments to 0 -> one JSON patch each -> verify the
     rendered objects -> scale back -> wait until every pod is Ready with the new env -> restore the operator.
     Every patch is computed and checked (server dry run) before the pause: an endpoint without a valid patch
     is refused and never scaled down. The pause is inside the protected region; on any failure after a
     scale-down every endpoint is scaled back to its recorded replicas BEFORE the operator is restored. The
     restore runs in ``finally`` here and again as an Airflow teardown (another process, after a crash), and
     the drift check restores an operator whose pauser died (``stages.drift``);
   - ``kyverno`` mode — ensure the ClusterPolicy, make the operator re-render (a restart annotation starts a
     rollout; a Deployment that is not fully available is re-rendered, through admission), then verify the
     injection is there *after* the re-render. No operator pause is needed in this mode.
3. Check the Deployment and every running pod against the desired-state rules (``fleet.endpoint_spec``).
Nothing is touched on an endpoint that already satisfies every rule: a second run makes no mutating call.
"""

from __future__ import annotations

import difflib
import json
from datetime import UTC, datetime
from typing import Any

import yaml

from kvfleet.clients.kube import call, get_or_none, wait_for
from kvfleet.errors import PermanentError
from kvfleet.fleet import constants as C
from kvfleet.fleet.endpoint_spec import (
    cr_differences,
    immutable_changes,
    kyverno_policy,
    l2_patch,
    l2_violations,
    overlay_violations,
    render_iec,
)
from kvfleet.fleet.inventory import Endpoint
from kvfleet.stages import operator_pause
from kvfleet.stages.base import Outcome, StageContext, poll_seconds

STAGE = "endpoint"


def _yaml_diff(before: Any, after: Any, name: str) -> str:
    a = yaml.safe_dump(before, sort_keys=True).splitlines(keepends=True) if before is not None else []
    b = yaml.safe_dump(after, sort_keys=True).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"live/{name}", f"desired/{name}"))


def _get_iec(ctx: StageContext, ep: Endpoint) -> dict[str, Any] | None:
    return get_or_none(ctx.kube.custom.get_namespaced_custom_object, C.IEC_GROUP, C.IEC_VERSION, ep.namespace,
                       C.IEC_PLURAL, ep.name)


def apply_iec(ctx: StageContext, ep: Endpoint) -> str:
    """Create or update the CR. Returns changed | unchanged | planned; refuses immutable changes."""
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
            return "unchanged"
    if ctx.dry_run:
        before = {"metadata": {"labels": (live or {}).get("metadata", {}).get("labels")},
                  "spec": (live or {}).get("spec")} if live else None
        ctx.plan(STAGE, f"{'update' if live else 'create'} InferenceEndpointConfig {ep.namespace}/{ep.name}",
                 endpoint=ep.ref, diff=_yaml_diff(before, {"metadata": {"labels": desired["metadata"]["labels"]},
                                                          "spec": desired["spec"]}, ep.name))
        return "planned"
    if get_or_none(ctx.kube.core.read_namespace, ep.namespace) is None:
        call(ctx.kube.core.create_namespace, {"metadata": {"name": ep.namespace, "labels": {
            C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE}}}, what=f"create namespace {ep.namespace}")
    if live is None:
        with ctx.write_ahead("create_iec", f"InferenceEndpointConfig {ep.key}", endpoint=ep.key):
            call(ctx.kube.custom.create_namespaced_custom_object, C.IEC_GROUP, C.IEC_VERSION, ep.namespace,
                 C.IEC_PLURAL, desired, what=f"create InferenceEndpointConfig {ep.key}")
    else:
        patch = {"metadata": {"labels": desired["metadata"]["labels"]}, "spec": desired["spec"]}
        with ctx.write_ahead("update_iec", f"InferenceEndpointConfig {ep.key}", endpoint=ep.key):
            call(ctx.kube.custom.patch_namespaced_custom_object, C.IEC_GROUP, C.IEC_VERSION, ep.namespace,
                 C.IEC_PLURAL, ep.name, patch, what=f"update InferenceEndpointConfig {ep.key}")
    ctx.say(f"stage 4: applied InferenceEndpointConfig {ep.key}")
    return "changed"


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

    wait_for(check, timeout_s=ctx.timeouts.pods_s, poll_s=min(poll_seconds(), 1.0),
             what=f"[{ctx.cluster.name}] rendered Deployments", progress=ctx.progress)


def _deployment(ctx: StageContext, ep: Endpoint) -> dict[str, Any]:
    dep = get_or_none(ctx.kube.apps.read_namespaced_deployment, ep.name, ep.namespace)
    if dep is None:
        raise PermanentError(f"{ep.ref}: no Deployment {ep.key} rendered by the operator; never patching a "
                             "Deployment without its InferenceEndpointConfig")
    return dict(ctx.kube.api_client.sanitize_for_serialization(dep))


def _pods(ctx: StageContext, ep: Endpoint) -> list[dict[str, Any]]:
    pods = call(ctx.kube.core.list_namespaced_pod, ep.namespace, label_selector=f"app={ep.name}",
                what=f"pods of {ep.key}").items
    return [ctx.kube.api_client.sanitize_for_serialization(p) for p in pods]


def endpoint_violations(ctx: StageContext, ep: Endpoint, dep: dict[str, Any] | None = None,
                        pods: list[dict[str, Any]] | None = None) -> list[str]:
    """Desired-state rules on the Deployment template and on every running pod."""
    if not ep.l2:
        return []
    dep = dep or _deployment(ctx, ep)
    out = [f"deployment: {v.text()}" for v in l2_violations(dep["spec"]["template"]["spec"], ep.name,
                                                             ctx.inventory.settings)]
    for pod in pods if pods is not None else _pods(ctx, ep):
        if (pod.get("status") or {}).get("phase") not in ("Running", "Pending"):
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
               if (p.get("status") or {}).get("phase") in ("Running", "Pending"))


def _scale(ctx: StageContext, ep: Endpoint, replicas: int) -> None:
    with ctx.write_ahead("scale_down" if replicas == 0 else "scale_up", f"Deployment {ep.key} replicas={replicas}",
                         endpoint=ep.key):
        call(ctx.kube.apps.patch_namespaced_deployment_scale, ep.name, ep.namespace,
             {"spec": {"replicas": replicas}}, what=f"scale {ep.key} to {replicas}")


def _wait_pods(ctx: StageContext, eps: list[Endpoint], want: dict[str, int], new_env: bool) -> None:
    def check() -> tuple[bool, str]:
        waiting = []
        for ep in eps:
            pods = [p for p in _pods(ctx, ep) if (p.get("status") or {}).get("phase") != "Succeeded"]
            ready = [p for p in pods if any(c.get("type") == "Ready" and c.get("status") == "True"
                                            for c in (p.get("status") or {}).get("conditions") or [])]
            good = [p for p in ready
                    if not new_env or not overlay_violations(p["spec"], ep.name, ctx.inventory.settings)]
            if len(pods) != want[ep.key] or len(good) != want[ep.key]:
                waiting.append(f"{ep.name} {len(good)}/{want[ep.key]} ready" + (" with new env" if new_env else "")
                               + (f" ({len(pods)} pods)" if len(pods) != want[ep.key] else ""))
        return not waiting, "; ".join(waiting) or "all pods in place"

    wait_for(check, timeout_s=ctx.timeouts.pods_s, poll_s=min(poll_seconds(), 1.0),
             what=f"[{ctx.cluster.name}] wave pods", progress=ctx.progress)


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


def _scale_back(ctx: StageContext, eps: list[Endpoint], replicas: dict[str, int],
                states: dict[str, str]) -> dict[str, str]:
    """After a failure past scale-down: every endpoint scaled down goes back to its recorded replicas (before
    the operator is restored). Returns each endpoint's result (``scaled back to N`` or the error); never raises."""
    out: dict[str, str] = {}
    for ep in eps:
        if states.get(ep.key) not in ("scaled_to_0", "patched"):
            continue
        try:
            _scale(ctx, ep, replicas[ep.key])
            out[ep.key] = f"scaled back to {replicas[ep.key]}"
        except Exception as exc:  # the others still get theirs
            out[ep.key] = f"STILL AT 0: scale back to {replicas[ep.key]} failed: {str(exc)[:200]}"
            ctx.say(f"ENDPOINT AT 0: could not scale {ep.key} back to {replicas[ep.key]}: {exc}")
    return out


def _plan_patch_wave(ctx: StageContext, eps: list[Endpoint], patches: dict[str, list[dict[str, Any]]],
                     replicas: dict[str, int], refused: dict[str, str]) -> dict[str, Any]:
    if not eps:
        return {"planned": [], "refused": refused}
    op = operator_pause.controller_name(ctx)
    ctx.plan(STAGE, f"kubectl scale deployment {op} -n {C.OPERATOR_NAMESPACE} --replicas=0")
    for ep in eps:
        ctx.plan(STAGE, f"kubectl scale deployment {ep.name} -n {ep.namespace} --replicas=0", endpoint=ep.ref)
        ctx.plan(STAGE, f"kubectl patch deployment {ep.name} -n {ep.namespace} --type=json -p "
                        f"'{json.dumps(patches[ep.key])}'", endpoint=ep.ref)
        ctx.plan(STAGE, f"kubectl scale deployment {ep.name} -n {ep.namespace} --replicas={replicas[ep.key]}",
                 endpoint=ep.ref)
    ctx.plan(STAGE, f"kubectl scale deployment {op} -n {C.OPERATOR_NAMESPACE} --replicas=1"
                    "   # only after every pod is Ready")
    return {"planned": [ep.key for ep in eps], "refused": refused}


def patch_wave(ctx: StageContext, eps: list[Endpoint], holder: str,
               fail_after_scale_down: bool = False) -> dict[str, Any]:
    """The safe sequence, batched: one operator pause for the whole wave, restore guaranteed.

    Every patch is computed and checked before the pause; an endpoint without a valid patch is refused and never
    scaled. The pause runs inside the protected region (a temporary error while pausing still restores). On any
    failure after a scale-down, every endpoint goes back to its recorded replicas BEFORE the operator restore."""
    patches, refused = _validated_patches(ctx, eps)
    eps = [ep for ep in eps if ep.key in patches]
    replicas = {ep.key: (_deployment(ctx, ep)["spec"].get("replicas") or ep.replicas) for ep in eps}
    if ctx.dry_run:
        return _plan_patch_wave(ctx, eps, patches, replicas, refused)
    states: dict[str, str] = {ep.key: "pending" for ep in eps}
    if not eps:
        return {"states": states, "refused": refused}
    try:
        operator_pause.pause(ctx, holder)
        ctx.record(f"operator_pause:{holder}", "operator", "changed", action="paused", holder=holder)
        for ep in eps:
            _scale(ctx, ep, 0)
            states[ep.key] = "scaled_to_0"
        _wait_pods(ctx, eps, {ep.key: 0 for ep in eps}, new_env=False)
        if fail_after_scale_down:  # fault injection for tests and drills: dies between pause and restore
            raise RuntimeError("injected failure after scale-to-0 (fault drill)")
        for ep in eps:
            with ctx.write_ahead("patch_deployment", f"Deployment {ep.key}", endpoint=ep.key):
                call(ctx.kube.apps.patch_namespaced_deployment, ep.name, ep.namespace, patches[ep.key],
                     what=f"patch {ep.key}")
            states[ep.key] = "patched"
            bad = [v.text() for v in overlay_violations(_deployment(ctx, ep)["spec"]["template"]["spec"], ep.name,
                                                        ctx.inventory.settings)]
            if bad:
                raise PermanentError(f"{ep.ref}: rendered object still wrong after the patch: {'; '.join(bad)}")
        for ep in eps:
            _scale(ctx, ep, replicas[ep.key])
            states[ep.key] = "scaled_back"
        _wait_pods(ctx, eps, replicas, new_env=True)
        for ep in eps:
            states[ep.key] = "ready"
    except BaseException as exc:
        scaled_back = _scale_back(ctx, eps, replicas, states)
        ctx.record(f"wave_state:{holder}", "endpoint", "failed", states=states, replicas=replicas,
                   scaled_back=scaled_back, error=str(exc)[:500])
        raise
    finally:
        try:
            result = operator_pause.restore(ctx, holder)
        except Exception as exc:
            ctx.record(f"operator_restore:{holder}", "operator", "failed", action="restore failed",
                       still_paused=True, error=str(exc)[:500])
            raise PermanentError(f"OPERATOR STILL PAUSED on {ctx.cluster.name}: restore failed: {exc}") from exc
        if result.get("restored"):
            ctx.record(f"operator_restore:{holder}", "operator", "changed", action="restored", **result)
    return {"states": states, "refused": refused}


def ensure_kyverno_policy(ctx: StageContext) -> str:
    desired = kyverno_policy(ctx.inventory.settings)
    name = desired["metadata"]["name"]
    live = get_or_none(ctx.kube.custom.get_cluster_custom_object, "kyverno.io", "v1", "clusterpolicies", name)
    if live is not None and live.get("spec") == desired["spec"]:
        return "unchanged"
    if ctx.dry_run:
        ctx.plan(STAGE, f"kubectl apply -f k8s/kyverno/curvine-l2-policy.yaml   # ClusterPolicy {name}",
                 diff=_yaml_diff((live or {}).get("spec"), desired["spec"], name))
        return "planned"
    if live is None:
        call(ctx.kube.custom.create_cluster_custom_object, "kyverno.io", "v1", "clusterpolicies", desired,
             what=f"create ClusterPolicy {name}")
    else:
        call(ctx.kube.custom.patch_cluster_custom_object, "kyverno.io", "v1", "clusterpolicies", name,
             {"spec": desired["spec"]}, what=f"update ClusterPolicy {name}")
    ctx.say(f"stage 4 (kyverno): ClusterPolicy {name} applied; no operator pause is needed in this mode")
    return "changed"


def kyverno_wave(ctx: StageContext, eps: list[Endpoint]) -> dict[str, Any]:
    """Make the operator re-render each Deployment that lacks the injection, then verify it after the re-render."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for ep in eps:
        patch = {"spec": {"template": {"metadata": {"annotations": {"kvfleet.io/rerender-requested-at": stamp}}}}}
        if ctx.dry_run:
            ctx.plan(STAGE, f"kubectl patch deployment {ep.name} -n {ep.namespace} -p '{json.dumps(patch)}'   "
                            "# rollout -> the operator re-renders through Kyverno admission", endpoint=ep.ref)
            continue
        call(ctx.kube.apps.patch_namespaced_deployment, ep.name, ep.namespace, patch, what=f"touch {ep.key}")
    if ctx.dry_run:
        return {"planned": [ep.key for ep in eps]}
    _wait_pods(ctx, eps, {ep.key: ep.replicas for ep in eps}, new_env=True)
    return {"rerendered": [ep.key for ep in eps]}


def _refuse(ctx: StageContext, eps: list[Endpoint], reasons: dict[str, str]) -> list[Outcome]:
    out = []
    for ep in eps:
        ctx.say(f"REFUSED {ep.ref}: {reasons[ep.key]}")
        out.append(ctx.record(f"endpoint:{ep.key}", STAGE, "refused", endpoint=ep.key, lob=ep.lob,
                              reason=reasons[ep.key]))
    return out


def reconcile_wave(ctx: StageContext, eps: list[Endpoint], *, holder: str,
                   fail_after_scale_down: bool = False) -> list[Outcome]:
    operator_pause.require_running(ctx)
    results: dict[str, str] = {}
    outcomes: list[Outcome] = []
    for ep in eps:
        try:
            results[ep.key] = apply_iec(ctx, ep)
        except PermanentError as exc:
            outcomes.append(ctx.record(f"endpoint:{ep.key}", STAGE, "refused", endpoint=ep.key, lob=ep.lob,
                                       reason=str(exc)))
            ctx.say(f"REFUSED {ep.ref}: {exc}")
    live_eps = [ep for ep in eps if ep.key in results]
    if ctx.dry_run and any(r == "planned" for r in results.values()):
        for ep in live_eps:
            if results[ep.key] == "planned" and ep.l2:
                ctx.plan(STAGE, f"then put the L2 overlay on Deployment {ep.key} ({ctx.cluster.l2_injection} mode)",
                         endpoint=ep.ref)
    ready_eps = [ep for ep in live_eps if not (ctx.dry_run and results[ep.key] == "planned"
                                               and _get_iec(ctx, ep) is None)]
    if not ctx.dry_run:
        wait_complete(ctx, live_eps)
    needs = [ep for ep in ready_eps if ep.l2 and _needs_overlay(ctx, ep)]
    overlay: dict[str, Any] = {}
    if needs and ctx.cluster.l2_injection == "kyverno":
        overlay["policy"] = ensure_kyverno_policy(ctx)
        overlay.update(kyverno_wave(ctx, needs))
    elif needs:
        overlay.update(patch_wave(ctx, needs, holder, fail_after_scale_down))
    elif ctx.cluster.l2_injection == "kyverno" and any(ep.l2 for ep in ready_eps):
        overlay["policy"] = ensure_kyverno_policy(ctx)
    unpatched: dict[str, str] = dict(overlay.get("refused") or {})
    outcomes += _refuse(ctx, [ep for ep in live_eps if ep.key in unpatched], unpatched)
    for ep in (ep for ep in live_eps if ep.key not in unpatched):
        moved = results[ep.key] in ("changed", "planned") or ep in needs
        remaining = [] if ctx.dry_run else endpoint_violations(ctx, ep)
        if remaining:
            # Recorded, not raised: the wave's gate turns a failed endpoint into "stop this cluster's later
            # waves", and the other endpoints of the wave keep their outcome.
            ctx.say(f"FAILED {ep.ref}: desired state not reached: {'; '.join(remaining)}")
            outcomes.append(ctx.record(f"endpoint:{ep.key}", STAGE, "failed", endpoint=ep.key, lob=ep.lob,
                                       violations=remaining))
            continue
        outcome = ("planned" if ctx.dry_run and moved else "changed" if moved else "unchanged")
        outcomes.append(ctx.record(f"endpoint:{ep.key}", STAGE, outcome, endpoint=ep.key, lob=ep.lob,
                                   cr=results[ep.key], overlay=ctx.cluster.l2_injection if ep in needs else None))
    return outcomes
