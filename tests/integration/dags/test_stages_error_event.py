"""Deferral keeps the lease promise: ``cluster.stages`` resumed with a trigger's ``error`` event (a lease wait out
of patience, a cluster that did not converge in time, a terminal state) frees the cluster lease and the run's
parallelism slot it holds before it fails, like any other failure of the task, and fails in the error model's
terms: a lease wait's timeout is ``LeaseWaitTimeout`` (permanent: Airflow fails the task without a retry), a
convergence timeout ``ConvergenceTimeout`` (temporary: the retry observes again), a terminal state permanent.

The task body runs in this process under an Airflow task context naming the run (``set_current_context``, as the
task runner sets it); what it held before its deferral is taken by the rollout's own slot and lease steps, on the
real history store."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from airflow.sdk.execution_time.context import set_current_context
from sqlalchemy import text

from kvfleet.airflow import rollout
from kvfleet.airflow.request import RolloutRequest
from kvfleet.errors import ConvergenceTimeout, LeaseWaitTimeout, PermanentError
from kvfleet.fleet.inventory import InventoryWarning
from kvfleet.fleet.pinning import pin
from kvfleet.history.leases import Leases
from kvfleet.history.repos import HistoryRepos

# What the plan task maps the per-cluster tasks over, and what leases and slots are held by: the cluster's key.
CLUSTER = "default/us-east-1/ml-prod-use1"
RUN_ID = "manual__stages-error-event"
RUN_KEY = f"kvfleet_rollout/{RUN_ID}"
OTHER = "kvfleet_curvine_upgrade/other-run"


@pytest.fixture
def in_task(history: HistoryRepos, example_fleet: Path) -> Iterator[None]:
    """The Airflow context of this run's ``cluster.stages`` (what ``kvfleet.airflow.context.run_info`` reads), its
    run opened in the history with the inventory its plan task pinned."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InventoryWarning)
        pinned = pin(example_fleet)
    history.runs.start(RUN_KEY, dag_id="kvfleet_rollout", run_id=RUN_ID, trigger="manual", triggered_by="ann",
                       params={}, inventory=pinned)
    dag_run = SimpleNamespace(dag_id="kvfleet_rollout", run_id=RUN_ID, run_type="manual", triggering_user_name="ann")
    with set_current_context({"dag_run": dag_run, "ti": SimpleNamespace(task_id="cluster.stages", map_index=0)}):  # type: ignore[typeddict-item]
        yield


def _params(fleet: Path) -> dict[str, Any]:
    return {"fleet": str(fleet), "clusters": [CLUSTER], "max_parallel_clusters": 2, "lock_wait_minutes": 0.02}


def _locks(history: HistoryRepos) -> list[tuple[str, str]]:
    with history.engine.connect() as conn:
        return sorted((r.cluster, r.holder) for r in conn.execute(text("SELECT cluster, holder FROM cluster_locks")))


def _take_before_deferral(params: dict[str, Any], history: HistoryRepos, *, lease: bool) -> str:
    """What the task took before it deferred: a parallelism slot, and the cluster lease (parked) when it went on
    to wait for the cluster itself. Returns the slot's name."""
    req = RolloutRequest.from_params(params)
    ctx = rollout.rollout_context(CLUSTER, req)
    try:
        slot = rollout._take_slot_or_defer(ctx, req, history, {}, {})
        if lease:
            rollout._take_lease_or_defer(ctx, req, {}, {}).park()
    finally:
        ctx.close()
    return slot


