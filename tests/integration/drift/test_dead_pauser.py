"""The SIGKILL case: a worker killed with SIGKILL while the operator is paused. The wave's patch
sequence runs in a subprocess (as an Airflow worker would run the task), under the cluster lease; it is killed
once the operator's pause annotation names it. Then the drift check with remediation, judged "three minutes
later" through its ``now`` (no real waiting), restores the operator, records whom it restored it from, and a new
rollout can take the cluster. Also: the operator is found, paused and restored under the Helm chart's name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from driftkit import PROD

from kvfleet.errors import GateRefused
from kvfleet.fleet import constants as C
from kvfleet.history.keys import StepKey
from kvfleet.history.leases import Leases
from kvfleet.stages import addons, curvine, drift, endpoints, operator_pause, tiered_storage
from kvfleet.stages.locks import ClusterLock

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent
VICTIM = "kvfleet_rollout/manual__2026-12-01T08:00:00+00:00"  # a real-looking run key (it contains colons)

# The task body, as the worker runs it: take the lease, then the wave's reconcile (pause, scale, patch, ...).
WAVE_TASK = """
import sys
sys.path.insert(0, {here!r})
from driftkit import PROD, small_inventory
from kvfleet.history.repos import HistoryRepos
from kvfleet.stages import endpoints
from kvfleet.stages.base import StageContext, Timeouts
from kvfleet.stages.locks import ClusterLock

inv = small_inventory()
ctx = StageContext(inventory=inv, cluster=inv.cluster(PROD), aws_conn_id=None, history=HistoryRepos.on(),
                   timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=120, pvc_s=30))
