"""Time for the AWS emulator: the clock that stamps resources and the timers that finish transitions.

Called from :mod:`kvfleet_sandbox.aws_sagemaker` and :mod:`kvfleet_sandbox.aws_eks` whenever a request starts
an asynchronous change (``Updating`` → ``InService``, ``CREATING`` → ``ACTIVE``). Real AWS finishes these
minutes later; the sandbox finishes them after ``delay_s`` *model* seconds. A scenario or benchmark may pass a
scaled clock (any object with ``sleep(model_seconds)`` and ``now()``) so that a "ten minute" update takes a
blink. With no clock, wall time is used and the wait is interruptible, so ``stop()`` returns at once.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Clock(Protocol):
    def sleep(self, seconds: float) -> None: ...

    def now(self) -> Any: ...  # a datetime, or epoch seconds


class Timers:
    """Runs ``fn`` on a daemon thread after a delay, unless :meth:`stop` came first."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock
        self._stopped = threading.Event()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def now(self) -> dt.datetime:
        if self._clock is None:
            return dt.datetime.now(dt.UTC)
        value = self._clock.now()
        if isinstance(value, dt.datetime):
            return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return dt.datetime.fromtimestamp(float(value), tz=dt.UTC)

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` model seconds (used for injected request latency too)."""
        if seconds <= 0:
            return
        if self._clock is None:
            self._stopped.wait(seconds)
        else:
            self._clock.sleep(seconds)

    def after(self, seconds: float, fn: Callable[[], None], name: str) -> None:
        thread = threading.Thread(
            target=self._run, args=(seconds, fn), name=f"aws-emulator:{name}", daemon=True
        )
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _run(self, seconds: float, fn: Callable[[], None]) -> None:
        try:
            self.sleep(seconds)
            if not self._stopped.is_set():
                fn()
        except Exception:  # a timer must never die silently: the resource would stay in transition forever
            log.exception("AWS emulator transition failed")
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def restart(self) -> None:
        self._stopped.clear()

    def stop(self) -> None:
        """Cancel pending transitions; wall-clock timers also end now (scaled ones end when they wake)."""
        self._stopped.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if self._clock is None:
                thread.join(timeout=1.0)
