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


def run_info(context: dict[str, Any] | None = None) -> RunInfo:
    if context is None:
        from airflow.sdk import get_current_context

        context = dict(get_current_context())
    dag_run = context["dag_run"]
    ti = context["ti"]
    run_type = str(getattr(dag_run, "run_type", "manual") or "manual").lower().split(".")[-1]
    trigger = {"scheduled": "schedule"}.get(run_type, run_type)
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
