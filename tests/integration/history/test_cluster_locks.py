"""Cluster leases on real PostgreSQL: exclusive, re-entrant for the holder, expiring when the holder dies.
Lease time is injected (a manual clock), never slept past."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from kvfleet.errors import GateRefused
from kvfleet.history.leases import ACTIVE_TTL_S, PARKED_TTL_S, Leases
from kvfleet.stages.locks import ClusterLock

pytestmark = pytest.mark.integration


def test_second_holder_waits_then_fails_naming_the_holder(history) -> None:  # type: ignore[no-untyped-def]
    with ClusterLock(history, "c1", "kvfleet_rollout/run-a", "rollout", wait_s=0):
        said: list[str] = []
        with pytest.raises(GateRefused) as err:
            ClusterLock(history, "c1", "kvfleet_curvine_upgrade/run-b", "curvine upgrade", wait_s=0.5,
                        poll_s=0.1, progress=said.append).acquire()
        # it waited (polled again) before failing, rather than failing at once
        assert any("waiting for the lease held by kvfleet_rollout/run-a (rollout)" in m for m in said)
        assert "locked by kvfleet_rollout/run-a (rollout)" in str(err.value)
    # released: the other run gets it now
    ClusterLock(history, "c1", "kvfleet_curvine_upgrade/run-b", "curvine upgrade", wait_s=0).acquire().release()


# ---- lease liveness: an injected clock, never a long sleep ----------------------------------------------------

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


class ManualClock:
    """Time that moves only when the test moves it. A ``ClusterLock`` given ``clock=c.now, wait=c.wait`` stamps its
    lease writes with this time and its heartbeat thread sleeps on it: ``next_wake`` moves time to the earliest
    moment a waiter asked for (after waiting, bounded, until one waits)."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._cond = threading.Condition()
        self._deadlines: list[datetime] = []

    def now(self) -> datetime:
        with self._cond:
            return self._now

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        with self._cond:
            deadline = self._now + timedelta(seconds=seconds)
            self._deadlines.append(deadline)
            self._cond.notify_all()
            try:
                while not stop.is_set() and self._now < deadline:
                    self._cond.wait(0.05)  # also wakes for ``stop``, which is set without notifying this clock
            finally:
                self._deadlines.remove(deadline)
            return stop.is_set()

    def next_wake(self) -> datetime:
        with self._cond:
            assert self._cond.wait_for(lambda: bool(self._deadlines), timeout=30), "nothing waits on the clock"
            self._now = min(self._deadlines)
            self._cond.notify_all()
            return self._now


def _until(check: Callable[[], bool], what: str) -> None:
    """An event-based wait (bounded, so a broken heartbeat fails instead of hanging); asserts nothing on time."""
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def test_an_expired_lease_of_a_dead_holder_is_taken_over(history) -> None:  # type: ignore[no-untyped-def]
    Leases(history.engine).try_take("c2", "dead-worker-run", "rollout", ACTIVE_TTL_S, now=T0)  # then it "died"
    clock = ManualClock(T0 + timedelta(seconds=ACTIVE_TTL_S - 1))
    with pytest.raises(GateRefused):  # one second before the ttl ends it is still the dead holder's
        ClusterLock(history, "c2", "new-run", "rollout", wait_s=0, clock=clock.now, wait=clock.wait).acquire()
    clock = ManualClock(T0 + timedelta(seconds=ACTIVE_TTL_S + 1))
    lock = ClusterLock(history, "c2", "new-run", "rollout", wait_s=0, clock=clock.now, wait=clock.wait).acquire()
    assert history.leases.get("c2")["holder"] == "new-run" and lock.taken_over_from == "dead-worker-run"
    lock.release()
    assert history.leases.get("c2") is None


def test_heartbeat_keeps_a_lease_alive_past_its_ttl_on_an_injected_clock(history) -> None:  # type: ignore[no-untyped-def]
    clock = ManualClock(T0)
    leases = Leases(history.engine)
    beat = timedelta(seconds=ACTIVE_TTL_S / 3)
    with ClusterLock(history, "c3", "long-run", "rollout", wait_s=0, clock=clock.now, wait=clock.wait):
        for i in range(1, 5):  # four heartbeats, ttl/3 apart: past the expiry the lease was taken with
            at = clock.next_wake()
            assert at == T0 + i * beat  # the heartbeat thread asked to wake one ttl/3 after its last beat
            _until(lambda at=at: leases.get("c3")["heartbeat_at"] == at, f"the heartbeat at {at}")
        now = clock.now()
        assert now > T0 + timedelta(seconds=ACTIVE_TTL_S)
        assert leases.get("c3")["expires_at"] == now + timedelta(seconds=ACTIVE_TTL_S)
        # only the heartbeat keeps it: another run at this moment finds it held
        with pytest.raises(GateRefused):
            ClusterLock(history, "c3", "other", "rollout", wait_s=0, clock=clock.now, wait=clock.wait).acquire()
    # the same lease without heartbeats (taken at T0, its holder silent) is free at that moment
    leases.try_take("c4", "silent-run", "rollout", ACTIVE_TTL_S, now=T0)
    assert leases.try_take("c4", "other", "rollout", now=now)["holder"] == "other"


