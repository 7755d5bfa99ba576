"""The error model shared by every reconciler, after kopf's split.

``PermanentError``: retrying cannot help (bad input, a refused safety gate, a terminal cloud state).
Airflow tasks translate it into ``AirflowFailException`` so no retry is spent on it.
``TemporaryError``: try again later (a 409, throttling, a pod not ready yet); Airflow retries it.
"""

from __future__ import annotations


class KvfleetError(Exception):
    """Base of every error kvfleet raises on purpose."""


class PermanentError(KvfleetError):
    """Retrying is useless: fix the input or the fleet first."""


class TemporaryError(KvfleetError):
    """Retrying later may succeed."""

    def __init__(self, message: str, *, delay: float = 10.0) -> None:
        super().__init__(message)
        self.delay = delay


class GateRefused(PermanentError):
    """A safety gate refused an action before anything changed."""


class InventoryError(PermanentError):
    """The fleet inventory is invalid. ``problems`` lists every problem, not only the first."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid fleet inventory:\n  - " + "\n  - ".join(self.problems))
