"""Cluster leases on real PostgreSQL: exclusive, re-entrant for the holder, expiring when the holder dies."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from kvfleet.errors import GateRefused
from kvfleet.history.leases import ACTIVE_TTL_S, PARKED_TTL_S, Leases
from kvfleet.stages.locks import ClusterLock

pytestmark = pytest.mark.integration


def test_second_holder_waits_then_fails_naming_the_holder(history) -> None:  # type: ignore[no-untyped-def]
    with ClusterLock(history, "c1", "kvfleet_rollout/run-a", "rollout", wait_s=0):
        started = time.monotonic()
        with pytest.raises(GateRefused) as err:
            ClusterLock(history, "c1", "kvfleet_curvine_upgrade/run-b", "curvine upgrade", wait_s=0.5,
                        poll_s=0.1).acquire()
        assert time.monotonic() - started >= 0.5
        assert "locked by kvfleet_rollout/run-a (rollout)" in str(err.value)
    # released: the other run gets it now
    ClusterLock(history, "c1", "kvfleet_curvine_upgrade/run-b", "curvine upgrade", wait_s=0).acquire().release()


def test_an_expired_lease_of_a_dead_holder_is_taken_over(history) -> None:  # type: ignore[no-untyped-def]
    history.try_lock("c2", "dead-worker-run", "rollout", ttl_s=0.2)  # no heartbeat thread: the holder "died"
    time.sleep(0.4)
    lock = ClusterLock(history, "c2", "new-run", "rollout", wait_s=0).acquire()
    assert history.lock_of("c2")["holder"] == "new-run"
    lock.release()
    assert history.lock_of("c2") is None


def test_heartbeat_keeps_a_short_lease_alive(history) -> None:  # type: ignore[no-untyped-def]
    with ClusterLock(history, "c3", "long-run", "rollout", ttl_s=0.6, wait_s=0):
        time.sleep(1.0)  # longer than the ttl: only the heartbeat keeps it
        with pytest.raises(GateRefused):
            ClusterLock(history, "c3", "other", "rollout", wait_s=0).acquire()


# ---- lease liveness (issue 14): an injected clock, never a long sleep -------------------------------------------

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


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
    assert history.lock_of("k4")["holder"] == "kvfleet_rollout/p"
    again = ClusterLock(history, "k4", "kvfleet_rollout/p", "rollout", wait_s=0).acquire()  # the next task
    assert Leases(history.engine).get("k4")["state"] == "active"
    again.release()
    assert history.lock_of("k4") is None


def test_lease_wait_ends_promptly_on_a_stop_request(history) -> None:  # type: ignore[no-untyped-def]
    from kvfleet.clients.kube import StopRequested, request_stop, reset_stop

    Leases(history.engine).try_take("k5", "kvfleet_rollout/busy", "rollout", 600)
    request_stop()
    try:
        with pytest.raises(StopRequested):
            ClusterLock(history, "k5", "kvfleet_rollout/waiter", "rollout", wait_s=3600, poll_s=3600).acquire()
    finally:
        reset_stop()
