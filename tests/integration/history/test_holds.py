"""Freezes and emergency stops on real PostgreSQL (``kvfleet.history.holds``): freeze, lift and their idempotence,
the one check ``holding`` for each scope, a stop holding only the runs in flight when it was given, each action an
audit line, and bad input refused with nothing written."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from kvfleet.history import migrate
from kvfleet.history.db import OWNER_ROLE, WRITER_ROLE
from kvfleet.history.holds import ALL, CLUSTER, FREEZE, LOB, RUN, STOP, HoldError, NotFrozen, Scope
from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration

PROD = "123456789012/us-east-1/ml-prod"
STAGE = "default/us-west-2/ml-stage"
RUN_KEY = "kvfleet_rollout/manual__2026-12-01T08:00:00+00:00"


def _count(h: HistoryRepos, sql: str) -> int:
    with h.engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _start(h: HistoryRepos, run_key: str = RUN_KEY) -> datetime:
    """Open the run's row; returns its start as the database recorded it."""
    dag, _, run_id = run_key.partition("/")
    h.runs.start(run_key, dag_id=dag, run_id=run_id, trigger="manual", triggered_by="alice", params={})
    started = (h.runs.get(run_key) or {})["started_at"]
    assert isinstance(started, datetime)
    return started


def test_freeze_is_idempotent_per_scope_and_lift_ends_it(history: HistoryRepos) -> None:
    first = history.holds.freeze(Scope(CLUSTER, PROD), "  quarter-end close  ", "alice")
    assert (first.kind, first.scope, first.reason, first.by) == (FREEZE, Scope(CLUSTER, PROD), "quarter-end close",
                                                                  "alice")
    again = history.holds.freeze(Scope(CLUSTER, PROD), "another reason", "bob")
    assert again == first  # the freeze in force, not a second one
    other = history.holds.freeze(Scope(LOB, "retail"), "retail launch", "carol")
    assert [h.id for h in history.holds.active_freezes()] == [first.id, other.id]
    assert _count(history, "SELECT count(*) FROM holds") == 2
    assert f'Lift it with: kvfleet freeze off --cluster {PROD} --reason "…"' in first.message
    assert "frozen by alice since" in first.message and "quarter-end close" in first.message

    lifted = history.holds.lift(Scope(CLUSTER, PROD), "close done", "dave")
    assert (lifted.id, lifted.lifted_by, lifted.lift_reason) == (first.id, "dave", "close done")
    assert lifted.lifted_at is not None and "was lifted by dave" in lifted.message
    assert [h.id for h in history.holds.active_freezes()] == [other.id]
    with pytest.raises(NotFrozen, match="has no active freeze to lift; the freezes in force: --lob retail"):
        history.holds.lift(Scope(CLUSTER, PROD), "again", "dave")
    history.holds.lift(Scope(LOB, "retail"), "launched", "carol")
    with pytest.raises(NotFrozen, match="nothing is frozen"):
        history.holds.lift(Scope(ALL), "nothing", "dave")
    refrozen = history.holds.freeze(Scope(CLUSTER, PROD), "incident 42", "erin")
    assert refrozen.id != first.id and history.holds.active_freezes() == [refrozen]


def test_each_action_is_an_audit_line_once_and_the_chain_verifies(history: HistoryRepos) -> None:
    started = _start(history)
    f = history.holds.freeze(Scope(CLUSTER, PROD), "incident", "alice")
    history.holds.freeze(Scope(CLUSTER, PROD), "incident", "alice")  # nothing new: no line
    history.holds.lift(Scope(CLUSTER, PROD), "resolved", "bob")
    s = history.holds.stop(Scope(RUN, RUN_KEY), "wrong image", "carol")
    assert s.at >= started
    with history.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(text(
            "SELECT actor, action, cluster, run_key, detail FROM audit_log ORDER BY seq")).mappings()]
    assert [(r["actor"], r["action"], r["cluster"], r["run_key"]) for r in rows] == [
        ("alice", "freeze:on", PROD, None), ("bob", "freeze:off", PROD, None), ("carol", "stop", None, RUN_KEY)]
    assert rows[0]["detail"] == {"hold_id": f.id, "kind": "freeze", "scope": "cluster", "target": PROD,
                                 "reason": "incident"}
    assert rows[1]["detail"]["lift_reason"] == "resolved"
    assert history.audit.verify_chain()["ok"]


