"""How the audit tables print values: readable at a glance, never in scientific notation."""

from __future__ import annotations

from datetime import datetime

import pytest

from kvfleet.cli import _cell


@pytest.mark.parametrize(("value", "shown"), [
    (1100.4, "1100"),  # a cold TTFT in ms
    (2.6, "2.6"),
    (1.0, "1"),
    (0.98765, "0.988"),
    (0.00012, "0.00012"),
    (None, "-"),
    (datetime(2026, 11, 29, 12, 32, 46, 123), "2026-11-29 12:32:46"),
])
def test_cells(value, shown) -> None:  # type: ignore[no-untyped-def]
    assert _cell(value) == shown


def test_plan_wave_size_range_is_the_dag_params() -> None:
    from kvfleet.airflow.params import rollout_params
    from kvfleet.cli import WAVE_SIZE_RANGE

    schema = rollout_params()["wave_size"].schema
    assert (schema["minimum"], schema["maximum"]) == WAVE_SIZE_RANGE
