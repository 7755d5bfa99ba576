"""Cluster leases: two runs (a rollout and a Curvine upgrade, two rollouts, a drift remediation) never work on
the same cluster at once.

A lease row in the history database, with a heartbeat thread: it survives worker crashes (a dead holder stops
heartbeating and its lease expires after ``ttl_s``, then another run may take it over) and it is visible to
every process (`kvfleet audit` shows the holder). A run that cannot get the lease waits up to ``wait_s``, then
fails naming the holder, its purpose and since when.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from kvfleet.errors import GateRefused
from kvfleet.history.repo import History

log = logging.getLogger(__name__)


class ClusterLock:
    def __init__(self, history: History, cluster: str, holder: str, purpose: str, *, ttl_s: float = 300,
                 wait_s: float = 600, poll_s: float = 5, progress: Callable[[str], None] = log.info) -> None:
        self.history, self.cluster, self.holder, self.purpose = history, cluster, holder, purpose
        self.ttl_s, self.wait_s, self.poll_s, self.progress = ttl_s, wait_s, poll_s, progress
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> ClusterLock:
        started = time.monotonic()
        while True:
            row = self.history.try_lock(self.cluster, self.holder, self.purpose, self.ttl_s)
            if row.get("holder") == self.holder:
                self.progress(f"[{self.cluster}] lease taken by {self.holder} ({self.purpose})")
                self._start_heartbeat()
                return self
            waited = time.monotonic() - started
            if waited >= self.wait_s:
                raise GateRefused(
                    f"cluster {self.cluster} is locked by {row.get('holder')} ({row.get('purpose')}) since "
                    f"{row.get('acquired_at')}, last heartbeat {row.get('heartbeat_at')}; waited {waited:.0f}s. "
                    "Wait for that run to finish, or stop it (its lease expires "
                    f"{self.ttl_s:.0f}s after its last heartbeat).")
            self.progress(f"[{self.cluster}] waiting for the lease held by {row.get('holder')} "
                          f"({row.get('purpose')}), {waited:.0f}s")
            time.sleep(self.poll_s)

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                if not self.history.heartbeat_lock(self.cluster, self.holder, self.ttl_s):
                    log.error("[%s] lease of %s was lost", self.cluster, self.holder)
                    return

        self._thread = threading.Thread(target=beat, name=f"lease:{self.cluster}", daemon=True)
        self._thread.start()

    def detach(self) -> None:
        """Stop heartbeating but keep the lease: a later task of the same run takes it again (re-entrant), and
        it expires ``ttl_s`` after this last heartbeat if the run dies in between."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.history.release_lock(self.cluster, self.holder):
            self.progress(f"[{self.cluster}] lease released by {self.holder}")

    def __enter__(self) -> ClusterLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
