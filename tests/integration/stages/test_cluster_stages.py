"""Stages 1–3 as idempotent reconcilers, driven against the sandbox through the production clients."""

from __future__ import annotations

import json
import time

import pytest
from stagekit import mutating_calls, reset_counters, with_cluster

from kvfleet.errors import ConvergenceTimeout, PermanentError
from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_values as cv
from kvfleet.fleet.endpoint_spec import pvc_manifest
from kvfleet.history.keys import StepKey
from kvfleet.stages import addons, curvine, readiness, tiered_storage
from kvfleet.stages.converge import settle

pytestmark = pytest.mark.integration
CLUSTER = "ml-stage-usw2"


def _wait_until(what: str, cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Poll ``cond`` until true; fail naming ``what`` after ``timeout`` seconds (a bound, not a timing)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for: {what}"
        time.sleep(0.02)


def _converge(make_ctx, history=None):  # type: ignore[no-untyped-def]
    ctx = make_ctx(CLUSTER, history=history, step_key=StepKey("t/converge", "converge") if history else None)
    return [stage.reconcile(ctx).outcome for stage in (tiered_storage, addons, curvine)]


def _release_reads(sandbox, cluster: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Named reads of Curvine's helm release records (one per ``helm get values --revision N``)."""
    return sorted(r.name for r in sandbox.twin(cluster).store.request_log
                  if r.verb == "get" and r.resource == "secrets" and (r.name or "").startswith("sh.helm.release.v1.curvine."))


def test_fresh_cluster_converges_and_a_second_run_makes_no_mutating_call(fleet_env, make_ctx, history) -> None:  # type: ignore[no-untyped-def]
    history.runs.start("t/converge", dag_id="t", run_id="converge", trigger="test", triggered_by=None, params={})
    assert _converge(make_ctx, history) == ["changed", "changed", "changed"]
    twin = fleet_env.twin(CLUSTER)
    # full cluster state: tiered storage, ai-toolkit on every node, operator, Curvine with safe flags, PVCs bound
    hp = fleet_env.aws.hyperpod_cluster(CLUSTER)
    assert hp["TieredStorageConfig"] == {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 25}
    ds = twin.store.get("apps", "daemonsets", C.AI_TOOLKIT_DAEMONSET, C.AI_TOOLKIT_NAMESPACE)
    assert ds["status"]["numberReady"] == 12
    assert {fleet_env.aws.addon_status(twin.eks_name, a) for a in C.ADDON_ORDER} == {"ACTIVE"}
    for ns in ("retail", "payments", "support"):
        assert twin.store.get("", "persistentvolumeclaims", C.CURVINE_PVC, ns)["status"]["phase"] == "Bound"
    # every UpdateCluster carried NodeRecovery (tiered storage alone is refused by the service)
    updates = [r for r in fleet_env.aws.request_log if r.operation == "UpdateCluster"]
    assert updates and all("NodeRecovery" in r.params for r in updates)

    def recorded_revisions():  # type: ignore[no-untyped-def]
        step = [s for s in history.runs.steps("t/converge") if s["step"] == "curvine"][-1]
        return [(r["revision"], r["status"], set(r["flags"].values())) for r in step["detail"]["revisions"]]

    # the first install (flags true), then the flip to false: each revision's values read once
    assert recorded_revisions() == [(1, "superseded", {True}), (2, "deployed", {False})]
    assert _release_reads(fleet_env, CLUSTER) == ["sh.helm.release.v1.curvine.v1", "sh.helm.release.v1.curvine.v2"]

    reset_counters(fleet_env)
    assert _converge(make_ctx, history) == ["unchanged", "unchanged", "unchanged"]
    assert mutating_calls(fleet_env, CLUSTER) == {"k8s": [], "aws": []}
    # revisions are immutable: the second run knows their flags from the history store and reads none again
    assert _release_reads(fleet_env, CLUSTER) == []
    assert recorded_revisions() == [(1, "superseded", {True}), (2, "deployed", {False})]


def test_percentage_15_is_refused_before_any_call(fleet_env, make_ctx, inventory) -> None:  # type: ignore[no-untyped-def]
    bad = with_cluster(inventory, CLUSTER, memory_percent=15)
    ctx = make_ctx(CLUSTER, inv=bad)
    reset_counters(fleet_env)
    with pytest.raises(PermanentError, match="15 is outside 20–100"):
        tiered_storage.reconcile(ctx)
    assert fleet_env.aws.operations() == []


def _set_status(fleet_env, status: str) -> None:  # type: ignore[no-untyped-def]
    """The twin's HyperPod cluster in ``status`` and held there (the emulator's own transitions end on a timer; a
    held status makes the moment the stage looks deterministic)."""
    with fleet_env.aws._lock:
        fleet_env.aws._sagemaker.find(CLUSTER).status = status


def test_stage_1_waits_for_a_change_in_flight_even_when_nothing_is_left_to_change(  # type: ignore[no-untyped-def]
        fleet_env, make_ctx) -> None:
    """A cluster already as the inventory wants it but ``Updating`` (an earlier try's UpdateCluster, or one made by
    hand) is not declared unchanged: ``act`` hands back a ``before:cluster`` wait (the rollout defers on it), and
    once the cluster is InService it observes again and finds nothing to do. No UpdateCluster is sent either way."""
    ctx = make_ctx(CLUSTER)
    assert tiered_storage.reconcile(ctx).outcome in ("changed", "unchanged")
    reset_counters(fleet_env)
    _set_status(fleet_env, "Updating")
    try:
        progress: dict[str, object] = {}
        pending = tiered_storage.act(make_ctx(CLUSTER), progress)
        assert pending is not None and pending.wait == "before:cluster" and "Updating" in pending.what, pending
        assert progress == {}  # nothing decided while the cluster moves
    finally:
        _set_status(fleet_env, "InService")
    progress = {}
    assert tiered_storage.act(make_ctx(CLUSTER), progress) is None
    assert progress["done"]["outcome"] == "unchanged"
    assert "UpdateCluster" not in fleet_env.aws.operations(), fleet_env.aws.operations()


def test_stage_3_hands_back_its_waits_and_resumes_from_its_progress(fleet_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    """Stage 3 split as stages 1 and 2 are: ``act`` makes the changes once (the install window, with
    its flip, in the same call) and then hands back each read-only wait that is not met yet as a named readiness
    check the triggerer can run; ``progress`` stays plain JSON (it travels in a deferral); a resumed ``act``
    sends no change again. Held here: one endpoint namespace's PVC already exists in a StorageClass that does
    not exist yet, so it stays Pending (the twin's provisioner, as Kubernetes', leaves it with a
    ProvisioningFailed event) until the class appears."""
    ctx = make_ctx(CLUSTER)
    assert tiered_storage.reconcile(ctx).outcome == "changed" and addons.reconcile(ctx).outcome == "changed"
    ns = sorted({e.namespace for e in ctx.inventory.endpoints_of(CLUSTER) if e.l2})[0]
    assert ctx.kube.core.read_namespace(ns)  # the endpoint namespaces exist (k8s/rbac/endpoint-namespaces.yaml)
    ctx.kube.core.create_namespaced_persistent_volume_claim(ns, pvc_manifest(ns, "kv-late-class"))
    reset_counters(fleet_env)
    progress: dict[str, object] = {}
    waits = []
    while (pending := curvine.act(ctx, progress)) is not None:
        # what a deferral carries, and what a resumed task has: the JSON of progress, a new context
        progress, ctx = json.loads(json.dumps(progress)), make_ctx(CLUSTER)
        assert pending.check in readiness.CHECKS and json.loads(json.dumps(pending.args)) == pending.args, pending
        waits.append(pending)
        if pending.check == "curvine_pvcs":
            ready, state = readiness.check(ctx.kube, pending.check, dict(pending.args or {}))
            assert not ready and f"{ns}/{C.CURVINE_PVC}" in state and "kv-late-class" in state, state
            assert pending.wait == "after:pvcs" and pending.timeout_s == ctx.timeouts.pvc_s
            late = {**curvine.storage_class_manifest(ctx)}
            late["metadata"] = {**late["metadata"], "name": "kv-late-class"}
            ctx.kube.storage.create_storage_class(late)
        settle(ctx, pending)
    assert "curvine_pvcs" in [w.check for w in waits], waits
    revisions = [r.revision for r in ctx.helm.revisions(C.CURVINE_RELEASE, ctx.cluster.curvine.namespace)]
    assert revisions == [1, 2], revisions  # installed once (flags true) and flipped once, across every call
    created = [(c[1], c[2]) for c in mutating_calls(fleet_env, CLUSTER)["k8s"] if c[0] == "create"
               and c[1] in ("persistentvolumeclaims", "storageclasses")]
    others = sorted({e.namespace for e in ctx.inventory.endpoints_of(CLUSTER) if e.l2} - {ns})
    # each missing PVC created once (not the held one), the Curvine StorageClass once, and the test's late class
    assert sorted(c for c in created if c[0] == "persistentvolumeclaims") == \
        [("persistentvolumeclaims", n) for n in others], created
    assert len([c for c in created if c[0] == "storageclasses"]) == 2, created
    outcome = curvine.finish(ctx, progress)
    assert outcome.outcome == "changed" and outcome.detail["pvcs"][ns] == "unchanged", outcome.detail
    assert outcome.detail["capacity"]["live_workers"] == ctx.cluster.curvine_workers, outcome.detail
    assert all(not v for v in outcome.detail["flags"].values()), outcome.detail


def test_addon_create_failed_fails_fast_with_its_health_issue(fleet_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    twin = fleet_env.twin(CLUSTER)
    fleet_env.aws.fail_addon(twin.eks_name, "metrics-server", "metrics-server: image pull backoff in kube-system")
    ctx = make_ctx(CLUSTER)
    with pytest.raises(PermanentError) as err:
        addons.reconcile(ctx)
    # failed on the terminal state, not the timeout: a timeout is a ConvergenceTimeout ("still ... after"), and only
    # the failure verdict reports the add-on "is CREATE_FAILED: <health issues>"
    assert not isinstance(err.value, ConvergenceTimeout), err.value
    assert f"EKS add-on metrics-server on {twin.eks_name} is CREATE_FAILED: " in str(err.value), err.value
    assert "image pull backoff" in str(err.value)
    # the operator add-on after it was never attempted
    assert fleet_env.aws.addon_status(twin.eks_name, C.OPERATOR_ADDON) is None


def test_install_ends_with_flags_false_and_a_master_restart_keeps_l2_files(fleet_env, make_ctx, history) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx(CLUSTER, history=history)
    from kvfleet.history.keys import StepKey

    history.runs.start("t/1", dag_id="t", run_id="1", trigger="test", triggered_by=None, params={})
    ctx.step_key = StepKey("t/1", "stages")
    out = curvine.reconcile(ctx)
    assert out.outcome == "changed"
    assert ctx.helm.values(C.CURVINE_RELEASE, "curvine") and not cv.flags_set(ctx.helm.values(C.CURVINE_RELEASE, "curvine"))
    rows = history.queries.rows("curvine_history", cluster=CLUSTER)
    assert [(r["revision"], r["format_master"]) for r in rows] == [(1, True), (2, False)]

    twin = fleet_env.twin(CLUSTER)
    curvine.wait_curvine_running(ctx)
    twin.l2.write("/l2cache/pvc-x/l2cache/chunk-1", 1024)
    sim = twin.services["curvine"]
    old_uid = sim.master_pod()["metadata"]["uid"]
    assert sim.restart_master()
    # the new master has started and registered (any format it would do is done): then the file is judged
    _wait_until("a new curvine-master-0 started and registered",
                lambda: (p := sim.master_pod()) is not None and p["metadata"]["uid"] != old_uid and sim.master_running())
    curvine.wait_curvine_running(ctx)
    assert twin.l2.exists("/l2cache/pvc-x/l2cache/chunk-1")


def test_release_found_with_format_master_true_is_fixed_and_recorded(fleet_env, make_ctx, history) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx(CLUSTER)
    curvine.reconcile(ctx)
    spec = ctx.cluster.curvine
    ctx.helm.upgrade(C.CURVINE_RELEASE, spec.chart, spec.namespace, repo=curvine.repo_url(ctx), version=spec.version,
                     values={"cluster.formatMaster": True})
    assert cv.flags_set(ctx.helm.values(C.CURVINE_RELEASE, spec.namespace)) == ["formatMaster"]

    from kvfleet.history.keys import StepKey

    history.runs.start("t/2", dag_id="t", run_id="2", trigger="test", triggered_by=None, params={})
    ctx2 = make_ctx(CLUSTER, history=history)
    ctx2.step_key = StepKey("t/2", "stages")
    out = curvine.reconcile(ctx2)
    assert out.outcome == "changed"
    assert out.detail["hazard_fixed"] == {"flags": ["formatMaster"], "result": "changed"}
    assert not cv.flags_set(ctx2.helm.values(C.CURVINE_RELEASE, spec.namespace))
    steps = history.runs.steps("t/2")
    assert steps[0]["detail"]["hazard_fixed"]["flags"] == ["formatMaster"]


def test_dry_run_changes_nothing_and_lists_the_actions(fleet_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    twin = fleet_env.twin(CLUSTER)
    rv_before = twin.store.resource_version
    reset_counters(fleet_env)
    ctx = make_ctx(CLUSTER, dry_run=True)
    outcomes = [stage.reconcile(ctx).outcome for stage in (tiered_storage, addons, curvine)]
    assert outcomes == ["planned", "planned", "planned"]
    assert mutating_calls(fleet_env, CLUSTER) == {"k8s": [], "aws": []}
    assert twin.store.resource_version == rv_before
    actions = [p.action for p in ctx.planned]
    assert any(a.startswith("aws sagemaker update-cluster") and "--node-recovery Automatic" in a for a in actions)
    assert any("create-addon" in a and C.OPERATOR_ADDON in a for a in actions)
    assert any(a.startswith("helm install curvine curvine") and "cluster.formatMaster=true" in a for a in actions)
    assert any("--reuse-values" in a and "cluster.formatMaster=false" in a for a in actions)
