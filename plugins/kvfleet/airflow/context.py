"""What kvfleet needs from Airflow's task context: the run key, the trigger and who pulled it.

Called by every task function in ``kvfleet.airflow``. Kept apart so the stages never import Airflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvfleet.history.repo import StepKey


@dataclass(frozen=True)
class RunInfo:
    run_key: str
    dag_id: str
    run_id: str
    trigger: str  # schedule | manual | backfill | asset | test
    triggered_by: str | None
    task_id: str
    map_index: int

    @property
    def step_key(self) -> StepKey:
        return StepKey(self.run_key, self.task_id, self.map_index)

    @property
    def actor(self) -> str:
        return self.triggered_by or f"airflow:{self.trigger}"


def _trigger(dag_run: Any) -> str:
    run_type = str(getattr(dag_run, "run_type", "manual") or "manual").lower().split(".")[-1]
    return {"scheduled": "schedule"}.get(run_type, run_type)


def dag_run_facts(context: Any) -> dict[str, Any]:
    """What a DAG-level callback knows about its run. Airflow 3.3 gives DAG callbacks either the full context
    (``dag_run``, ``ti``, ``params``...) or, when the server sent no task instance, only ``dag``, ``run_id``
    and ``reason``; this works with both."""
    dag_run = context.get("dag_run")
    dag = context.get("dag")
    dag_id = getattr(dag_run, "dag_id", None) or getattr(dag, "dag_id", None) or "unknown"
    run_id = getattr(dag_run, "run_id", None) or context.get("run_id") or "unknown"
    params = context.get("params")
    if not params:
        params = getattr(dag_run, "conf", None) or {}
    try:
        params = dict(params)
    except (TypeError, ValueError):
        params = {}
    return {"run_key": f"{dag_id}/{run_id}", "dag_id": str(dag_id), "run_id": str(run_id),
            "trigger": _trigger(dag_run) if dag_run is not None else "unknown",
            "triggered_by": getattr(dag_run, "triggering_user_name", None), "params": params}


def run_info(context: dict[str, Any] | None = None) -> RunInfo:
    if context is None:
        from airflow.sdk import get_current_context

        context = dict(get_current_context())
    dag_run = context["dag_run"]
    ti = context["ti"]
    trigger = _trigger(dag_run)
    user = getattr(dag_run, "triggering_user_name", None)
    map_index = getattr(ti, "map_index", -1)
    return RunInfo(
        run_key=f"{dag_run.dag_id}/{dag_run.run_id}",
        dag_id=dag_run.dag_id,
        run_id=dag_run.run_id,
        trigger=trigger,
        triggered_by=user,
        task_id=ti.task_id,
        map_index=-1 if map_index is None else int(map_index),
    )
