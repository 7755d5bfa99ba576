"""The executor: applies the typed actions a stage computed (``fleet.actions``), or renders them in a dry run.

Called from the stages (tiered storage, operator add-ons, Curvine, endpoints, operator pause). Applying goes through the
clients, each mutating call wrapped in its write-ahead record (``StageContext.write_ahead``: an intent before,
an outcome after). Rendering records each action's command equivalent with ``ctx.plan`` (what `kvfleet plan
--diff` and the rollout's dry run print). Either way the action is appended to the context's journal
(:func:`journal`), so a test can hold the dry run's list against what a real run applied, action for action.

Sequencing and failure handling stay with the stages: an action either completes or raises.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import yaml
from botocore.exceptions import ClientError

from kvfleet.clients.hyperpod import classify
from kvfleet.clients.kube import call, get_or_none, wait_for
from kvfleet.errors import PermanentError
from kvfleet.fleet import actions as A
from kvfleet.fleet import constants as C
from kvfleet.fleet.endpoint_spec import overlay_violations
from kvfleet.stages import operator_pause
from kvfleet.stages.base import StageContext

_JOURNAL = "executor.journal"


def journal(ctx: StageContext) -> list[A.Action]:
    """Every action this context applied (or, in a dry run, rendered), in order."""
    out: list[A.Action] = ctx.memo.setdefault(_JOURNAL, [])
    return out


def run(ctx: StageContext, stage: str, actions: list[A.Action],
        on_done: Callable[[A.Action], None] | None = None) -> None:
    """Apply ``actions`` in order (render them in a dry run). ``on_done`` is told of each completed action, so
    the caller knows how far a sequence got when one raises."""
    for action in actions:
        if ctx.dry_run:
            ctx.plan(stage, action.equivalent(), endpoint=action.endpoint, diff=action.diff)
        else:
            _HANDLERS[type(action)](ctx, action)
        journal(ctx).append(action)
        if on_done is not None:
            on_done(action)


# ---- reads the handlers and the stages share ----------------------------------------------------------------


def read_deployment(ctx: StageContext, namespace: str, name: str) -> dict[str, Any] | None:
    dep = get_or_none(ctx.kube.apps.read_namespaced_deployment, name, namespace)
    return None if dep is None else dict(ctx.kube.api_client.sanitize_for_serialization(dep))


def list_pods(ctx: StageContext, namespace: str, name: str) -> list[dict[str, Any]]:
    pods = call(ctx.kube.core.list_namespaced_pod, namespace, label_selector=f"app={name}",
                what=f"pods of {namespace}/{name}").items
    return [ctx.kube.api_client.sanitize_for_serialization(p) for p in pods]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


# ---- handlers: one per action type ----------------------------------------------------------------------------


def _update_cluster(ctx: StageContext, a: A.UpdateCluster) -> None:
    with ctx.write_ahead(a.kind, a.target()):
        if a.mode is None:  # NodeRecovery alone (the API allows it: only ClusterName is required)
            try:
                ctx.hyperpod.sagemaker.update_cluster(ClusterName=a.cluster, NodeRecovery=a.node_recovery)
            except ClientError as exc:
                raise classify(exc, f"UpdateCluster {a.cluster}") from exc
        else:
            ctx.hyperpod.update_tiered_storage(a.cluster, a.mode, a.memory_percent, a.node_recovery)


def _create_addon(ctx: StageContext, a: A.CreateAddon) -> None:
    with ctx.write_ahead(a.kind, a.target()):
        ctx.hyperpod.create_addon(a.eks_cluster, a.name, a.version, a.config(), a.resolve_conflicts)


def _update_addon(ctx: StageContext, a: A.UpdateAddon) -> None:
    with ctx.write_ahead(a.kind, a.target()):
        ctx.hyperpod.update_addon(a.eks_cluster, a.name, a.version, a.config(), a.resolve_conflicts)


def _apply_iec(ctx: StageContext, a: A.ApplyEndpointConfig) -> None:
    key = f"{a.namespace}/{a.name}"
    if get_or_none(ctx.kube.core.read_namespace, a.namespace) is None:  # the bootstrap bundle creates namespaces
        from kvfleet.fleet.bootstrap_bundle import missing_namespace

        raise PermanentError(missing_namespace(ctx.inventory.source, ctx.cluster.name, a.namespace))
    body = json.loads(a.body)
    if a.create:
        with ctx.write_ahead("create_iec", a.target(), endpoint=key):
            call(ctx.kube.custom.create_namespaced_custom_object, C.IEC_GROUP, C.IEC_VERSION, a.namespace,
                 C.IEC_PLURAL, body, what=f"create InferenceEndpointConfig {key}")
    else:
        with ctx.write_ahead("update_iec", a.target(), endpoint=key):
            call(ctx.kube.custom.patch_namespaced_custom_object, C.IEC_GROUP, C.IEC_VERSION, a.namespace,
                 C.IEC_PLURAL, a.name, body, what=f"update InferenceEndpointConfig {key}")
    ctx.say(f"stage 4: applied InferenceEndpointConfig {key}")


def _pause(ctx: StageContext, a: A.PauseOperator) -> None:
    operator_pause.apply_pause(ctx, a)
    ctx.record(f"operator_pause:{a.holder}", "operator", "changed", action="paused", holder=a.holder)


def _restore(ctx: StageContext, a: A.RestoreOperator) -> None:
    try:
        result = operator_pause.restore(ctx, a.holder)
    except Exception as exc:
        ctx.record(f"operator_restore:{a.holder}", "operator", "failed", action="restore failed",
                   still_paused=True, error=str(exc)[:500])
        raise PermanentError(f"OPERATOR STILL PAUSED on {ctx.cluster.name}: restore failed: {exc}") from exc
    if result.get("restored"):
        ctx.record(f"operator_restore:{a.holder}", "operator", "changed", action="restored", **result)


def _scale(ctx: StageContext, a: A.Scale) -> None:
    key = f"{a.namespace}/{a.name}"
    with ctx.write_ahead("scale_down" if a.replicas == 0 else "scale_up", a.target(), endpoint=key):
        call(ctx.kube.apps.patch_namespaced_deployment_scale, a.name, a.namespace,
             {"spec": {"replicas": a.replicas}}, what=f"scale {key} to {a.replicas}")


def _patch(ctx: StageContext, a: A.PatchDeployment) -> None:
    key = f"{a.namespace}/{a.name}"
    with ctx.write_ahead(a.kind, a.target(), endpoint=key):
        call(ctx.kube.apps.patch_namespaced_deployment, a.name, a.namespace, a.ops(), what=f"patch {key}")


def _set_strategy(ctx: StageContext, a: A.SetRolloutStrategy) -> None:
    key = f"{a.namespace}/{a.name}"
    with ctx.write_ahead("restore_rollout_strategy" if a.restore else a.kind, a.target(), endpoint=key):
        call(ctx.kube.apps.patch_namespaced_deployment, a.name, a.namespace, a.ops(),
             what=f"set the rollout strategy of {key}")


def _verify(ctx: StageContext, a: A.VerifyRendered) -> None:
    dep = read_deployment(ctx, a.namespace, a.name)
    if dep is None:
        raise PermanentError(f"{a.endpoint}: Deployment {a.namespace}/{a.name} is gone after the patch")
    bad = [v.text() for v in overlay_violations(dep["spec"]["template"]["spec"], a.name, ctx.inventory.settings)]
    if a.strategy is not None and dep["spec"].get("strategy") != json.loads(a.strategy):
        bad.append(f"strategy is {A.canonical(dep['spec'].get('strategy'))}, expected {a.strategy}")
    if bad:
        raise PermanentError(f"{a.endpoint}: rendered object still wrong after the patch: {'; '.join(bad)}")


def _wait_pods(ctx: StageContext, a: A.WaitPods) -> None:
    def check() -> tuple[bool, str]:
        waiting = []
        for key, want in a.want:
            ns, name = key.split("/", 1)
            pods = [p for p in list_pods(ctx, ns, name) if (p.get("status") or {}).get("phase") != "Succeeded"]
            good = [p for p in pods if _ready(p) and
                    (not a.new_env or not overlay_violations(p["spec"], name, ctx.inventory.settings))]
            if len(pods) != want or len(good) != want:
                waiting.append(f"{name} {len(good)}/{want} ready" + (" with new env" if a.new_env else "")
                               + (f" ({len(pods)} pods)" if len(pods) != want else ""))
        return not waiting, "; ".join(waiting) or "all pods in place"

    wait_for(check, timeout_s=ctx.timeouts.pods_s, poll_s=min(ctx.poll_s, 1.0),
             what=f"[{ctx.cluster.name}] wave pods", progress=ctx.progress)


def _rolled_out(dep: dict[str, Any] | None, want: int) -> bool:
    if dep is None:
        return False
    status = dep.get("status") or {}
    return (int(status.get("observedGeneration") or 0) >= int(dep["metadata"].get("generation") or 1)
            and int(dep["spec"].get("replicas") or 0) == want
            and int(status.get("updatedReplicas") or 0) == want and int(status.get("availableReplicas") or 0) >= want
            and int(status.get("replicas") or 0) == want)


def _wait_rolled_out(ctx: StageContext, a: A.WaitRolledOut) -> None:
    def check() -> tuple[bool, str]:
        waiting = [key for key, want in a.want if not _rolled_out(read_deployment(ctx, *key.split("/", 1)), want)]
        return not waiting, "waiting: " + ", ".join(waiting) if waiting else "all observed and fully available"

    wait_for(check, timeout_s=ctx.timeouts.pods_s, poll_s=min(ctx.poll_s, 0.5),
             what=f"[{ctx.cluster.name}] Deployments rolled out", progress=ctx.progress)


def _rerender(ctx: StageContext, a: A.RerenderDeployment) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = {"spec": {"template": {"metadata": {"annotations": {"kvfleet.io/rerender-requested-at": stamp}}}}}
    key = f"{a.namespace}/{a.name}"
    with ctx.write_ahead(a.kind, a.target(), endpoint=key):
        call(ctx.kube.apps.patch_namespaced_deployment, a.name, a.namespace, patch, what=f"touch {key}")


def _apply_policy(ctx: StageContext, a: A.ApplyClusterPolicy) -> None:
    body = json.loads(a.body)
    with ctx.write_ahead(a.kind, a.target()):
        call(ctx.kube.custom.patch_cluster_custom_object, "kyverno.io", "v1", "clusterpolicies", a.name,
             {"spec": body["spec"]}, what=f"update ClusterPolicy {a.name}")
    ctx.say(f"stage 4 (kyverno): ClusterPolicy {a.name} applied; no operator pause is needed in this mode")


def helm_args(ctx: StageContext, a: A.HelmInstall | A.HelmUpgrade) -> list[str]:
    """The helm command line of ``a`` (its values written to a file in the private helm home), checked: the
    values file carries exactly the action's values (its digest), so what the dry run listed is what helm gets.
    A gate that renders the command first (``--dry-run=server``) renders these very arguments."""
    args: list[str]
    if isinstance(a, A.HelmInstall):
        args = ctx.helm.install_args(a.release, a.chart, a.namespace, repo=a.repo, version=a.version,
                                     values=a.values_map())
    else:
        args = ctx.helm.upgrade_args(a.release, a.chart, a.namespace, repo=a.repo, version=a.version,
                                     values=a.values_map(), reuse_values=a.reuse_values)
    _check_file(ctx, a, args[args.index("-f") + 1] if "-f" in args else None, a.values_digest)
    if isinstance(a, A.HelmUpgrade) and a.reset_then_reuse:
        args.append("--reset-then-reuse-values")
    last = a.last_values_map() if isinstance(a, A.HelmUpgrade) else None
    if last is not None:
        path = ctx.helm.values_file(last, "format-flags-false")
        _check_file(ctx, a, path, getattr(a, "last_digest", None))
        args += ["-f", path]
    return args


def _check_file(ctx: StageContext, a: A.HelmInstall | A.HelmUpgrade, path: str | None, want: str | None) -> None:
    written = (yaml.safe_load(ctx.helm.files[path]) or {}) if path is not None else {}
    got = A.tree_digest(written)
    if got != want:
        raise PermanentError(f"{a.target()}: a values file for helm has digest {got}, the action {want}: refusing "
                             "to run helm with values other than those planned")


def _helm(ctx: StageContext, a: A.HelmInstall | A.HelmUpgrade) -> None:
    with ctx.write_ahead(a.kind, a.target()):
        args = helm_args(ctx, a)
        ctx.helm.run(*args, what=f"helm {args[0]} {a.release}" + (f" ({a.why})" if a.why else ""))


def _helm_rollback(ctx: StageContext, a: A.HelmRollback) -> None:
    with ctx.write_ahead(a.kind, a.target()):
        ctx.helm.rollback(a.release, a.namespace, a.revision)


def _create_storage_class(ctx: StageContext, a: A.CreateStorageClass) -> None:
    call(ctx.kube.storage.create_storage_class, json.loads(a.body), what=f"create StorageClass {a.name}")


def _create_pvc(ctx: StageContext, a: A.CreatePvc) -> None:
    call(ctx.kube.core.create_namespaced_persistent_volume_claim, a.namespace, json.loads(a.body),
         what=f"create PVC {a.namespace}/{a.name}")


_HANDLERS: dict[type[Any], Callable[[StageContext, Any], None]] = {
    A.UpdateCluster: _update_cluster,
    A.CreateAddon: _create_addon,
    A.UpdateAddon: _update_addon,
    A.ApplyEndpointConfig: _apply_iec,
    A.PauseOperator: _pause,
    A.RestoreOperator: _restore,
    A.Scale: _scale,
    A.PatchDeployment: _patch,
    A.SetRolloutStrategy: _set_strategy,
    A.VerifyRendered: _verify,
    A.WaitPods: _wait_pods,
    A.WaitRolledOut: _wait_rolled_out,
    A.RerenderDeployment: _rerender,
    A.ApplyClusterPolicy: _apply_policy,
    A.HelmInstall: _helm,
    A.HelmUpgrade: _helm,
    A.HelmRollback: _helm_rollback,
    A.CreateStorageClass: _create_storage_class,
    A.CreatePvc: _create_pvc,
}
