"""kvfleet_rollout through dag.test() without a fleet: a scope naming an unknown cluster fails the run at once,
before anything is recorded or changed (the full rollout runs in tests/integration/dags)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_unknown_cluster_fails_the_run_before_anything_is_recorded(dagbag, history, example_fleet) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.get_dag("kvfleet_rollout")
    dr = dag.test(run_conf={"fleet": str(example_fleet), "clusters": ["ml-prod-euw1"]})
    assert dr.state == "failed"
    assert history.run(f"kvfleet_rollout/{dr.run_id}") is None