def test_holding_for_each_scope_of_a_freeze(history: HistoryRepos) -> None:
    now = datetime.now(UTC)
    check = history.holds.holding
    assert check(RUN_KEY, now, [PROD, STAGE], ["retail", "payments"]) is None
    lob = history.holds.freeze(Scope(LOB, "retail"), "retail launch", "alice")
    assert check(RUN_KEY, now, [STAGE], ["payments", "retail"]) == lob
    assert check(RUN_KEY, now, [PROD, STAGE], ["payments"]) is None
    assert check(RUN_KEY, now, [], ["retail-eu"]) is None  # a LOB whose name starts like another is not held
    cluster = history.holds.freeze(Scope(CLUSTER, PROD), "node repair", "bob")
    assert check(RUN_KEY, now, [PROD], ["payments"]) == cluster
    assert check(RUN_KEY, now, ["default/us-east-1/ml-prod"], ["payments"]) is None  # same name, other account
    assert check(RUN_KEY, now, [PROD], ["retail"]) == lob  # the oldest of two freezes
    history.holds.lift(Scope(LOB, "retail"), "launched", "alice")
    history.holds.lift(Scope(CLUSTER, PROD), "repaired", "bob")
    assert check(RUN_KEY, now, [PROD], ["retail"]) is None
    everything = history.holds.freeze(Scope(ALL), "change freeze", "carol")
    assert check("kvfleet_drift_check/any", now - timedelta(days=30), [], []) == everything
    assert "the whole fleet is frozen by carol" in everything.message and "freeze off --all" in everything.message


def test_a_stop_holds_the_runs_in_flight_when_it_was_given_and_no_later_one(history: HistoryRepos) -> None:
    check = history.holds.holding
    started = _start(history)
    stop = history.holds.stop(Scope(CLUSTER, PROD), "bad chart", "alice")
    assert stop.kind == STOP and stop.at >= started
    assert check(RUN_KEY, started, [PROD], []) == stop  # in flight when the stop came
    assert check(RUN_KEY, stop.at, [PROD], []) == stop  # at the same instant: held (the safe side)
    later = stop.at + timedelta(microseconds=1)
    assert check("kvfleet_rollout/later", later, [PROD], []) is None  # a run started after it is not stopped
    assert check(RUN_KEY, started, [STAGE], []) is None  # another cluster
    assert "emergency stop of cluster" in stop.message and "is not lifted" in stop.message
    with pytest.raises(NotFrozen):
        history.holds.lift(Scope(CLUSTER, PROD), "a stop is not lifted", "alice")
    all_stop = history.holds.stop(Scope(ALL), "region outage", "bob")
    assert check("kvfleet_drift_check/x", started, [], []) == all_stop  # the cluster stop is not its
    assert check("kvfleet_drift_check/x", all_stop.at + timedelta(microseconds=1), [STAGE], []) is None


def test_a_stop_of_a_run_holds_that_run_only_and_wins_over_a_freeze(history: HistoryRepos) -> None:
    check = history.holds.holding
    started = _start(history)
    other = "kvfleet_rollout/manual__2026-12-01T09:00:00+00:00"
    other_started = _start(history, other)
    freeze = history.holds.freeze(Scope(CLUSTER, PROD), "audit", "alice")
    assert check(RUN_KEY, started, [PROD], []) == freeze
    stop = history.holds.stop(Scope(RUN, RUN_KEY), "wrong image", "bob")
    assert check(RUN_KEY, started, [PROD], []) == stop  # a stop asks for the nearer safe point
    assert check(RUN_KEY, started, [STAGE], []) == stop
    assert check(other, other_started, [STAGE], []) is None


