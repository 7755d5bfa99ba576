"""Answering kvfleet's rollout gates without the UI: list the gates waiting for a human, and respond to one.

Used by `kvfleet gate list|respond` (platform teams on a terminal), by the demo (which has no human at the
terminal: it answers the safe default after a grace period, and says so), and by the DAG tests. It calls the
same code path as Airflow's REST API handler (``update_hitl_detail``), so the response is validated against
the gate's options and the parked task resumes exactly as after a click in the UI.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class PendingGate:
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    subject: str
    body: str | None
    options: list[str]
    asked_at: datetime | None = None  # when the gate opened (Airflow's HITL record)


def pending(dag_id: str = "kvfleet_rollout") -> list[PendingGate]:
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(TaskInstance, HITLDetail).join(HITLDetail, HITLDetail.ti_id == TaskInstance.id)
            .where(TaskInstance.dag_id == dag_id, TaskInstance.state == TaskInstanceState.AWAITING_INPUT)
        ).all()
        return [PendingGate(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, d.subject, d.body, list(d.options),
                            d.created_at)
                for ti, d in rows if not d.response_received]


def respond(gate: PendingGate, option: str, user: str) -> Any:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
    from airflow.api_fastapi.core_api.datamodels.hitl import UpdateHITLDetailPayload
    from airflow.api_fastapi.core_api.routes.public.hitl import update_hitl_detail
    from airflow.utils.session import create_session

    class _User(BaseUser):  # the responder Airflow records, as its REST route gets it from the auth manager
        def __init__(self, name: str) -> None:
            self.name = name

        def get_id(self) -> str:
            return self.name

        def get_name(self) -> str:
            return self.name

    if option not in gate.options:
        raise ValueError(f"option {option!r} is not one of {', '.join(gate.options)} for {gate.task_id}")
    with create_session() as session:
        return update_hitl_detail(dag_id=gate.dag_id, dag_run_id=gate.run_id, task_id=gate.task_id,
                                  update_hitl_detail_payload=UpdateHITLDetailPayload(chosen_options=[option],
                                                                                     params_input={}),
                                  user=_User(user), session=session, map_index=gate.map_index)
