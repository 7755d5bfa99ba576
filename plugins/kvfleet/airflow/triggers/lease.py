"""``LeaseFreeTrigger``: the rollout's wait for a cluster lease or a parallelism slot, in the triggerer.

Deferred to by ``kvfleet.airflow.rollout`` (the cluster lease held by another run, every parallelism slot busy);
the lease rules are ``kvfleet.history.leases``'.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from kvfleet.airflow.triggers.events import ERROR, SUCCESS, classpath, event

log = logging.getLogger(__name__)


class LeaseFreeTrigger(BaseTrigger):
    """Waits until ``cluster``'s lease (``cluster_locks``, rules in ``kvfleet.history.leases``) is free, ours
    (``holder``'s run), or held by the dead (expired ttl). The waiting task then takes it with ``try_take``: the
    trigger only says when trying is worth it, so two waiters racing stay safe.

    Fails fast: a history database that refuses us for good (the table is missing: migrations not applied; the
    role lacks SELECT) is an ``error`` event, as is ``timeout_s`` running out (the user's patience, named with the
    holder). A connection error is transient: it is logged and polled again."""

    def __init__(self, cluster: str, holder: str, *, history_url: str | None = None, poll_s: float = 5.0,
                 timeout_s: float | None = None, started_at: float | None = None,
                 names: list[str] | None = None, exact_holder: bool = False,
                 recheck_s: float | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.cluster, self.holder, self.history_url = cluster, holder, history_url
        self.poll_s, self.timeout_s = float(poll_s), timeout_s
        # Wall clock, so the deadline survives a triggerer restart (re-created from serialize()).
        self.started_at = float(started_at) if started_at is not None else time.time()
        # Several leases, any one of which will do (a run's parallelism slots ``slot:<run key>:<i>``); the
        # slots of one run are held by its other clusters, so "ours" then means this exact holder.
        self.names = [str(n) for n in names] if names else None
        self.exact_holder = bool(exact_holder)
        # The triggerer cannot ask Airflow whether the holder's run still runs (a finished run's lease is free at
        # once, ``kvfleet.history.leases``): after ``recheck_s`` the trigger fires ``recheck`` and the task, which
        # can ask, tries again (and defers again while the holder lives).
        self.recheck_s = float(recheck_s) if recheck_s is not None else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath(self), {"cluster": self.cluster, "holder": self.holder, "history_url": self.history_url,
                                 "poll_s": self.poll_s, "timeout_s": self.timeout_s,
                                 "started_at": self.started_at, "names": self.names,
                                 "exact_holder": self.exact_holder, "recheck_s": self.recheck_s}

    def _check(self) -> tuple[str | None, str]:
        """(status or None: keep waiting, message). Runs in a thread."""
        from sqlalchemy.exc import OperationalError, ProgrammingError

        from kvfleet.errors import HistoryConfigError, HistoryUnreachable
        from kvfleet.history.db import get_engine
        from kvfleet.history.leases import Leases

        try:
            leases = Leases(get_engine(self.history_url))
            waiting = [self._check_one(leases, name) for name in (self.names or [self.cluster])]
        except ProgrammingError as exc:  # undefined table, permission denied: waiting cannot fix it
            return ERROR, f"lease table unreadable for {self.cluster}: {exc.orig}"
        except OperationalError as exc:
            log.warning("[%s] history database unreachable, polling again: %s", self.cluster, exc.orig)
            return None, "history database unreachable"
        except HistoryUnreachable as exc:  # the first connection of this triggerer did not answer: poll again
            log.warning("[%s] history database unreachable, polling again: %s", self.cluster, exc)
            return None, "history database unreachable"
        except HistoryConfigError as exc:  # no history configured here: waiting cannot fix it
            return ERROR, str(exc)
        free = [message for status, message in waiting if status is not None]
        return (SUCCESS, free[0]) if free else (None, "; ".join(message for _, message in waiting))

    def _check_one(self, leases: Any, name: str) -> tuple[str | None, str]:
        from kvfleet.history.leases import judge, run_key_of, utcnow

        row = leases.get(name)
        if row is None:
            return SUCCESS, f"no lease on {name}"
        ours = str(row["holder"]) == self.holder if self.exact_holder else \
            run_key_of(str(row["holder"])) == run_key_of(self.holder)
        if ours:
            return SUCCESS, f"the lease on {name} is held by our own run ({row['holder']})"
        verdict = judge(row, utcnow())
        if not verdict.alive:
            return SUCCESS, f"the lease on {name} held by {row['holder']} is dead: {verdict.reason}"
        return None, (f"{name} is locked by {row['holder']} ({row.get('purpose')}), {verdict.reason}")

    async def run(self) -> AsyncIterator[TriggerEvent]:
        began = time.monotonic()
        while True:
            status, message = await asyncio.to_thread(self._check)
            if status is not None:
                yield event({"status": status, "cluster": self.cluster, "message": message})
                return
            if self.recheck_s is not None and time.monotonic() - began >= self.recheck_s:
                yield event({"status": SUCCESS, "cluster": self.cluster, "reason": "recheck",
                             "message": f"{message}; is its run still running? the task checks"})
                return
            waited = time.time() - self.started_at
            if self.timeout_s is not None and waited >= self.timeout_s:
                yield event({"status": ERROR, "cluster": self.cluster, "reason": "timeout",
                             "message": f"{message}; waited {waited:.0f}s of {self.timeout_s:.0f}s. Wait for that "
                                        "run to finish, or stop it (a stopped run's lease is free at once)."})
                return
            self.log.info("[%s] %s; waited %.0fs", self.cluster, message, waited)
            await asyncio.sleep(self.poll_s)
