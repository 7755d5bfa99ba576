"""Cluster leases: two runs (a rollout and a Curvine upgrade, two rollouts, a drift remediation) never work on
the same cluster at once, and a dead run never blocks a cluster for long.

A lease row in the history database (``kvfleet.history.leases``), visible to every process (`kvfleet audit`
shows the holder). Liveness is explicit (the full rules are in ``kvfleet.history.leases``):
- while a task holds the lease it is **active**: a heartbeat thread renews it every ``ttl_s/3`` with a short
  ``ttl_s`` (60 s). A holder killed with SIGKILL stops heartbeating: its lease is free 60 s later;
- between two tasks of one run (a wave done, a human gate deferred) the run **parks** it (``park()``): no
  heartbeat, the gate's own longer ttl; the next task of the same run takes it again (re-entrant);
- whatever the ttl, a lease whose holder's run is no longer running (``holder_alive`` says False: Airflow's
  run state) is free at once.
Every exit path of a task releases what it took or parks it for a later task of the same run; the rollout's
teardown releases it in the end (`kvfleet.airflow.rollout`).

Time is injectable: ``clock`` says what time it is (every lease write is stamped with it) and ``wait`` is how
the heartbeat thread waits for its next beat (``wait(seconds, stop) -> stopped``; default: ``stop.wait`` on the
wall clock). A test passes a manual clock's pair and moves time itself, never sleeping past a short ttl.

A run that cannot get the lease waits up to ``wait_s`` (ending promptly on SIGTERM), then fails naming the
holder, its purpose and since when: ``LeaseWaitTimeout``, permanent (``wait_s`` is the user's patience; a retry
would multiply it — one meaning per kind of wait, ``kvfleet.errors``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Any

from kvfleet.clients.kube import sleep_or_stop
from kvfleet.errors import LeaseWaitTimeout
from kvfleet.history.leases import ACTIVE_TTL_S, PARKED_TTL_S, HolderAlive, Leases, utcnow

log = logging.getLogger(__name__)


def _wall_wait(seconds: float, stop: threading.Event) -> bool:
    """Wait ``seconds`` of wall time or until ``stop`` is set; True when stopped."""
    return stop.wait(seconds)


def leases_of(history: Any) -> Leases:
    """A ``Leases`` store on the same database as ``history`` (a ``HistoryRepos``, or a ``Leases`` itself)."""
    return history if isinstance(history, Leases) else Leases(history.engine)


class ClusterLock:
    def __init__(self, history: Any, cluster: str, holder: str, purpose: str, *, ttl_s: float = ACTIVE_TTL_S,
                 wait_s: float = 600, poll_s: float = 5, progress: Callable[[str], None] = log.info,
                 holder_alive: HolderAlive | None = None, clock: Callable[[], datetime] | None = None,
                 park_ttl_s: float = PARKED_TTL_S,
                 wait: Callable[[float, threading.Event], bool] | None = None) -> None:
        self.leases = leases_of(history)
        self.cluster, self.holder, self.purpose = cluster, holder, purpose
        self.ttl_s, self.wait_s, self.poll_s, self.progress = ttl_s, wait_s, poll_s, progress
        self.holder_alive, self.park_ttl_s = holder_alive, park_ttl_s
        self.clock = clock or utcnow
        self.wait = wait or _wall_wait
        self.taken_over_from: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> ClusterLock:
        started = time.monotonic()
        while True:
            row = self.leases.try_take(self.cluster, self.holder, self.purpose, self.ttl_s, now=self.clock(),
                                       holder_alive=self.holder_alive)
            if row.get("holder") == self.holder:
                if row.get("taken_over_from"):
                    self.taken_over_from = str(row["taken_over_from"])
                    log.warning("[%s] lease taken over from %s: %s", self.cluster, row["taken_over_from"],
                                row.get("why"))
                self.progress(f"[{self.cluster}] lease taken by {self.holder} ({self.purpose})"
                              + (f", from dead holder {row['taken_over_from']} ({row.get('why')})"
                                 if row.get("taken_over_from") else ""))
                self._start_heartbeat()
                return self
            waited = time.monotonic() - started
            if waited >= self.wait_s:
                raise LeaseWaitTimeout(
                    f"cluster {self.cluster} is locked by {row.get('holder')} ({row.get('purpose')}) since "
                    f"{row.get('acquired_at')}, lease {row.get('state', 'active')}, last heartbeat "
                    f"{row.get('heartbeat_at')}, expires {row.get('expires_at')}; waited {waited:.0f}s. Wait for "
                    "that run to finish, or stop it (a stopped run's lease is free at once; a killed task's "
                    f"{self.ttl_s:.0f}s after its last heartbeat).")
            self.progress(f"[{self.cluster}] waiting for the lease held by {row.get('holder')} "
                          f"({row.get('purpose')}), {waited:.0f}s")
            sleep_or_stop(self.poll_s, f"[{self.cluster}] lease wait")

    def _start_heartbeat(self) -> None:
        self._stop.clear()

        def beat() -> None:
            while not self.wait(self.ttl_s / 3, self._stop):
                if not self.leases.heartbeat(self.cluster, self.holder, self.ttl_s, now=self.clock()):
                    log.error("[%s] lease of %s was lost", self.cluster, self.holder)
                    return

        self._thread = threading.Thread(target=beat, name=f"lease:{self.cluster}", daemon=True)
        self._thread.start()

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def park(self) -> None:
        """Stop heartbeating and keep the lease for a later task of the same run (``parked``, ``park_ttl_s``).
        Only for a task that ends normally with more of its run to come; on failure, ``release``."""
        self._stop_heartbeat()
        if self.leases.park(self.cluster, self.holder, self.park_ttl_s, now=self.clock()):
            self.progress(f"[{self.cluster}] lease parked by {self.holder} for the run's next task")

    detach = park  # the former name

    def release(self) -> None:
        self._stop_heartbeat()
        if self.leases.release(self.cluster, self.holder):
            self.progress(f"[{self.cluster}] lease released by {self.holder}")

    def __enter__(self) -> ClusterLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
