"""What every history write is keyed by, and how JSON is bound.

Every write is idempotent on its natural key, usually (run, task, map index, step): a retried Airflow task
re-issues the same insert and ``ON CONFLICT DO NOTHING`` keeps exactly one row. JSON is always bound as a
parameter (SQLAlchemy 2.1's ``text()`` would read ``:2`` inside a JSON literal as a bind).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvfleet.outcomes import status_of


def json_param(value: Any) -> str:
    """``value`` as the JSON text a ``CAST(:x AS jsonb)`` bind takes (keys sorted, anything else as str)."""
    return json.dumps(value, default=str, sort_keys=True)


@dataclass(frozen=True)
class StepKey:
    """Identifies one step of one task try-independent: the idempotency key of every write."""

    run_key: str
    task_id: str
    map_index: int = -1

    def event_key(self, step: str) -> str:
        return f"{self.run_key}|{self.task_id}|{self.map_index}|{step}"


@dataclass(frozen=True)
class StepEvent:
    """One recorded step. ``outcome`` is a ``kvfleet.outcomes.Status`` (a plain string of its vocabulary is taken
    as the member; anything else is a ValueError), so the history stores only the one vocabulary."""

    step: str
    stage: str
    outcome: str
    cluster: str | None = None
    endpoint: str | None = None
    lob: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", status_of(self.outcome))
