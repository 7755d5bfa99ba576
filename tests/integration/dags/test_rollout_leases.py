"""Failed stages free the lease: every exit path of a rollout releases the cluster lease and the
parallelism slot it took — here the worst one: ``cluster.stages`` failing on every try (its teardown used to be
skipped because its setup failed, and the lease stayed for 3 h). Also the abort path (a human rejects at a gate)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from test_rollout_sandbox import answer_when_asked, conf, gated_rollout

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _leases(history):  # type: ignore[no-untyped-def]
    with history.engine.connect() as conn:
        return [dict(r) for r in conn.execute(text("SELECT cluster, holder, state FROM cluster_locks")).mappings()]


def test_stages_failing_on_every_try_leave_no_lease_and_no_slot(dagbag, history, sandbox_process,  # type: ignore[no-untyped-def]
                                                                  small_fleet) -> None:
    dag = dagbag.get_dag("kvfleet_rollout")
    # Every UpdateCluster answers 409: the preflight (read-only) passes, then stage 1 fails on each of its 3 tries
    # after taking the lease. (A fault on every AWS call would stop the run at the preflight, before any lease.)
    sandbox_process.admin("/fault", {"kind": "api_conflict", "count": 1000, "resource": "UpdateCluster",
                                     "target": "aws"})
    try:
        dr = dag.test(run_conf=conf(small_fleet, clusters=["c-patch"]))
    finally:
        sandbox_process.admin("/fault", {"cluster": "*", "kind": "clear"})
    assert dr.state == "failed"
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    assert tis["cluster.stages"].state == "failed" and tis["cluster.stages"].try_number == 3
    # The teardown ran although its stages failed (whatever its own outcome, it releases the lease and the slot).
    assert tis["cluster.release"].state in ("success", "failed")
    assert _leases(history) == []  # neither the cluster's lease nor the run's slot is left behind
    # and the next run takes the cluster at once
    again = dag.test(run_conf=conf(small_fleet, clusters=["c-patch"], gate="none"))
    assert again.state == "success"
    assert _leases(history) == []


def test_an_aborted_rollout_leaves_no_lease(dagbag, history, sandbox_process, small_fleet) -> None:  # type: ignore[no-untyped-def]
    dr = gated_rollout(dagbag, small_fleet, lambda done: answer_when_asked("Reject", "bob", done))
    assert dr.state == "failed"
    assert _leases(history) == []


def test_a_gate_answered_then_parked_again_by_dag_test_is_resumed(dagbag, history, sandbox_process,  # type: ignore[no-untyped-def]
                                                                   small_fleet) -> None:
    """dag.test()'s lost resume, made to happen: the Reject is recorded and, in the same transaction, the task is
    written back to awaiting_input (what dag.test's in-process runner does when the answer lands between its park
    and its own state write). hitl.resume_stranded (the gate watchdog calls it every second) resumes it: the run
    ends, rejected, and leaves no lease. Without it dag.test waits for ever; a bound here fails the task instead."""
    import threading

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    from kvfleet.airflow import hitl

    def _ti(gate: hitl.PendingGate) -> Any:
        return select(TaskInstance).filter_by(dag_id=gate.dag_id, run_id=gate.run_id, task_id=gate.task_id,
                                              map_index=gate.map_index)

    stranded, stuck = threading.Event(), threading.Event()

    def strand(done: threading.Event) -> None:
        while not done.wait(0.2):
            for gate in hitl.pending():
                with create_session() as session:
                    hitl.respond(gate, "Reject", "bob", session=session)
                    ti = session.scalars(_ti(gate).with_for_update()).one()
                    ti.state = TaskInstanceState.AWAITING_INPUT  # the runner's unlocked write
                stranded.set()
                # bounded: still parked 60 s later means nothing resumed it; fail it so dag.test ends
                if done.wait(60):
                    return
                with create_session() as session:
                    ti = session.scalars(_ti(gate)).one()
                    if ti.state == TaskInstanceState.AWAITING_INPUT:
                        stuck.set()
                        ti.state = TaskInstanceState.FAILED
                return

    dr = gated_rollout(dagbag, small_fleet, strand)
    assert stranded.is_set() and not stuck.is_set()
    assert dr.state == "failed"
    assert _leases(history) == []
