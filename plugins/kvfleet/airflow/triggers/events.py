"""What every kvfleet trigger shares: the statuses of its events, the event itself, its serialized classpath.

An event's payload is a plain dict with ``status``: ``success`` (the wait is over), ``error`` (the wait failed; the
operator's resume method raises it in kvfleet's error model, ``kvfleet.airflow.rollout._check_event``) or, from
the drift watch, ``changed`` (a burst of changes on one cluster).
"""

from __future__ import annotations

from typing import Any, Final

from airflow.triggers.base import TriggerEvent

SUCCESS: Final = "success"
ERROR: Final = "error"
CHANGED: Final = "changed"


def event(payload: dict[str, Any]) -> TriggerEvent:
    return TriggerEvent(payload)  # type: ignore[no-untyped-call]


def classpath(obj: object) -> str:
    """The ``module.Class`` path ``serialize()`` returns: the triggerer imports it to re-create the trigger."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
