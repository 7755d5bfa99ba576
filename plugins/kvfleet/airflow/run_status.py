"""Every kvfleet DAG run ends with a terminal status in the history, whatever failed.

Wire into each kvfleet DAG (the DAG files own the wiring)::

    @dag(..., on_success_callback=run_status.on_dag_success, on_failure_callback=run_status.on_dag_failure,
         default_args={..., "on_failure_callback": run_status.on_task_failure})

``on_task_failure`` (a task's final failure, in the worker: it has the exception) records an ``error:<task>``
step carrying the exception's message, opening the run's row if the run died before ``start_run`` (an unknown
LOB, a missing fleet file). ``on_dag_success`` / ``on_dag_failure`` (Airflow 3.3 runs DAG callbacks in the DAG
processor with the run's context: ``dag``, ``run_id``, ``reason`` and, when the server sent one, ``dag_run`` and
the last task instance ``ti``) call ``Runs.close`` with Airflow's final state, which derives
``success``, ``completed_with_failures``, ``failed``, ``aborted`` or ``refused`` from the recorded steps. A run
Airflow marks failed is never left ``running`` nor recorded ``success``.

Callbacks never raise (Airflow would only log it); a history that cannot be reached is logged as an error.
"""

from __future__ import annotations

import logging
from typing import Any

from kvfleet.airflow.context import dag_run_facts
from kvfleet.errors import GateRefused, InventoryError, PermanentError

log = logging.getLogger(__name__)
# Tasks that open a run: a permanent error there refuses the whole plan.
OPENING_TASKS = frozenset({"plan", "scope"})
# A refusal in these DAGs is the refusal of the run (the Curvine upgrade's and scale-out's safety gates).
REFUSAL_STAGE_OF_DAG = {"kvfleet_curvine_upgrade": "curvine-upgrade", "kvfleet_curvine_scale_out": "curvine-scale-out"}


def _root(exc: BaseException | None) -> BaseException | None:
    """The kvfleet error under Airflow's wrapper (``task_boundary`` raises AirflowFailException from it)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, PermanentError | FileNotFoundError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def classify_failure(dag_id: str, task_id: str, exc: BaseException | None) -> tuple[str, str]:
    """(stage, outcome) of a task's final failure: a refusal of the plan or of an upgrade, or a failure."""
    root = _root(exc)
    base_task = task_id.rsplit(".", 1)[-1]
    if base_task in OPENING_TASKS and isinstance(root, PermanentError | FileNotFoundError):
        return "plan", "refused"
    if isinstance(root, InventoryError):
        return "plan", "refused"
    if isinstance(root, GateRefused) and dag_id in REFUSAL_STAGE_OF_DAG:
        return REFUSAL_STAGE_OF_DAG[dag_id], "refused"
    return "run", "failed"


def _message(exc: BaseException | None) -> str:
    if exc is None:
        return "the task failed (no exception in its context)"
    root = _root(exc) or exc
    return f"{type(root).__name__}: {str(root)[:1000]}"


def _cluster_of(context: Any) -> str | None:
    """The cluster a mapped per-cluster task worked on: its key, once the task knew its cluster
    (``cluster_context`` labels the task with it), else its ``cluster`` argument, when it has one."""
    from kvfleet.airflow.params import MAP_LABEL

    labelled = context.get(MAP_LABEL)
    if isinstance(labelled, str) and labelled:
        return labelled
    kwargs = getattr(context.get("task"), "op_kwargs", None)
    value = kwargs.get("cluster") if isinstance(kwargs, dict) else None
    return value if isinstance(value, str) else None


def on_task_failure(context: Any) -> None:
    """Task-level ``on_failure_callback``: record the failing task's exception message as a step (with the
    cluster, for a per-cluster task)."""
    try:
        from kvfleet.history.keys import StepEvent, StepKey
        from kvfleet.history.runs import Runs

        facts = dag_run_facts(context)
        ti = context.get("ti")
        task_id = str(getattr(ti, "task_id", "") or "unknown")
        map_index = getattr(ti, "map_index", -1)
        map_index = -1 if map_index is None else int(map_index)
        exc = context.get("exception")
        stage, outcome = classify_failure(facts["dag_id"], task_id, exc if isinstance(exc, BaseException) else None)
        runs = Runs()
        key = StepKey(facts["run_key"], task_id, map_index)
        runs.ensure(facts["run_key"], dag_id=facts["dag_id"], run_id=facts["run_id"], trigger=facts["trigger"],
                    triggered_by=facts["triggered_by"], params=facts["params"])
        runs.record_step(key,
                         StepEvent(step=f"error:{task_id}", stage=stage, outcome=outcome,
                                   cluster=_cluster_of(context) or runs.cluster_of_task(key),
                                   detail={"error": _message(exc if isinstance(exc, BaseException) else None),
                                           "task_id": task_id}),
                         actor=facts["triggered_by"] or f"airflow:{facts['trigger']}")
    except Exception:
        log.exception("kvfleet: could not record the task failure in the history")


def _close(context: Any, airflow_state: str) -> str | None:
    try:
        from kvfleet.history.runs import Runs

        facts = dag_run_facts(context)
        ti = context.get("ti")
        failed_task = getattr(ti, "task_id", None) if airflow_state == "failed" else None
        reason = context.get("reason")
        reason = None if reason in (None, "success") else str(reason)
        if failed_task and reason:
            reason = f"{reason} ({failed_task})"
        status = Runs().close(facts["run_key"], airflow_state, reason, dag_id=facts["dag_id"],
                              run_id=facts["run_id"], trigger=facts["trigger"],
                              triggered_by=facts["triggered_by"], params=facts["params"], failed_task=failed_task)
        log.info("kvfleet: run %s closed as %s (Airflow: %s)", facts["run_key"], status, airflow_state)
        return status
    except Exception:
        log.exception("kvfleet: could not write the run's terminal status to the history")
        return None


def on_dag_success(context: Any) -> str | None:
    """DAG-level ``on_success_callback``."""
    return _close(context, "success")


def on_dag_failure(context: Any) -> str | None:
    """DAG-level ``on_failure_callback``."""
    return _close(context, "failed")
