"""kvfleet_rollout through dag.test() without a fleet: a scope naming an unknown cluster fails the run at once,
before anything changes, and the history records the refusal (the full rollout runs in tests/integration/dags)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_unknown_cluster_is_refused_before_anything_changes_and_recorded(dagbag, history, example_fleet) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.get_dag("kvfleet_rollout")
    dr = dag.test(run_conf={"fleet": str(example_fleet), "clusters": ["ml-prod-euw1"]})
    assert dr.state == "failed"
    run = history.runs.get(f"kvfleet_rollout/{dr.run_id}")
    assert run is not None and run["status"] == "refused" and "ml-prod-euw1" in (run.get("reason") or "")
