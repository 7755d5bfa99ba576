"""kvfleet_rollout end to end through dag.test() against a sandbox fleet in its own process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from conftest import mutating_requests

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
# The history names a cluster by its key account/region/name (the small fleet declares no account).
PATCH = "default/us-east-1/c-patch"
KYVERNO = "default/us-west-2/c-kyverno"


def conf(fleet, **overrides):  # type: ignore[no-untyped-def]
    """Every Param explicitly: dag.test() keeps the Params of an earlier run in the same process."""
    base = {"fleet": str(fleet), "lobs": [], "clusters": [], "endpoints": [], "dry_run": False, "wave_size": 3,
            "max_parallel_clusters": 4, "canary": True, "bake_minutes": 0, "gate": "verify", "approval": "none",
            "remediate_drift": False, "prompt_tokens": 2000, "lock_wait_minutes": 10}
    return {**base, **overrides}


def _verdicts(history, run_key=None):  # type: ignore[no-untyped-def]
    rows = history.queries.rows("verifications", cutoff=EPOCH, lob=None, endpoint=None)
    return sorted((r["cluster"], r["endpoint"], r["verdict"]) for r in rows if run_key is None or r["run_key"] == run_key)


def _outcomes(history, run_key):  # type: ignore[no-untyped-def]
    return sorted((s["cluster"], s["endpoint"], s["outcome"]) for s in history.runs.steps(run_key) if s["stage"] == "endpoint")


def test_full_rollout_then_a_converged_rerun_changes_nothing(dagbag, history, sandbox_process, small_fleet) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.get_dag("kvfleet_rollout")
    dr = dag.test(run_conf=conf(small_fleet))
    assert dr.state == "success"
    run_key = f"kvfleet_rollout/{dr.run_id}"
    assert {v for *_, v in _verdicts(history, run_key)} == {"pass"}
    assert len(_verdicts(history, run_key)) == 5
    assert {o for *_, o in _outcomes(history, run_key)} == {"changed"}

    sandbox_process.admin("/reset-requests", {})
    dr2 = dag.test(run_conf=conf(small_fleet, gate="none", remediate_drift=True))
    assert dr2.state == "success"
    assert {o for *_, o in _outcomes(history, f"kvfleet_rollout/{dr2.run_id}")} == {"unchanged"}
    # remediate_drift ran the drift check on both clusters: nothing to fix on a converged fleet
    checks = [s for s in history.runs.steps(f"kvfleet_rollout/{dr2.run_id}") if s["step"].startswith("drift_check:")]
    assert sorted(s["cluster"] for s in checks) == sorted([KYVERNO, PATCH])
    assert mutating_requests(sandbox_process) == {"k8s": {}, "aws": []}


def test_failed_canary_stops_only_its_cluster(dagbag, history, sandbox_process, small_fleet) -> None:  # type: ignore[no-untyped-def]
    # c-patch's canary (alpha-chat) cannot read L2: pod B finds nothing pod A stored, so stage 5 says fail.
    answer = sandbox_process.admin("/fault", {"cluster": "c-patch", "kind": "l2_drop_reads", "namespace": "alpha",
                                              "endpoint": "alpha-chat"})
    assert answer["result"]["l2_reads_dropped"] == ["alpha/alpha-chat"]
    dr = dag_run = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet))
    run_key = f"kvfleet_rollout/{dag_run.run_id}"
    verdicts = _verdicts(history, run_key)
    assert (PATCH, "alpha/alpha-chat", "fail") in verdicts
    assert {v for c, _, v in verdicts if c == KYVERNO} == {"pass"}  # the other cluster's canary is unaffected
    outcomes = _outcomes(history, run_key)
    assert (PATCH, "alpha/alpha-docs", "skipped_by_gate") in outcomes  # the later wave never ran
    assert not any(e == "alpha/alpha-docs" for c, e, _ in verdicts if c == PATCH)
    assert {o for c, _, o in outcomes if c == KYVERNO} == {"changed"}
    assert dr.state == "success"  # a gate decision is not a task failure; the summary reports it
    assert _operator_state(small_fleet, "c-patch")["paused_by"] is None


def answer_when_asked(option: str, user: str, done: threading.Event) -> None:
    from kvfleet.airflow import hitl

    while not done.is_set():
        for gate in hitl.pending():
            hitl.respond(gate, option, user)
        time.sleep(0.5)


def gated_rollout(dagbag, fleet, answer: Callable[[threading.Event], None]):  # type: ignore[no-untyped-def]
    """kvfleet_rollout on c-patch with approval after the canary, while ``answer(done)`` runs in a thread (it
    returns once ``done`` is set, at the end of the run); the DagRun."""
    done = threading.Event()
    responder = threading.Thread(target=answer, args=(done,), daemon=True)
    responder.start()
    try:
        return dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(fleet, approval="after_canary",
                                                                    clusters=["c-patch"]))
    finally:
        done.set()
        responder.join(timeout=5)


@pytest.mark.parametrize("answer, state", [("Approve", "success"), ("Reject", "failed")])
def test_approval_after_canary_waits_for_a_human(dagbag, history, sandbox_process, small_fleet, answer,  # type: ignore[no-untyped-def]
                                                 state) -> None:
    dr = gated_rollout(dagbag, small_fleet, lambda done: answer_when_asked(answer, "alice", done))
    assert dr.state == state
    run_key = f"kvfleet_rollout/{dr.run_id}"
    outcomes = _outcomes(history, run_key)
    if answer == "Approve":
        assert (PATCH, "alpha/alpha-docs", "changed") in outcomes
    else:
        assert (PATCH, "alpha/alpha-docs", "aborted") in outcomes
        assert history.runs.get(run_key)["status"] == "aborted"
    assert _operator_state(small_fleet, "c-patch")["paused_by"] is None  # restored in both cases


def _operator_state(fleet, cluster):  # type: ignore[no-untyped-def]
    from kvfleet.fleet.inventory import load_inventory
    from kvfleet.stages import operator_pause
    from kvfleet.stages.base import StageContext

    inv = load_inventory(fleet)
    ctx = StageContext(inventory=inv, cluster=inv.cluster(cluster))
    try:
        return operator_pause.pause_state(ctx)
    finally:
        ctx.close()


def test_a_locked_cluster_makes_the_run_wait_then_fail(dagbag, history, sandbox_process, small_fleet) -> None:  # type: ignore[no-untyped-def]
    history.leases.try_take(PATCH, "kvfleet_curvine_upgrade/other-run", "curvine-upgrade", 600)
    dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, clusters=["c-patch"],
                                                                       lock_wait_minutes=0.02))
    assert dr.state == "failed"
    run_key = f"kvfleet_rollout/{dr.run_id}"
    steps = history.runs.steps(run_key)
    # nothing changed on the cluster: the plan, then only the failure of the task that waited for the lease
    assert steps[0]["stage"] == "plan", steps
    assert all(s["step"].startswith("error:") or s["stage"] == "preflight" for s in steps[1:]), steps  # read-only
    assert history.runs.get(run_key)["status"] == "failed"
    assert history.leases.get(PATCH)["holder"] == "kvfleet_curvine_upgrade/other-run"


def test_killed_mid_wave_then_resumed_converges_and_dry_run_lists_nothing_left(dagbag, history, sandbox_process,  # type: ignore[no-untyped-def]
                                                                               small_fleet) -> None:
    dag = dagbag.get_dag("kvfleet_rollout")
    base = conf(small_fleet, clusters=["c-patch"])
    # The wave dies inside the pause: the twin refuses kvfleet's second write of alpha-chat's Deployment (after
    # its temporary update strategy, the overlay patch itself) with a permanent 422.
    sandbox_process.admin("/fault", {"cluster": "c-patch", "kind": "fail_write", "resource": "deployments",
                                     "name": "alpha-chat", "namespace": "alpha", "nth": 2, "code": 422})
    broken = dag.test(run_conf=base)
    assert broken.state == "failed"
    assert _operator_state(small_fleet, "c-patch")["paused_by"] is None  # teardown restored it
    broken_key = f"kvfleet_rollout/{broken.run_id}"
    assert [s["outcome"] for s in history.runs.steps(broken_key) if s["step"].startswith("wave_state:")] == ["failed"]

    dry = dag.test(run_conf={**base, "dry_run": True})
    assert dry.state == "success"
    planned = history.queries.rows("planned_actions", run_key=f"kvfleet_rollout/{dry.run_id}")
    assert planned and all(p["cluster"] == PATCH for p in planned)
    assert any("kubectl patch deployment alpha-chat" in p["action"] for p in planned)

    resumed = dag.test(run_conf=base)
    assert resumed.state == "success"
    key = f"kvfleet_rollout/{resumed.run_id}"
    assert {v for *_, v in _verdicts(history, key)} == {"pass"}
    steps = history.runs.steps(key)
    assert len({(s["task_id"], s["map_index"], s["step"]) for s in steps}) == len(steps)

    sandbox_process.admin("/reset-requests", {})
    dry2 = dag.test(run_conf={**base, "dry_run": True})
    assert history.queries.rows("planned_actions", run_key=f"kvfleet_rollout/{dry2.run_id}") == []
    assert mutating_requests(sandbox_process) == {"k8s": {}, "aws": []}


def test_bad_params_are_refused_before_any_change(dagbag, history, sandbox_process, small_fleet) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.param import ParamValidationError

    dag = dagbag.get_dag("kvfleet_rollout")
    with pytest.raises(ParamValidationError):
        dag.test(run_conf=conf(small_fleet, wave_size=0))
    with pytest.raises(ParamValidationError):
        dag.test(run_conf=conf(small_fleet, approval="sometimes"))
    sandbox_process.admin("/reset-requests", {})
    dr = dag.test(run_conf=conf(small_fleet, clusters=["c-nope"]))
    assert dr.state == "failed" and history.runs.get(f"kvfleet_rollout/{dr.run_id}")["status"] == "refused"
    assert mutating_requests(sandbox_process) == {"k8s": {}, "aws": []}
