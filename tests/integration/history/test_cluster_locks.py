"""Cluster leases on real PostgreSQL: exclusive, re-entrant for the holder, expiring when the holder dies."""

from __future__ import annotations

import time

import pytest

from kvfleet.errors import GateRefused
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
