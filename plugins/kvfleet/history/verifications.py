"""Cache-hit verifications: one row per verified endpoint per step (``hit_verifications``).

Called by the hourly verification DAG and by the rollout's wave gates, after each probe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, text

from kvfleet.history.db import get_engine
from kvfleet.history.keys import StepKey, json_param

_COLUMNS = ("cluster", "endpoint", "lob", "instance_type", "prompt_tokens", "stored_tokens", "hit_tokens",
            "hit_ratio", "l2_read_ms", "ttft_cold_ms", "ttft_warm_ms", "speedup", "expected_speedup", "verdict",
            "diagnosis")


class Verifications:
    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or get_engine()

    def record(self, key: StepKey, step: str, result: Mapping[str, Any]) -> bool:
        """One verification result; False if this (run, task, map index, step) was already recorded."""
        values = {c: result.get(c) for c in _COLUMNS}
        with self.engine.begin() as conn:
            row = conn.execute(
                text(
                    f"INSERT INTO hit_verifications (run_key, task_id, map_index, step, {', '.join(_COLUMNS)}, "
                    f"detail) VALUES (:run_key, :task_id, :map_index, :step, {', '.join(':' + c for c in _COLUMNS)}, "
                    "CAST(:detail AS jsonb)) ON CONFLICT (run_key, task_id, map_index, step) DO NOTHING RETURNING id"
                ),
                {"run_key": key.run_key, "task_id": key.task_id, "map_index": key.map_index, "step": step,
                 **values, "detail": json_param(dict(result.get("detail") or {}))},
            ).first()
            return row is not None
