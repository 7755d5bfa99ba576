"""The L2 advisor's base for the request rate, read back from the history (named query ``advise_previous``,
``advise.previous_observations``): the newest recorded observation at least the minimum interval old (5 minutes)
is preferred to a closer one, which would extrapolate a burst; when only a closer one exists it is returned, and
the advisor refuses it saying why (tests/integration/drift/test_advise.py)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from kvfleet.history.keys import StepEvent, StepKey
from kvfleet.history.repos import HistoryRepos
from kvfleet.stages import advise

CLUSTER = "ml-stage-usw2"
EP = "retail/retail-assistant"


def _record(history: HistoryRepos, run: str, requests: float) -> None:
    """One hourly advise step observing the endpoint's single pod at ``requests``."""
    history.runs.start(run, dag_id="t", run_id=run, trigger="test", triggered_by=None, params={})
    observation = {"at": "2026-01-01T00:00:00+00:00", "pods": {"uid-a": requests}}
    history.runs.record_step(StepKey(run, "advise", 0), StepEvent(
        f"advise:{CLUSTER}", "advise", "reported", cluster=CLUSTER,
        detail={"endpoints": [{"endpoint": EP, "verdict": "pays_off", "observation": observation}]}))


def test_the_newest_observation_old_enough_is_the_base_not_a_closer_one(history: HistoryRepos) -> None:
    _record(history, "t/hour-ago", 100.0)
    _record(history, "t/seconds-ago", 180.0)
    with history.engine.begin() as conn:
        conn.execute(text("UPDATE step_events SET at = at - interval '1 hour' WHERE run_key = 't/hour-ago'"))
    # the default minimum interval (5 minutes): the observation of an hour ago, not the one of seconds ago
    assert advise.MIN_INTERVAL_S == 300
    assert advise.previous_observations(history, CLUSTER)[EP]["pods"] == {"uid-a": 100.0}
    # with no minimum, the newest
    assert advise.previous_observations(history, CLUSTER, min_interval_s=0)[EP]["pods"] == {"uid-a": 180.0}
    # only a closer one in the window: it is returned (the advisor then ignores it and says why)
    recent = advise.previous_observations(history, CLUSTER, within=timedelta(minutes=30))
    assert recent[EP]["pods"] == {"uid-a": 180.0}
