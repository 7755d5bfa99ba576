"""kvfleet_drift_watch: the drift check of one cluster, run within a minute of a change to it.

A ``KubeWatchTrigger`` per inventory cluster (run by one ``FleetWatchTrigger``, which reads the inventory in the
triggerer) watches what the drift check compares: the managed InferenceEndpointConfigs, Deployments and Pods, the
Inference Operator's controller and Curvine's Helm release Secrets. It emits one asset event per burst of changes
kvfleet's field manager did not write (``kvfleet.fleet.watch_rules``; debounced, 15 s of quiet), naming the
cluster, through an ``AssetWatcher`` on the ``kvfleet_fleet_changed`` asset; this DAG is scheduled on it and runs
``kvfleet.airflow.drift``'s task bodies (the same as ``kvfleet_drift_check``) on the clusters the events name. An
invalid inventory is an event naming no cluster: the run reads the inventory itself and fails with its problems.
``kvfleet_drift_check`` still runs every 10 minutes: the safety net for anything a watch missed.

Thin by design: at parse time it imports only airflow.sdk, kvfleet's light modules (the Params, the callbacks,
the trigger classes, whose clients load inside ``run()``); no file is read, no client is built, no API is called.
Runbook: docs/runbook.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# `task` comes from airflow.sdk.definitions.decorators, which airflow.sdk imports lazily, on first use. It is
# named here so that Airflow's DAG processor pre-imports it in its manager before forking the child that parses
# this file ([dag_processor] parsing_pre_import_modules, default True: airflow/dag_processing/processor.py
# `_pre_import_airflow_modules`, Airflow 3.3.2): the child inherits it (and the standard provider's python
# operators it loads) instead of importing them on every parse (bench/parse_time.py).
import airflow.sdk.definitions.decorators  # noqa: F401
from airflow.sdk import Asset, AssetWatcher, dag, task

from kvfleet.airflow import callbacks
from kvfleet.airflow.params import MAP_INDEX_TEMPLATE, default_fleet, drift_params, drift_watch_quiet_s
from kvfleet.airflow.triggers.fleet_watch import FleetWatchTrigger

# One asset for the fleet: its watcher reads the inventory in the triggerer and watches every cluster there, so
# this file does no I/O at parse time and a cluster added to the inventory is watched without a DAG change.
FLEET_CHANGED = Asset(name="kvfleet_fleet_changed", group="kvfleet", watchers=[AssetWatcher(
    name="kvfleet_fleet_watch", trigger=FleetWatchTrigger(default_fleet(), aws_conn_id="aws_default",
                                                         quiet_s=drift_watch_quiet_s()))])


@dag(
    dag_id="kvfleet_drift_watch",
    schedule=[FLEET_CHANGED],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=drift_params(),
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": callbacks.on_task_failure},
    on_success_callback=callbacks.on_dag_success,
    on_failure_callback=callbacks.on_dag_failure,
    tags=["kvfleet"],
    doc_md=__doc__,
)
def kvfleet_drift_watch() -> None:
    @task
    def scope(params=None, triggering_asset_events=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import drift
        from kvfleet.airflow.triggers.fleet_watch import clusters_of_events, watch_errors_of_events

        # the clusters the events name (the Params' scope when there are none: a run triggered by hand)
        return drift.open_run(dict(params), watch_errors_of_events(triggering_asset_events),
                              clusters_of_events(triggering_asset_events))

    @task(max_active_tis_per_dagrun=16, map_index_template=MAP_INDEX_TEMPLATE)
    def check_cluster(cluster, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import drift

        return drift.check_cluster(cluster, {**params, "clusters": [cluster]})

    @task(trigger_rule="none_failed")
    def summary(results):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import drift

        return drift.summarize(results)

    summary(check_cluster.expand(cluster=scope()))


kvfleet_drift_watch()
