"""Translate kvfleet's error model into Airflow's: a PermanentError fails the task without retries
(AirflowFailException), a TemporaryError lets Airflow's retry policy run."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from kvfleet.errors import PermanentError

F = TypeVar("F", bound=Callable[..., Any])


def permanent_fails_fast(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PermanentError as exc:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]
