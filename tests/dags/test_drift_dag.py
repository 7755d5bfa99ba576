"""kvfleet_drift_check through dag.test() against a sandbox: scheduled every 10 minutes, one cluster's API down
does not fail the run, findings land in the history store, the summary counts them."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytestmark = pytest.mark.e2e
# The results and the history name a cluster by its key account/region/name (the example fleet declares no account).
PROD = "default/us-east-1/ml-prod-use1"
STAGE = "default/us-west-2/ml-stage-usw2"


def test_schedule_and_params(dagbag) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.get_dag("kvfleet_drift_check")
    assert dag.timetable.delta == timedelta(minutes=10)
    assert dag.catchup is False and dag.max_active_runs == 1
    assert dag.params["remediate"] is False
    check = dag.get_task("check_cluster")
    assert check.max_active_tis_per_dagrun and check.max_active_tis_per_dagrun > 1  # clusters in parallel
    assert dag.get_task("summary").trigger_rule == "none_failed"


def test_an_unreachable_cluster_is_recorded_and_the_run_succeeds(  # type: ignore[no-untyped-def]
        dagbag, history, example_fleet, tmp_path, monkeypatch) -> None:
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    sandbox = start_sandbox(example_fleet, tmp_path / "sb", SandboxSettings(time_scale=0.005))
    try:
        for key, value in sandbox.exports().items():
            monkeypatch.setenv(key, value)
        sandbox.servers["ml-stage-usw2"].error_rate = 1.0
        dag = dagbag.get_dag("kvfleet_drift_check")
        dr = dag.test(run_conf={"fleet": str(example_fleet)})
    finally:
        sandbox.stop()
    assert dr.state == "success"
    run = history.runs.get(f"kvfleet_drift_check/{dr.run_id}")
    assert run is not None and run["status"] == "success"
    summary = run["summary"]
    assert summary["clusters"] == [PROD, STAGE]
    assert summary["unreachable"] == [STAGE]
    assert summary["by_kind"]["cluster_unreachable"] == 1
    # Nothing was rolled out on ml-prod-use1: its check ran and saw that.
    assert summary["by_kind"]["endpoint_missing"] == 7 and summary["remediations"] == 0
    open_rows = history.queries.rows("open_drift")
    assert {r["cluster"] for r in open_rows} == {PROD, STAGE}
    assert [r["kind"] for r in open_rows if r["cluster"] == STAGE] == ["cluster_unreachable"]


def test_a_freeze_holds_the_remediation_of_its_cluster_not_the_check(  # type: ignore[no-untyped-def]
        dagbag, history, example_fleet, tmp_path, monkeypatch) -> None:
    """``kvfleet freeze on --cluster`` (``Holds.freeze``) and a drift check asked to remediate: the frozen cluster
    is still observed and its findings recorded, but nothing is changed there (no mutating Kubernetes request), a
    ``remediation_held`` step says why, and the run ends frozen; the other cluster is checked as usual."""
    from kvfleet.history.holds import CLUSTER, Scope
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    sandbox = start_sandbox(example_fleet, tmp_path / "sb", SandboxSettings(time_scale=0.005))
    try:
        for key, value in sandbox.exports().items():
            monkeypatch.setenv(key, value)
        history.holds.freeze(Scope(CLUSTER, STAGE), "network migration", "oncall")
        sandbox.twin("ml-stage-usw2").store.reset_request_log()
        dr = dagbag.get_dag("kvfleet_drift_check").test(run_conf={"fleet": str(example_fleet), "remediate": True})
        counts = sandbox.twin("ml-stage-usw2").store.request_counts()
    finally:
        sandbox.stop()
    assert {k: n for k, n in counts.items() if k[0] in ("create", "update", "patch", "delete")} == {}, counts
    assert any(verb == "list" for verb, _ in counts), counts  # it was observed
    run_key = f"kvfleet_drift_check/{dr.run_id}"
    run = history.runs.get(run_key)
    assert run["status"] == "frozen" and "network migration" in (run["reason"] or ""), run
    [held] = [s for s in history.runs.steps(run_key) if s["step"].startswith("remediation_held:")]
    assert (held["cluster"], held["outcome"]) == (STAGE, "frozen"), held
    assert sorted(run["summary"]["clusters"]) == [PROD, STAGE]
