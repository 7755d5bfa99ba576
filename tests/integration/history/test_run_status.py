"""The DAG callbacks of kvfleet.airflow.run_status against real PostgreSQL, with contexts shaped as Airflow 3.3
gives them (a task failure callback's context carries the exception; a DAG callback's may lack ``dag_run``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvfleet.airflow import run_status
from kvfleet.airflow.boundary import task_boundary
from kvfleet.errors import GateRefused, InventoryError
from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration


def _raised(exc: Exception) -> BaseException:
    @task_boundary
    def task() -> None:
        raise exc

    try:
        task()
    except BaseException as caught:  # AirflowFailException from the kvfleet error, as in a real task
        return caught
    raise AssertionError("no exception")


def _context(task_id: str, exc: BaseException | None = None, run_id: str = "manual__1") -> dict[str, object]:
    dag_run = SimpleNamespace(dag_id="kvfleet_rollout", run_id=run_id, run_type="manual",
                              triggering_user_name="erin", conf={"lobs": ["nope"]})
    return {"dag_run": dag_run, "ti": SimpleNamespace(task_id=task_id, map_index=-1), "exception": exc,
            "params": {"lobs": ["nope"]}, "reason": "task_failure"}


def test_a_plan_refusal_is_recorded_with_its_message_and_closed_refused(history: HistoryRepos) -> None:
    ctx = _context("plan", _raised(InventoryError(["lobs: unknown LOB 'nope' (known: retail, search)"])))
    run_status.on_task_failure(ctx)
    assert run_status.on_dag_failure(ctx) == "refused"
    run = history.runs.get("kvfleet_rollout/manual__1")
    assert run is not None and run["status"] == "refused" and run["triggered_by"] == "erin"
    assert "unknown LOB 'nope'" in run["reason"] and run["params"] == {"lobs": ["nope"]}


def test_a_missing_fleet_file_in_plan_is_a_refusal(history: HistoryRepos) -> None:
    ctx = _context("plan", FileNotFoundError(2, "No such file or directory", "/fleet.yaml"), run_id="m2")
    run_status.on_task_failure(ctx)
    assert run_status.on_dag_failure(ctx) == "refused"


def test_a_failing_stage_closes_failed_and_a_minimal_context_still_works(history: HistoryRepos) -> None:
    history.runs.start("kvfleet_rollout/m3", dag_id="kvfleet_rollout", run_id="m3", trigger="manual",
                      triggered_by=None, params={})
    ctx = _context("cluster.stages", RuntimeError("UpdateCluster failed"), run_id="m3")
    run_status.on_task_failure(ctx)
    minimal = {"dag": SimpleNamespace(dag_id="kvfleet_rollout"), "run_id": "m3", "reason": "task_failure"}
    assert run_status.on_dag_failure(minimal) == "failed"
    assert history.runs.get("kvfleet_rollout/m3")["reason"] == "RuntimeError: UpdateCluster failed"  # type: ignore[index]


def test_success_callback_and_classification() -> None:
    assert run_status.classify_failure("kvfleet_curvine_upgrade", "upgrade", _raised(GateRefused("x"))) == (
        "curvine-upgrade", "refused")
    assert run_status.classify_failure("kvfleet_rollout", "cluster.wave_1", _raised(GateRefused("x"))) == (
        "run", "failed")


def test_dag_success_callback_writes_success(history: HistoryRepos) -> None:
    history.runs.start("kvfleet_rollout/m4", dag_id="kvfleet_rollout", run_id="m4", trigger="manual",
                      triggered_by=None, params={})
    assert run_status.on_dag_success({"dag": SimpleNamespace(dag_id="kvfleet_rollout"), "run_id": "m4",
                                      "reason": "success"}) == "success"


def test_a_per_cluster_task_failure_names_its_cluster(history: HistoryRepos) -> None:
    """From the task's ``cluster`` argument when the context's task carries it, else from what the task instance
    recorded (its steps, then its write-ahead intents); None when it recorded nothing."""
    from kvfleet.history.keys import StepEvent, StepKey

    run_key = "kvfleet_rollout/m5"
    history.runs.start(run_key, dag_id="kvfleet_rollout", run_id="m5", trigger="manual", triggered_by=None, params={})
    history.runs.record_step(StepKey(run_key, "cluster.stages", 0), StepEvent("tiered_storage", "tiered-storage",
                                                                         "changed", cluster="c-a"))
    history.audit.intent(StepKey(run_key, "cluster.wave_0", 1), "pause_operator", "Deployment x", cluster="c-b")

    def fail(task_id: str, map_index: int, task: object = None) -> None:
        ctx = _context(task_id, RuntimeError("409"), run_id="m5")
        ctx["ti"] = SimpleNamespace(task_id=task_id, map_index=map_index)
        ctx["task"] = task
        run_status.on_task_failure(ctx)

    fail("cluster.stages", 0)
    fail("cluster.wave_0", 1)
    fail("cluster.wave_1", 2, task=SimpleNamespace(op_kwargs={"cluster": "c-c"}))
    fail("cluster.release", 3)
    named = {(s["task_id"], s["cluster"]) for s in history.runs.steps(run_key) if s["step"].startswith("error:")}
    assert named == {("cluster.stages", "c-a"), ("cluster.wave_0", "c-b"), ("cluster.wave_1", "c-c"),
                     ("cluster.release", None)}
