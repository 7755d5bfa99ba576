"""The deferral plumbing of the rollout: a trigger's event mapped onto kvfleet's error model, the
parallelism-slot form of ``LeaseFreeTrigger`` (any one of several leases; "ours" is the exact holder), its
serialization, and the deferrable ``@task`` resuming its body with the state it deferred with."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kvfleet.airflow.triggers.lease import LeaseFreeTrigger
from kvfleet.errors import ConvergenceTimeout, LeaseWaitTimeout, PermanentError


def _check_event(resume: dict[str, Any]) -> None:
    from kvfleet.airflow.rollout import _check_event as check

    check(resume)


@pytest.mark.parametrize(("wait", "event", "raised"), [
    ("lease", {"status": "error", "reason": "timeout", "message": "held by x"}, LeaseWaitTimeout),
    ("slot", {"status": "error", "reason": "timeout", "message": "no slot"}, LeaseWaitTimeout),
    ("lease", {"status": "error", "message": "lease table unreadable"}, PermanentError),
    ("ready:cluster", {"status": "error", "reason": "timeout", "message": "Updating after 3600s"}, ConvergenceTimeout),
    ("ready:cert-manager", {"status": "error", "message": "CREATE_FAILED: x"}, PermanentError),
])
def test_an_error_event_keeps_the_wait_s_meaning_in_the_error_model(wait: str, event: dict[str, Any],
                                                                      raised: type[Exception]) -> None:
    with pytest.raises(raised) as info:
        _check_event({"wait": wait, "event": event})
    assert event["message"] in str(info.value)
    # ConvergenceTimeout is temporary (retried, observing again); the lease wait's patience is permanent.
    assert isinstance(info.value, PermanentError) == (raised is not ConvergenceTimeout)


def test_a_success_event_or_no_event_lets_the_task_go_on() -> None:
    _check_event({})
    _check_event({"wait": "lease", "event": {"status": "success", "message": "no lease on c1"}})
    _check_event({"wait": "bake", "event": {"status": "success"}})  # DateTimeTrigger's payload carries no error


def test_the_slot_form_of_the_lease_trigger_round_trips_through_plain_json() -> None:
    trigger = LeaseFreeTrigger("c1", "kvfleet_rollout/r1#c1", poll_s=1, timeout_s=60,
                               names=["slot:kvfleet_rollout/r1:0", "slot:kvfleet_rollout/r1:1"], exact_holder=True)
    classpath, kwargs = trigger.serialize()
    again = LeaseFreeTrigger(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert again.names == trigger.names and again.exact_holder and again.started_at == trigger.started_at


def _first(trigger: LeaseFreeTrigger) -> dict[str, Any]:
    async def first() -> Any:
        return await anext(trigger.run())

    return dict(asyncio.run(first()).payload)


def test_slot_trigger_waits_while_every_slot_is_held_by_the_run_s_other_clusters(fresh_db_url: str) -> None:
    from kvfleet.history.db import get_engine
    from kvfleet.history.leases import Leases

    leases = Leases(get_engine(fresh_db_url))
    names = ["slot:kvfleet_rollout/r1:0", "slot:kvfleet_rollout/r1:1"]
    for name, cluster in zip(names, ("c1", "c2"), strict=True):
        leases.try_take(name, f"kvfleet_rollout/r1#{cluster}", "rollout parallelism", 600)
    waiting = LeaseFreeTrigger("c3", "kvfleet_rollout/r1#c3", history_url=fresh_db_url, poll_s=0.05,
                               timeout_s=0.2, names=names, exact_holder=True)
    event = _first(waiting)
    # Same run, other clusters: not ours. The wait ends on its deadline, naming what holds the slots.
    assert event["status"] == "error" and event["reason"] == "timeout", event
    assert "kvfleet_rollout/r1#c1" in event["message"] and "kvfleet_rollout/r1#c2" in event["message"]
    leases.release(names[1], "kvfleet_rollout/r1#c2")
    freed = LeaseFreeTrigger("c3", "kvfleet_rollout/r1#c3", history_url=fresh_db_url, poll_s=0.05, names=names,
                             exact_holder=True)
    event = _first(freed)
    assert event["status"] == "success" and event["message"] == f"no lease on {names[1]}"


def test_the_cluster_lease_form_still_counts_the_run_s_own_holders_as_ours(fresh_db_url: str) -> None:
    from kvfleet.history.db import get_engine
    from kvfleet.history.leases import Leases

    Leases(get_engine(fresh_db_url)).try_take("c1", "kvfleet_rollout/r1#drift", "drift", 600)
    event = _first(LeaseFreeTrigger("c1", "kvfleet_rollout/r1", history_url=fresh_db_url, poll_s=0.05))
    assert event["status"] == "success" and "our own run" in event["message"]


def test_the_deferrable_task_resumes_its_body_with_the_state_and_the_event() -> None:
    from airflow.sdk import DAG

    from kvfleet.airflow.operators import RESUME_METHOD, DeferrableTaskOperator, deferrable_task

    calls: list[Any] = []

    with DAG("t_deferrable", schedule=None):
        @deferrable_task(task_id="body")
        def body(cluster, kvfleet_resume=None):  # type: ignore[no-untyped-def]
            calls.append((cluster, kvfleet_resume))
            return {"cluster": cluster, "resumed": kvfleet_resume is not None}

        xarg = body("c1")
    op = xarg.operator
    assert isinstance(op, DeferrableTaskOperator)
    context: dict[str, Any] = {"params": {}}  # what the task runner passes (an empty one is replaced)
    out = getattr(op, RESUME_METHOD)(context, event={"status": "success"}, kvfleet_resume={"wait": "lease", "done": [1]})
    assert out == {"cluster": "c1", "resumed": True}
    assert calls == [("c1", {"wait": "lease", "done": [1], "event": {"status": "success"}})]
    # DateTimeTrigger (the bake) sends the moment it fired, not a dict: the body sees a success.
    getattr(op, RESUME_METHOD)(context, event="2026-12-01T00:00:00+00:00", kvfleet_resume={"wait": "bake"})
    assert calls[-1][1]["event"] == {"status": "success", "value": "2026-12-01T00:00:00+00:00"}


def test_without_the_deferral_s_kwargs_the_state_comes_from_the_task_s_xcom() -> None:
    """``dag.test()`` resumes with the trigger's event alone: the state saved as an XCom before deferring is used."""
    from types import SimpleNamespace

    from airflow.sdk import DAG

    from kvfleet.airflow.operators import RESUME_KEY, RESUME_METHOD, deferrable_task

    seen: list[Any] = []
    with DAG("t_deferrable_xcom", schedule=None):
        @deferrable_task(task_id="body")
        def body(cluster, kvfleet_resume=None):  # type: ignore[no-untyped-def]
            seen.append(kvfleet_resume)

        op = body("c1").operator
    pulled: list[tuple[Any, ...]] = []

    def xcom_pull(task_ids: str, key: str, map_indexes: int) -> Any:
        pulled.append((task_ids, key, map_indexes))
        return {"wave_index": 1, "baked": {}}

    ti = SimpleNamespace(map_index=3, xcom_pull=xcom_pull)
    getattr(op, RESUME_METHOD)({"ti": ti, "params": {}}, event={"status": "success"})
    assert pulled == [("body", RESUME_KEY, 3)]
    assert seen == [{"wave_index": 1, "baked": {}, "event": {"status": "success"}}]


def test_the_lease_trigger_fires_a_recheck_for_the_task_to_ask_airflow_whether_the_holder_lives(
        fresh_db_url: str) -> None:
    from kvfleet.history.db import get_engine
    from kvfleet.history.leases import Leases

    Leases(get_engine(fresh_db_url)).try_take("c1", "kvfleet_rollout/finished-run", "rollout", 600)
    event = _first(LeaseFreeTrigger("c1", "kvfleet_rollout/r2", history_url=fresh_db_url, poll_s=0.05,
                                    recheck_s=0.1))
    assert event["status"] == "success" and event["reason"] == "recheck", event
    assert "kvfleet_rollout/finished-run" in event["message"]