def test_a_killed_task_frees_its_lease_one_ttl_after_its_last_heartbeat(history) -> None:  # type: ignore[no-untyped-def]
    leases = Leases(history.engine)
    assert leases.try_take("k1", "kvfleet_rollout/dead", "rollout", ACTIVE_TTL_S, now=T0)["holder"] == \
        "kvfleet_rollout/dead"
    # 30 s later the holder (no heartbeat any more: it was SIGKILLed) still holds it
    early = leases.try_take("k1", "kvfleet_rollout/next", "rollout", now=T0 + timedelta(seconds=30))
    assert early["holder"] == "kvfleet_rollout/dead"
    later = leases.try_take("k1", "kvfleet_rollout/next", "rollout", now=T0 + timedelta(seconds=ACTIVE_TTL_S + 1))
    assert later["holder"] == "kvfleet_rollout/next"
    assert later["taken_over_from"] == "kvfleet_rollout/dead" and "expired" in later["why"]


def test_a_parked_lease_survives_while_its_gate_waits_but_not_once_its_run_ended(history) -> None:  # type: ignore[no-untyped-def]
    leases = Leases(history.engine)
    leases.try_take("k2", "kvfleet_rollout/gated", "rollout", ACTIVE_TTL_S, now=T0)
    assert leases.park("k2", "kvfleet_rollout/gated", PARKED_TTL_S, now=T0)
    assert leases.get("k2")["state"] == "parked"
    running = {"kvfleet_rollout/gated": True}
    # 90 minutes into a deferred human gate: far past the active ttl, still the run's
    at = T0 + timedelta(minutes=90)
    row = leases.try_take("k2", "kvfleet_drift_check/x", "drift remediation", now=at, holder_alive=running.get)
    assert row["holder"] == "kvfleet_rollout/gated"
    # the run was marked failed in Airflow: its parked lease is dead at once
    running["kvfleet_rollout/gated"] = False
    row = leases.try_take("k2", "kvfleet_drift_check/x", "drift remediation", now=at, holder_alive=running.get)
    assert row["holder"] == "kvfleet_drift_check/x" and "no longer running" in row["why"]


def test_an_unknown_run_state_leaves_the_decision_to_the_ttl(history) -> None:  # type: ignore[no-untyped-def]
    leases = Leases(history.engine)
    leases.try_take("k3", "kvfleet_rollout/r", "rollout", ACTIVE_TTL_S, now=T0)
    row = leases.try_take("k3", "other/o", "rollout", now=T0 + timedelta(seconds=10), holder_alive=lambda h: None)
    assert row["holder"] == "kvfleet_rollout/r"
    assert leases.holder_liveness("k3", "kvfleet_rollout/r#drift", now=T0 + timedelta(seconds=10)).alive
    verdict = leases.holder_liveness("k3", "kvfleet_rollout/r", now=T0 + timedelta(minutes=3))
    assert not verdict.alive and "expired" in verdict.reason
    assert not leases.holder_liveness("k3", "kvfleet_rollout/someone-else", now=T0).alive


def test_park_keeps_the_lease_for_the_same_run_and_release_frees_it(history) -> None:  # type: ignore[no-untyped-def]
    lock = ClusterLock(history, "k4", "kvfleet_rollout/p", "rollout", wait_s=0).acquire()
    lock.park()
    assert history.leases.get("k4")["holder"] == "kvfleet_rollout/p"
    again = ClusterLock(history, "k4", "kvfleet_rollout/p", "rollout", wait_s=0).acquire()  # the next task
    assert Leases(history.engine).get("k4")["state"] == "active"
    again.release()
    assert history.leases.get("k4") is None


def test_lease_wait_ends_promptly_on_a_stop_request(history) -> None:  # type: ignore[no-untyped-def]
    from kvfleet.clients.kube import StopRequested, request_stop, reset_stop

    Leases(history.engine).try_take("k5", "kvfleet_rollout/busy", "rollout", 600)
    request_stop()
    try:
        with pytest.raises(StopRequested):
            ClusterLock(history, "k5", "kvfleet_rollout/waiter", "rollout", wait_s=3600, poll_s=3600).acquire()
    finally:
        reset_stop()