def test_a_stop_names_a_run_the_history_has_in_flight(history: HistoryRepos) -> None:
    with pytest.raises(HoldError, match="is not in the history: name it by its run key dag_id/run_id"):
        history.holds.stop(Scope(RUN, "kvfleet_rollout/nope"), "x", "alice")
    _start(history)
    history.runs.end(RUN_KEY, "success")
    with pytest.raises(HoldError, match=r"has already ended \(success, at .*\): there is nothing to stop"):
        history.holds.stop(Scope(RUN, RUN_KEY), "x", "alice")
    assert _count(history, "SELECT count(*) FROM holds") == 0


@pytest.mark.parametrize(("call", "message"), [
    (lambda h: h.holds.freeze(Scope(CLUSTER, PROD), "   ", "alice"), "reason is required"),
    (lambda h: h.holds.freeze(Scope(CLUSTER, PROD), "x" * 501, "alice"), "reason is 501 characters long: at most 500"),
    (lambda h: h.holds.freeze(Scope(CLUSTER, PROD), "two\nlines", "alice"), "reason 'two\\\\nlines' holds a control"),
    (lambda h: h.holds.freeze(Scope(CLUSTER, PROD), "why", ""), "by is required"),
    (lambda h: h.holds.freeze(Scope(RUN, RUN_KEY), "why", "alice"), "a freeze covers all, a LOB or a cluster, not a run"),
    (lambda h: h.holds.stop(Scope(ALL), "", "alice"), "reason is required"),
    (lambda h: h.holds.lift(Scope(LOB, "retail"), "", "alice"), "reason is required"),
    (lambda h: Scope("region", "us-east-1"), "scope 'region' is not one of all, lob, cluster, run"),
    (lambda h: Scope(CLUSTER, ""), "the cluster is required"),
    (lambda h: Scope(ALL, "retail"), "scope all names nothing"),
])
def test_bad_input_is_refused_and_writes_nothing(history: HistoryRepos, call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(HoldError, match=message):
        call(history)
    assert _count(history, "SELECT count(*) FROM holds") == 0
    assert _count(history, "SELECT count(*) FROM audit_log") == 0


def test_the_table_refuses_what_the_repository_refuses(history: HistoryRepos) -> None:
    for values in ("('freeze', 'cluster', :c, '', 'alice')", "('freeze', 'run', :c, 'why', 'alice')",
                   "('stop', 'all', :c, 'why', 'alice')", "('pause', 'all', '', 'why', 'alice')"):
        with pytest.raises(IntegrityError), history.engine.begin() as conn:
            conn.execute(text(f"INSERT INTO holds (kind, scope, target, reason, requested_by) VALUES {values}"),
                         {"c": PROD})
    with pytest.raises(ValueError, match="time zone"):
        history.holds.holding(RUN_KEY, datetime(2026, 12, 1, 8, 0), [], [])  # a naive time is refused


@pytest.fixture
def writer(pg) -> Iterator[HistoryRepos]:  # type: ignore[no-untyped-def]
    """A fresh database migrated by the owner role; the repositories as the writer role."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    pg.ensure_database(name)
    admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" OWNER TO {OWNER_ROLE}'))
    owner = create_engine(pg.url(name, OWNER_ROLE))
    migrate.upgrade(owner)
    owner.dispose()
    history = HistoryRepos.on(create_engine(pg.url(name, WRITER_ROLE)))
    yield history
    history.engine.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_the_writer_role_records_and_lifts_holds_and_never_deletes_one(writer: HistoryRepos) -> None:
    writer.holds.freeze(Scope(ALL), "change freeze", "alice")
    writer.holds.lift(Scope(ALL), "over", "alice")
    writer.holds.stop(Scope(ALL), "outage", "bob")
    for statement in ("DELETE FROM holds", "TRUNCATE holds"):
        with pytest.raises(DBAPIError, match="permission denied"), writer.engine.begin() as conn:
            conn.execute(text(statement))
    assert _count(writer, "SELECT count(*) FROM holds") == 2


def test_the_revision_goes_down_and_up(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine)
    migrate.downgrade(engine, "0011_cluster_keys")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('holds')")).scalar() is None
    migrate.upgrade(engine, "0012_holds")
    assert migrate.current_revision(engine) == "0012_holds"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('holds')")).scalar() is not None
    migrate.upgrade(engine)
    engine.dispose()
