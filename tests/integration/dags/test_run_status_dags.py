"""Every kvfleet_rollout run ends with a terminal status in the history that matches Airflow's, written by the
DAG-level callbacks (kvfleet.airflow.run_status) through dag.test() against a sandbox fleet in its own process."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def conf(fleet: Path, **overrides: Any) -> dict[str, Any]:
    """Every Param explicitly: dag.test() keeps the Params of an earlier run in the same process."""
    base = {"fleet": str(fleet), "lobs": [], "clusters": [], "endpoints": [], "dry_run": False, "wave_size": 3,
            "max_parallel_clusters": 4, "canary": True, "bake_minutes": 0, "gate": "none", "approval": "none",
            "remediate_drift": False, "prompt_tokens": 2000, "lock_wait_minutes": 10}
    return {**base, **overrides}


def test_a_refused_plan_ends_refused_and_a_small_rollout_ends_success(dagbag, history, sandbox_process,  # type: ignore[no-untyped-def]
                                                                      small_fleet) -> None:
    dag = dagbag.get_dag("kvfleet_rollout")

    refused = dag.test(run_conf=conf(small_fleet, lobs=["no-such-lob"]))
    assert refused.state == "failed"
    run = history.runs.get(f"kvfleet_rollout/{refused.run_id}")
    assert run is not None, "a run that never got past plan is in the history"
    assert run["status"] == "refused"
    assert "no-such-lob" in (run["reason"] or "")
    assert history.queries.rows("write_ahead", cutoff=EPOCH, run_key=run["run_key"], cluster=None, endpoint=None,
                         limit=100) == []  # refused before any change

    ok = dag.test(run_conf=conf(small_fleet, clusters=["c-kyverno"], lobs=["beta"]))
    assert ok.state == "success"
    run = history.runs.get(f"kvfleet_rollout/{ok.run_id}")
    assert run is not None and run["status"] == "success" and run["ended_at"] is not None
    # Its changes were written ahead: each intent has an outcome, none left unknown.
    rows = history.queries.rows("write_ahead", cutoff=EPOCH, run_key=run["run_key"], cluster=None, endpoint=None,
                         limit=1000)
    assert any(r["action"] == "create_iec" and r["endpoint"] == "beta/beta-rag" for r in rows), rows
    assert {r["outcome"] for r in rows} <= {"changed", "unchanged"}, rows
    assert history.audit.open_intents(run_key=run["run_key"]) == []
