"""kvfleet_rollout through dag.test(): the plan is recorded in the history store, bad Params are refused."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_rollout_dry_run_records_run_and_plan(dagbag, history, example_fleet) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.get_dag("kvfleet_rollout")
    dr = dag.test(run_conf={"fleet": str(example_fleet), "dry_run": True, "clusters": ["ml-stage-usw2"]})
    assert dr.state == "success"
    run = history.run(f"kvfleet_rollout/{dr.run_id}")
    assert run is not None and run["status"] == "success" and run["trigger"] == "manual"
    assert [c["cluster"] for c in run["plan"]["clusters"]] == ["ml-stage-usw2"]
    assert run["plan"]["clusters"][0]["waves"][0]["kind"] == "canary"
    assert [s["step"] for s in history.steps(run["run_key"]) if s["stage"] == "plan"] == ["plan"]


def test_unknown_cluster_fails_the_run_before_anything_is_recorded(dagbag, history, example_fleet) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.get_dag("kvfleet_rollout")
    dr = dag.test(run_conf={"fleet": str(example_fleet), "clusters": ["ml-prod-euw1"]})
    assert dr.state == "failed"
    assert history.run(f"kvfleet_rollout/{dr.run_id}") is None
