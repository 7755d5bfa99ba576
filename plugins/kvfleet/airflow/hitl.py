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


def respond(gate: PendingGate, option: str, user: str, session: Any = None) -> Any:
    """Answer ``gate`` with ``option`` as ``user``, in ``session`` when given (committed by its owner), else in
    a session of its own."""
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
    def answer(session: Any) -> Any:
        return update_hitl_detail(dag_id=gate.dag_id, dag_run_id=gate.run_id, task_id=gate.task_id,
                                  update_hitl_detail_payload=UpdateHITLDetailPayload(chosen_options=[option],
                                                                                     params_input={}),
                                  user=_User(user), session=session, map_index=gate.map_index)

    if session is not None:
        return answer(session)
    with create_session() as own:
        return answer(own)


def resume_stranded(dag_id: str = "kvfleet_rollout") -> list[str]:
    """Resume each gate that holds a response but is still parked (``awaiting_input``); returns them
    (``task_id[map_index] of run_id``).

    Only ``dag.test()`` strands a gate so (the demo and the DAG tests run it; a real deployment's workers change a
    task's state through the execution API only): after the in-process task parks, ``_run_task`` writes the
    parked state once more without a lock (airflow/sdk/definitions/dag.py, ``ti.set_state(taskrun_result.ti.state)``,
    Airflow 3.1), over a response recorded and resumed in between; ``dag.test()`` then waits for ever. The repair is
    Airflow's own for a response that beats the park (execution_api/routes/task_instances.py, the
    ``TIAwaitingInputStatePayload`` branch): under the task instance's row lock, ``handle_event_submit`` with the
    response as the resume event. Internal Airflow API, like ``update_hitl_detail`` above: Airflow has no public
    resume, and a second response is a 409."""
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import handle_event_submit
    from airflow.triggers.base import TriggerEvent
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    resumed: list[str] = []
    with create_session() as session:
        tis = session.scalars(select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.state == TaskInstanceState.AWAITING_INPUT,
        ).with_for_update(of=TaskInstance)).all()
        for ti in tis:
            detail = session.scalar(select(HITLDetail).where(HITLDetail.ti_id == ti.id)
                                    .with_for_update(of=HITLDetail))
            if detail is None or not detail.response_received:
                continue
            event = TriggerEvent(detail.as_resume_event_payload())  # type: ignore[no-untyped-call]
            handle_event_submit(event, task_instance=ti, session=session)
            resumed.append(f"{ti.task_id}[{ti.map_index}] of {ti.run_id}")
    return resumed
