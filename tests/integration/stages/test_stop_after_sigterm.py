"""After SIGTERM (the stop flag) kvfleet starts no new mutating call, at the clients' choke points (boto3, the
Kubernetes ApiClient, helm) and at the write-ahead record; reads go on, and the undo steps of a sequence already
under way (the operator restore, an endpoint's scale back from 0, the Curvine format flags flipped false) still run,
recorded (docs/reference/airflow.md#sigterm). Against the twin, through the
production clients."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from stagekit import converge_cluster, endpoint, reset_counters, with_cluster, without_overlay

from kvfleet.clients import helm as helm_module
from kvfleet.clients.kube import StopRequested, call, request_stop, reset_stop, stop_requested
from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_values as cv
from kvfleet.fleet.endpoint_spec import pvc_manifest
from kvfleet.history.keys import StepKey
from kvfleet.stages import addons, curvine, endpoints, executor, operator_pause, tiered_storage

pytestmark = pytest.mark.integration
CLUSTER = "ml-stage-usw2"
PROD = "ml-prod-use1"  # patch mode


@pytest.fixture(autouse=True)
def _no_stop_left() -> Iterator[None]:
    """The stop flag is process-wide: cleared before and after each test, so no other test sees it."""
    reset_stop()
    yield
    reset_stop()



def _write_ahead(history: Any, run_key: str) -> list[tuple[str, str | None]]:
    rows = history.queries.rows("write_ahead", cutoff=datetime.now(UTC) - timedelta(days=1), run_key=run_key,
                                cluster=None, endpoint=None, limit=100)
    return sorted((str(r["action"]), r["outcome"]) for r in rows)


def test_aws_changes_are_refused_after_a_stop_and_reads_go_on(fleet_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx(CLUSTER)
    hp = ctx.hyperpod  # built (and the account guard's reads made) before the stop
    eks = hp.require_cluster(CLUSTER).eks_cluster_name
    reset_counters(fleet_env)
    request_stop()

    with pytest.raises(StopRequested, match="AWS sagemaker UpdateCluster: not started"):
        hp.sagemaker.update_cluster(ClusterName=CLUSTER, NodeRecovery="Automatic")
    with pytest.raises(StopRequested, match="AWS eks CreateAddon: not started"):
        hp.create_addon(eks, "cert-manager", None, None, "OVERWRITE")
    # A stage's own change, through the executor: refused at its write-ahead already, naming the action.
    with pytest.raises(StopRequested, match="update_cluster HyperPod cluster ml-stage-usw2.*not started"):
        tiered_storage.reconcile(make_ctx(CLUSTER))
    # Reads still work, on the same client and on a client built after the stop.
    assert hp.require_cluster(CLUSTER).name == CLUSTER
    assert make_ctx(CLUSTER).hyperpod.describe_eks(eks)["name"] == eks
    assert fleet_env.aws.calls(mutating=True) == []  # the twin saw no change at all
    assert {"DescribeCluster"} <= set(fleet_env.aws.operations())

    reset_stop()  # the same call goes through once the flag is down: the refusal was the stop's, not the client's
    hp.sagemaker.update_cluster(ClusterName=CLUSTER, NodeRecovery="Automatic")
    assert [c.operation for c in fleet_env.aws.calls(mutating=True)] == ["UpdateCluster"]


def test_kubernetes_writes_are_refused_after_a_stop_and_reads_go_on(fleet_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx(CLUSTER)
    store = fleet_env.twin(CLUSTER).store
    ns = "retail"  # an endpoint namespace: kvfleet reads it and creates its PVC there
    assert call(ctx.kube.core.read_namespace, ns).metadata.name == ns
    store.reset_request_log()
    request_stop()

    pvc = pvc_manifest(ns, "kv-stop-class", name="kvfleet-stop-test")
    with pytest.raises(StopRequested, match=f"Kubernetes POST /api/v1/namespaces/{ns}/persistentvolumeclaims"):
        call(ctx.kube.core.create_namespaced_persistent_volume_claim, ns, pvc)
    patch = {"metadata": {"labels": {"kvfleet.io/test": "stopped"}}}
    with pytest.raises(StopRequested, match=f"Kubernetes PATCH /api/v1/namespaces/{ns}: not started"):
        call(ctx.kube.core.patch_namespace, ns, patch)
    with pytest.raises(StopRequested, match="Kubernetes DELETE"):
        call(ctx.kube.core.delete_namespaced_persistent_volume_claim, "kvfleet-stop-test", ns)
    with pytest.raises(StopRequested, match="Kubernetes POST .*/proxy/v1/completions"):  # the pod proxy too
        list(ctx.kube.proxy_stream(ns, "any-pod", 8000, "/v1/completions", {"prompt": "x"}))
    # Reads, and a server dry run (it persists nothing), still reach the API server.
    assert call(ctx.kube.core.read_namespace, ns).metadata.name == ns
    call(ctx.kube.core.create_namespaced_persistent_volume_claim, ns, pvc, dry_run="All")
    seen = [(r.verb, r.resource, r.name, r.dry_run) for r in store.request_log
            if r.verb not in ("discovery", "unauthorized")]
    assert ("get", "namespaces", ns, False) in seen
    writes = [s for s in seen if s[0] in ("create", "update", "patch", "delete")]
    assert [(verb, resource, dry) for verb, resource, _, dry in writes] == [("create", "persistentvolumeclaims", True)]
    assert store.get("", "persistentvolumeclaims", "kvfleet-stop-test", ns) is None
    assert "kvfleet.io/test" not in (store.get("", "namespaces", ns)["metadata"].get("labels") or {})


def test_helm_changes_do_not_start_after_a_stop_and_reads_go_on(fleet_env, make_ctx, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx(CLUSTER)
    ns = ctx.cluster.curvine.namespace
    started: list[list[str]] = []
    real_run = subprocess.run

    def spy(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        started.append(list(argv))
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(helm_module.subprocess, "run", spy)
    request_stop()
    spec = ctx.cluster.curvine
    with pytest.raises(StopRequested, match="helm install curvine.*not started"):
        ctx.helm.install(C.CURVINE_RELEASE, spec.chart, ns, repo=curvine.repo_url(ctx), version=spec.version,
                         values=cv.safe_flags())
    with pytest.raises(StopRequested, match="helm upgrade"):
        ctx.helm.upgrade(C.CURVINE_RELEASE, spec.chart, ns, repo=curvine.repo_url(ctx), version=spec.version,
                         values=cv.safe_flags())
    with pytest.raises(StopRequested, match="helm rollback"):
        ctx.helm.rollback(C.CURVINE_RELEASE, ns, 1)
    with pytest.raises(StopRequested, match="helm uninstall"):
        ctx.helm.run("uninstall", C.CURVINE_RELEASE, "-n", ns, what="helm uninstall curvine")
    assert started == []  # no helm process was started for any of them
    assert ctx.helm.status(C.CURVINE_RELEASE, ns) is None  # a read still runs helm
    assert [argv[1] for argv in started] == ["status"]


def test_write_ahead_opens_no_intent_after_a_stop(fleet_env, make_ctx, history) -> None:  # type: ignore[no-untyped-def]
    history.runs.start("t/stop", dag_id="t", run_id="stop", trigger="test", triggered_by=None, params={})
    ctx = make_ctx(CLUSTER, history=history, step_key=StepKey("t/stop", "stages"))
    request_stop()
    ran = []
    with pytest.raises(StopRequested, match="create_addon addon cert-manager: not started"), \
            ctx.write_ahead("create_addon", "addon cert-manager"):
        ran.append(True)
    assert ran == [] and _write_ahead(history, "t/stop") == []
    # An undo step is the exception: it opens its intent, and its outcome is recorded.
    with ctx.write_ahead("restore_operator", "Deployment x/y paused by t/stop to 1") as wa:
        assert wa is not None
    assert _write_ahead(history, "t/stop") == [("restore_operator", "changed")]


def test_a_stop_while_the_batch_is_at_0_scales_back_and_restores_the_operator(  # type: ignore[no-untyped-def]
        fleet_env, make_ctx, inventory, history) -> None:
    """SIGTERM arrives while every endpoint of a scale-to-zero wave is at 0: the patch does not start, every
    endpoint goes back to its replicas and the operator is restored (the undo steps run after the stop), each with
    its write-ahead rows; nothing else is written."""
    inv = with_cluster(inventory, PROD, update_strategy="scale-to-zero")
    history.runs.start("t/sigterm", dag_id="t", run_id="sigterm", trigger="test", triggered_by=None, params={})
    ctx = converge_cluster(make_ctx, PROD, inv=inv, history=history)
    ctx.step_key = StepKey("t/sigterm", "wave")
    eps = [endpoint(inv, PROD, "retail-assistant"), endpoint(inv, PROD, "payments-disputes")]
    without_overlay(fleet_env, ctx, eps, PROD)
    twin = fleet_env.twin(PROD)
    at_zero: set[str] = set()
    mark: list[int] = []

    def on_event(kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
        # In the API server's thread, before it answers the last scale to 0: the stop is set before kvfleet's
        # next request, as Airflow's SIGTERM would set it.
        key = f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
        if resource == "deployments" and key in {e.key for e in eps} and obj["spec"].get("replicas") == 0 \
                and key not in at_zero:
            at_zero.add(key)
            if len(at_zero) == len(eps):
                mark.append(len(twin.store.request_log))
                request_stop()

    twin.store.subscribe(on_event)
    try:
        with pytest.raises(StopRequested):
            endpoints.reconcile_wave(ctx, eps, holder="t/sigterm")
    finally:
        at_zero.update(e.key for e in eps)  # the subscriber stays registered: make it inert
    assert stop_requested() and mark
    # Back to their replicas, the operator restored (its readiness not awaited after the stop: waited here).
    assert [twin.store.get("apps", "deployments", e.name, e.namespace)["spec"]["replicas"] for e in eps] == [2, 2]
    state = operator_pause.pause_state(ctx)
    assert state["paused_by"] is None and state["replicas"] >= 1
    after = [(r.verb, r.resource, r.subresource, r.name) for r in twin.store.request_log[mark[0]:]
             if r.verb in ("create", "update", "patch", "delete") and not r.dry_run]
    assert sorted(after, key=str) == sorted([("patch", "deployments", "scale", e.name) for e in eps]
                                            + [("patch", "deployments", None, operator_pause.controller_name(ctx))],
                                            key=str)
    applied = [type(a).__name__ for a in executor.journal(ctx)]
    assert "PatchDeployment" not in applied and applied[-3:] == ["Scale", "Scale", "RestoreOperator"]
    steps = {s["step"]: s for s in history.runs.steps("t/sigterm")}
    assert steps["wave_state:t/sigterm"]["detail"]["scaled_back"] == {e.key: "scaled back to 2" for e in eps}
    restored = steps["operator_restore:t/sigterm"]["detail"]
    assert restored["restored"] is True and restored["ready_awaited"] is False
    rows = _write_ahead(history, "t/sigterm")
    assert ("patch_deployment", "changed") not in rows and not any(a == "patch_deployment" for a, _ in rows)
    assert rows.count(("scale_up", "changed")) == 2 and ("restore_operator", "changed") in rows
    assert all(outcome is not None for _, outcome in rows)  # no intent left open


def test_a_stop_in_the_curvine_install_window_still_flips_the_format_flags(  # type: ignore[no-untyped-def]
        fleet_env, make_ctx, history, monkeypatch) -> None:
    """SIGTERM while stage 3 waits for the first Curvine pods (format flags TRUE): the flip to false still runs
    (a release left with the flags true would format its NVMe L2 at the next pod restart), then the stop ends the
    stage."""
    history.runs.start("t/flip", dag_id="t", run_id="flip", trigger="test", triggered_by=None, params={})
    ctx = make_ctx(CLUSTER, history=history, step_key=StepKey("t/flip", "stages"))
    tiered_storage.reconcile(ctx)
    addons.reconcile(ctx)
    real_wait = curvine.wait_curvine_running

    def sigterm_in_window(c: Any, timeout_s: float | None = None) -> str:
        request_stop()
        return real_wait(c, timeout_s)

    monkeypatch.setattr(curvine, "wait_curvine_running", sigterm_in_window)
    with pytest.raises(StopRequested, match="curvine pods: stopped waiting"):
        curvine.reconcile(ctx)
    assert stop_requested()
    ns = ctx.cluster.curvine.namespace
    assert not cv.flags_set(ctx.helm.values(C.CURVINE_RELEASE, ns))  # a read, after the stop
    whys = [(a.kind, getattr(a, "why", None)) for a in executor.journal(ctx) if a.kind.startswith("helm_")]
    assert whys[-2:] == [("helm_install", "format flags true"), ("helm_upgrade", "format flags false")]
    assert ("helm_upgrade", "changed") in _write_ahead(history, "t/flip")