@pytest.mark.parametrize(("wait", "event", "raised"), [
    # waited in the triggerer for the cluster to converge before stage 1 changes it (it held the slot and the
    # parked lease): stages.base.Pending "before:cluster", ClusterReadyTrigger
    ("stage:before:cluster", {"status": "error", "reason": "timeout", "message": "c still Updating after 3600s"},
     ConvergenceTimeout),
    ("stage:before:cluster", {"status": "error", "message": "cluster ml-prod-use1 is Failed"}, PermanentError),
    # an add-on moving before stage 2 (the rollout's own look, ClusterReadyTrigger)
    ("ready:cert-manager", {"status": "error", "message": "cert-manager CREATE_FAILED: x"}, PermanentError),
    # waited after a change of the stage's own (ClusterReadyTrigger after UpdateCluster; KubeReadyTrigger for the
    # operator's controller and for Curvine's PVCs), with the stage's progress in the deferral's state
    ("stage:after:cluster", {"status": "error", "reason": "timeout", "message": "c still Updating after 3600s"},
     ConvergenceTimeout),
    ("stage:after:operator", {"status": "error", "reason": "timeout",
                              "message": "operator controller not Ready after 600s"}, ConvergenceTimeout),
    ("stage:after:operator", {"status": "error", "message": "check 'operator': no credentials"}, PermanentError),
    ("stage:after:pvcs", {"status": "error", "reason": "timeout",
                          "message": "PVC retail/curvine-pvc Pending after 600s"}, ConvergenceTimeout),
])
def test_a_cluster_wait_s_error_event_frees_the_slot_and_the_lease(in_task, history: HistoryRepos, example_fleet,  # type: ignore[no-untyped-def]
                                                                   wait: str, event: dict[str, Any],
                                                                   raised: type[Exception]) -> None:
    params = _params(example_fleet)
    slot = _take_before_deferral(params, history, lease=True)
    assert _locks(history) == sorted([(CLUSTER, RUN_KEY), (slot, f"{RUN_KEY}#{CLUSTER}")])
    resume = {"done": [], "wait": wait, "since": time.time() - 3600, "event": event}
    if wait.startswith("stage:"):  # the stage's progress at that wait (read by act on a resume, not on an error)
        resume["progress"] = {"stage:after:cluster": {"decision": {"mode": "Enable", "percent": 25}},
                              "stage:after:operator": {"eks": "eks-x", "results": {}},
                              "stage:after:pvcs": {"detail": {"pvcs": {"retail": "changed"}}, "changed": True},
                              }.get(wait, {})
        resume["done"] = [{"stage": "tiered_storage"}, {"stage": "addons"}] if wait.endswith("pvcs") else []
    # through the task boundary: a temporary error is raised as itself, a permanent one as AirflowFailException
    with pytest.raises((raised, AirflowFailException)) as info:
        rollout.run_cluster_stages(CLUSTER, params, kvfleet_resume=resume)
    err = info.value if isinstance(info.value, raised) else info.value.__cause__
    assert isinstance(err, raised) and event["message"] in str(err), repr(info.value)
    assert isinstance(info.value, AirflowFailException) == isinstance(err, PermanentError)
    assert _locks(history) == []  # neither the cluster's lease nor the run's slot is left for the teardown


def test_a_lease_wait_s_timeout_frees_the_slot_fails_permanently_and_leaves_the_holder_s_lease(  # type: ignore[no-untyped-def]
        in_task, history: HistoryRepos, example_fleet) -> None:
    params = _params(example_fleet)
    leases = Leases(history.engine)
    leases.try_take(CLUSTER, OTHER, "curvine upgrade", 3600)
    slot = _take_before_deferral(params, history, lease=False)
    assert _locks(history) == sorted([(CLUSTER, OTHER), (slot, f"{RUN_KEY}#{CLUSTER}")])
    event = {"status": "error", "reason": "timeout", "message": f"lease on {CLUSTER} still held by {OTHER}"}
    with pytest.raises(AirflowFailException) as info:  # permanent: no retry
        rollout.run_cluster_stages(CLUSTER, params,
                                   kvfleet_resume={"done": [], "wait": "lease", "since": time.time() - 60,
                                                   "event": event})
    assert isinstance(info.value.__cause__, LeaseWaitTimeout), repr(info.value.__cause__)
    assert OTHER in str(info.value)
    assert _locks(history) == [(CLUSTER, OTHER)]  # the run's slot freed; the other run's lease untouched


def test_the_teardown_frees_the_slot_and_the_lease_even_without_an_inventory(  # type: ignore[no-untyped-def]
        in_task, history: HistoryRepos, example_fleet) -> None:
    """A run whose pinned inventory cannot be read (gone from the history, or no longer valid after an upgrade):
    its teardown cannot build a context, fails permanently naming the run, and still frees what the run holds."""
    params = _params(example_fleet)
    slot = _take_before_deferral(params, history, lease=True)
    assert _locks(history) == sorted([(CLUSTER, RUN_KEY), (slot, f"{RUN_KEY}#{CLUSTER}")])
    with history.engine.begin() as conn:
        conn.execute(text("UPDATE runs SET inventory_sha256 = NULL WHERE run_key = :k"), {"k": RUN_KEY})
    with pytest.raises(AirflowFailException, match=f"run {RUN_KEY}: the history store holds no pinned inventory"):
        rollout.release_cluster(CLUSTER, params)
    assert _locks(history) == []
