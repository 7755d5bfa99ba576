"""kvfleet_drift_watch: one watched asset whose watcher (a ``FleetWatchTrigger`` in an ``AssetWatcher``) watches
every inventory cluster, read by kvfleet's validator; a run scoped to the clusters its asset events name, and the
drift check's own task bodies doing the work."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from kvfleet.airflow.triggers.fleet_watch import clusters_of_events, watch_errors_of_events, watched
from kvfleet.airflow.triggers.kube_watch import KubeWatchTrigger

pytestmark = pytest.mark.e2e
# The history and the run's per-cluster tasks name a cluster by its key account/region/name (the example fleet
# declares no account); the watch's events name it as the watcher did, by name.
PROD = "default/us-east-1/ml-prod-use1"
STAGE = "default/us-west-2/ml-stage-usw2"


def test_one_fleet_asset_whose_watcher_watches_every_inventory_cluster(dagbag: Any, example_fleet: Any) -> None:
    from kvfleet.airflow.params import default_fleet

    dag = dagbag.get_dag("kvfleet_drift_watch")
    assert dag is not None and dag.catchup is False and dag.max_active_runs == 1
    (asset,) = list(dag.timetable.asset_condition.objects)
    assert asset.name == "kvfleet_fleet_changed"
    (watcher,) = asset.watchers
    trigger = watcher.trigger
    if isinstance(trigger, dict):  # the serialized DAG keeps the trigger's classpath and kwargs
        classpath, kwargs = trigger["classpath"], trigger["kwargs"]
    else:
        classpath, kwargs = trigger.serialize()
    assert classpath == "kvfleet.airflow.triggers.fleet_watch.FleetWatchTrigger"
    assert kwargs["fleet"] == default_fleet() and kwargs["quiet_s"] == 15.0
    # What the watcher will watch, read in the triggerer: every cluster of the inventory, with its region.
    inventory = [(c["name"], c["region"]) for c in yaml.safe_load(example_fleet.read_text())["clusters"]]
    assert [(c.name, c.region) for c, _ in watched(str(example_fleet), None)] == inventory
    assert dag.get_task("summary").trigger_rule == "none_failed"


def test_the_clusters_of_a_run_are_those_its_asset_events_name() -> None:
    def event(payload: dict[str, Any]) -> Any:
        return SimpleNamespace(extra={"from_trigger": True, "payload": payload})

    events = {"a1": [event({"status": "changed", "cluster": "c2"}), event({"status": "changed", "cluster": "c1"})],
              "a2": [event({"status": "error", "cluster": "c3", "message": "watch refused"})],
              "a3": [SimpleNamespace(extra={})]}
    assert clusters_of_events(events) == ["c1", "c2", "c3"]
    assert clusters_of_events(None) == []
    # the failures among them, each once (a second event with the same failure adds nothing)
    events["a4"] = [event({"status": "error", "cluster": "c3", "message": "watch refused"}),
                    event({"status": "error", "cluster": "c1", "kind": "watch", "message": "x" * 5000})]
    assert watch_errors_of_events(events) == [
        {"cluster": "c1", "kind": "watch", "message": "x" * 1000},
        {"cluster": "c3", "kind": "watch", "message": "watch refused"}]
    assert watch_errors_of_events(None) == []
    assert KubeWatchTrigger("c1", "us-east-1").serialize()[1]["cluster"] == "c1"


def test_a_run_checks_only_the_changed_cluster(dagbag: Any, history: Any, example_fleet: Any, tmp_path: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    sandbox = start_sandbox(example_fleet, tmp_path / "sb", SandboxSettings(time_scale=0.005))
    try:
        for key, value in sandbox.exports().items():
            monkeypatch.setenv(key, value)
        dag = dagbag.get_dag("kvfleet_drift_watch")
        # dag.test() carries no asset events: the clusters param stands in for the watch's payload.
        dr = dag.test(run_conf={"fleet": str(example_fleet), "clusters": ["ml-prod-use1"]})
    finally:
        sandbox.stop()
    assert dr.state == "success"
    run = history.runs.get(f"kvfleet_drift_watch/{dr.run_id}")
    assert run is not None and run["status"] == "success"
    assert run["summary"]["clusters"] == [PROD]
    assert {r["cluster"] for r in history.queries.rows("open_drift")} == {PROD}


def test_the_watch_failures_that_triggered_a_run_are_recorded_per_cluster(history: Any) -> None:
    """A failed watch is in the history, not only in Airflow's asset events: one ``drift_watch:<cluster>`` step
    per cluster, with every reported error, and an audit-log line."""
    from kvfleet.airflow.drift import record_watch_errors
    from kvfleet.history.keys import StepKey

    run_key = "kvfleet_drift_watch/asset_triggered__t1"
    history.runs.start(run_key, dag_id="kvfleet_drift_watch", run_id="asset_triggered__t1", trigger="asset",
                      triggered_by=None, params={})
    errors = [{"cluster": "c1", "kind": "watch", "message": "watching c1 failed: ApiException: HTTP 503"},
              {"cluster": "c1", "kind": "Deployment", "message": "watching Deployment on c1 refused: HTTP 403"},
              {"cluster": "c2", "kind": "watch", "message": "watching c2 failed: EndpointConnectionError"}]
    record_watch_errors(history, StepKey(run_key, "scope"), "kvfleet", errors)
    steps = {s["step"]: s for s in history.runs.steps(run_key)}
    assert set(steps) == {"drift_watch:c1", "drift_watch:c2"}
    assert steps["drift_watch:c1"]["outcome"] == "watch_failed" and steps["drift_watch:c1"]["cluster"] == "c1"
    assert [e["message"] for e in steps["drift_watch:c1"]["detail"]["errors"]] == [errors[0]["message"],
                                                                                    errors[1]["message"]]
    from sqlalchemy import text

    with history.engine.connect() as conn:
        audited = conn.execute(text("SELECT cluster, action FROM audit_log WHERE run_key = :k ORDER BY cluster"),
                               {"k": run_key}).all()
    assert [tuple(r) for r in audited] == [("c1", "drift:watch_failed"), ("c2", "drift:watch_failed")]


def test_a_watch_triggered_run_checks_the_clusters_its_events_name_and_records_the_watch_failures(
        dagbag: Any, history: Any, example_fleet: Any) -> None:
    """The DAG's own ``scope`` task, given asset events as the triggerer's would make them (``dag.test()`` carries
    none): it checks the clusters they name, skips one the inventory no longer has (the watch read the inventory
    when it started), and records the watch's failure in the history."""
    from airflow.sdk.execution_time.context import set_current_context

    def event(payload: dict[str, Any]) -> Any:
        return SimpleNamespace(extra={"from_trigger": True, "payload": payload})

    failure = "watching ml-prod-use1 failed: ApiException: HTTP 503 Service Unavailable"
    events = {"kvfleet_fleet_changed": [
        event({"status": "changed", "cluster": "ml-stage-usw2"}),
        event({"status": "error", "cluster": "ml-prod-use1", "kind": "watch", "message": failure}),
        event({"status": "changed", "cluster": "ml-removed-since"})]}
    run_id = "asset_triggered__2026-12-02T00:00:00+00:00"
    context = {"dag_run": SimpleNamespace(dag_id="kvfleet_drift_watch", run_id=run_id, run_type="asset_triggered",
                                          triggering_user_name=None),
               "ti": SimpleNamespace(task_id="scope", map_index=-1)}
    scope = dagbag.get_dag("kvfleet_drift_watch").get_task("scope")
    with set_current_context(context):  # type: ignore[arg-type]
        clusters = scope.python_callable(params={"fleet": str(example_fleet), "clusters": [], "remediate": False,
                                                 "aws_conn_id": None}, triggering_asset_events=events)
    assert sorted(clusters) == [PROD, STAGE]
    steps = {s["step"]: s for s in history.runs.steps(f"kvfleet_drift_watch/{run_id}")}
    assert steps["scope"]["detail"]["not_in_inventory"] == ["ml-removed-since"]
    assert sorted(steps["scope"]["detail"]["clusters"]) == [PROD, STAGE]
    assert steps["drift_watch:ml-prod-use1"]["outcome"] == "watch_failed"
    assert steps["drift_watch:ml-prod-use1"]["cluster"] == PROD  # the row names the cluster by its key
    assert steps["drift_watch:ml-prod-use1"]["detail"]["errors"] == [{"kind": "watch", "message": failure}]
    assert "drift_watch:ml-stage-usw2" not in steps