ep = next(e for e in inv.endpoints if e.cluster == PROD and e.name == {name!r})
ClusterLock(ctx.history, ctx.cluster.key, {holder!r}, "rollout", wait_s=30, poll_s=0.2).acquire()
print("lease taken", flush=True)
endpoints.reconcile_wave(ctx, [ep], holder={holder!r})
print("wave finished (too early: the test wanted to kill it mid-wave)", flush=True)
"""


def _wait(predicate, what, timeout=60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _ep(inv, name):  # type: ignore[no-untyped-def]
    return next(e for e in inv.endpoints if e.cluster == PROD and e.name == name)


@pytest.fixture(scope="module")
def converged(drift_sandbox, drift_history):  # type: ignore[no-untyped-def]
    from kvfleet.stages.base import StageContext, Timeouts

    inv = drift_sandbox.inventory
    ctx = StageContext(inventory=inv, cluster=inv.cluster(PROD), aws_conn_id=None, history=drift_history,
                       timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=60, pvc_s=30))
    try:
        for stage in (tiered_storage, addons, curvine):
            stage.reconcile(ctx)
        endpoints.reconcile_wave(ctx, list(inv.endpoints_of(PROD)), holder="t/rollout")
    finally:
        ctx.close()
    return drift_sandbox


def _ready(twin, ep) -> int:  # type: ignore[no-untyped-def]
    pods = twin.store.list("", "pods", ep.namespace, label_selector=f"app={ep.name}")
    return sum(1 for p in pods if not p["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or []))


def test_sigkill_while_paused_then_the_drift_check_restores_and_the_cluster_is_free(
        converged, drift_ctx, drift_history) -> None:  # type: ignore[no-untyped-def]
    inv = converged.inventory
    twin = converged.twin(PROD)
    ep = _ep(inv, "retail-assistant")
    # The endpoint needs the overlay again (an operator re-render dropped the patch), so the wave will pause.
    generation = twin.store.get("apps", "deployments", ep.name, ep.namespace)["metadata"]["generation"]
    twin.services["operator"].rerender_now(ep.namespace, ep.name)
    _wait(lambda: twin.store.get("apps", "deployments", ep.name, ep.namespace)["metadata"]["generation"]
          != generation, "the operator's re-render")

    server = converged.servers[PROD]
    env = {**os.environ, "KVFLEET_HISTORY_URL": drift_history.engine.url.render_as_string(hide_password=False)}
    server.latency_s = 0.2  # every API call of the wave is slow enough to be killed between pause and restore
    proc = subprocess.Popen([sys.executable, "-c", WAVE_TASK.format(here=str(HERE), name=ep.name, holder=VICTIM)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctx = drift_ctx(PROD)
    try:
        _wait(lambda: proc.poll() is not None or (twin.store.get(
            "apps", "deployments", C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE)["metadata"].get(
            "annotations") or {}).get(C.PAUSED_BY_ANNOTATION) == VICTIM, "the wave's pause", timeout=120)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed_at = datetime.now(UTC)
    finally:
        server.latency_s = 0.0
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    state = operator_pause.pause_state(ctx)
    assert state["paused_by"] == VICTIM and state["replicas"] == 0  # left paused by the dead worker

    leases = Leases(drift_history.engine)
    lease = leases.get(ctx.cluster.key)
    assert (lease["holder"], lease["state"]) == (VICTIM, "active")
    # Ten seconds after the kill the dead task's lease still blocks a new rollout (its ttl is 60 s) ...
    blocked = leases.try_take(ctx.cluster.key, "kvfleet_rollout/next", "rollout", now=killed_at + timedelta(seconds=10))
    assert blocked["holder"] == VICTIM

    # ... and the drift check with remediation, three minutes after the death, restores the operator.
    later = killed_at + timedelta(minutes=3)
    run_key = "kvfleet_drift_check/after-the-kill"
    drift_history.runs.start(run_key, dag_id="kvfleet_drift_check", run_id="after-the-kill", trigger="test",
                            triggered_by=None, params={})
    check_ctx = drift_ctx(PROD, history=drift_history, step_key=StepKey(run_key, "check_cluster"))
    result = drift.check(check_ctx, remediate=True, now=later)
    paused = [f for f in result.findings if f.kind == "operator_paused"]
    assert paused and f"kvfleet run {VICTIM}" in paused[0].actual and "pauser is dead" in paused[0].actual
    (restore,) = [r for r in result.remediations if r["action"] == "restore_operator"]
    assert restore["outcome"] == "changed"
    assert restore["detail"]["restored_from"] == VICTIM
    assert restore["detail"]["lease_taken_over_from"] == VICTIM
    assert "expired" in restore["detail"]["pauser"]
    state = operator_pause.pause_state(ctx)
    assert state["paused_by"] is None and state["ready"] >= 1
    steps = [s for s in drift_history.runs.steps(run_key) if s["step"].startswith("drift_remediate:restore_operator")]
    assert steps and steps[0]["detail"]["detail"]["restored_from"] == VICTIM  # in the audit trail

    # The cluster is free: a new rollout takes the lease (nobody holds it any more).
    assert leases.get(ctx.cluster.key) is None
    ClusterLock(drift_history, ctx.cluster.key, "kvfleet_rollout/next", "rollout", wait_s=0).acquire().release()
    # The restored operator renders the endpoint again at its declared replicas: nothing is left at 0.
    _wait(lambda: _ready(twin, ep) == ep.replicas, "the endpoint's pods back")


def test_a_retry_of_the_same_run_carries_on_its_own_pause(converged, drift_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx = drift_ctx(PROD)
    run = "kvfleet_rollout/manual__retry"
    operator_pause.pause(ctx, run)  # try 1 paused, then hit a temporary error
    try:
        with pytest.raises(GateRefused, match="already paused by kvfleet_rollout/manual__retry"):
            operator_pause.pause(ctx, "kvfleet_rollout/another-run")
        assert operator_pause.pause(ctx, run) == 1  # try 2 of the same run: its own pause, carried on
        assert operator_pause.pause(ctx, f"{run}#drift") == 1  # a helper acting for the same run, too
        assert operator_pause.restore(ctx, "kvfleet_rollout/another-run")["restored"] is False
    finally:
        assert operator_pause.restore(ctx, run)["restored"] is True


RBAC = (HERE.parents[2] / "k8s" / "rbac" / "cluster.yaml")


@pytest.mark.skipif(C.OPERATOR_HELM_DEPLOYMENT not in (RBAC.read_text() if RBAC.exists() else ""),
                    reason="k8s/rbac/cluster.yaml does not grant get/patch on the Helm-installed controller "
                           f"{C.OPERATOR_HELM_DEPLOYMENT} yet")
def test_the_operator_is_found_under_the_helm_charts_name(converged, drift_ctx, drift_history) -> None:  # type: ignore[no-untyped-def]
    twin = converged.twin(PROD)
    operator = twin.services["operator"]
    ctx = drift_ctx(PROD)
    try:
        operator.reinstall_as(C.OPERATOR_HELM_DEPLOYMENT)
        ctx.memo.clear()
        _wait(lambda: operator.controller_ready(), "the Helm-named controller")
        # A ready pod precedes the Deployment's status.readyReplicas (the Deployment controller's next pass), and
        # the product reads the latter: wait for it rather than race it.
        _wait(lambda: operator_pause.pause_state(ctx)["ready"] >= 1, "the Helm-named Deployment's readyReplicas")
        state = operator_pause.pause_state(ctx)
        assert state["name"] == C.OPERATOR_HELM_DEPLOYMENT and state["ready"] >= 1
        operator_pause.pause(ctx, "kvfleet_rollout/helm")
        dep = twin.store.get("apps", "deployments", C.OPERATOR_HELM_DEPLOYMENT, C.OPERATOR_NAMESPACE)
        assert dep["spec"]["replicas"] == 0 and dep["metadata"]["annotations"][C.PAUSED_BY_ANNOTATION] == \
            "kvfleet_rollout/helm"
        result = drift.check(drift_ctx(PROD, history=drift_history), now=datetime.now(UTC) + timedelta(hours=1))
        (paused,) = [f for f in result.findings if f.kind == "operator_paused"]
        assert paused.object_ref == f"Deployment/{C.OPERATOR_NAMESPACE}/{C.OPERATOR_HELM_DEPLOYMENT}"
        assert operator_pause.restore(ctx, "kvfleet_rollout/helm")["restored"] is True
        assert operator_pause.pause_state(ctx)["ready"] >= 1
    finally:
        operator.reinstall_as(C.OPERATOR_DEPLOYMENT)
        ctx.memo.clear()
        _wait(lambda: operator.controller_ready(), "the add-on-named controller")
