"""kvfleet_drift_watch: the drift check of one cluster, run within a minute of a change to it (issue 19).

A ``KubeWatchTrigger`` per inventory cluster watches, in Airflow's triggerer, what the drift check compares: the
managed InferenceEndpointConfigs, Deployments and Pods, the Inference Operator's controller and Curvine's Helm
release Secrets. It emits one asset event per burst of changes made by someone other than kvfleet (debounced,
15 s of quiet), through an ``AssetWatcher`` on the cluster's asset; this DAG is scheduled on those assets and
runs ``kvfleet.airflow.drift``'s task bodies (the same as ``kvfleet_drift_check``) on the changed clusters only.
``kvfleet_drift_check`` still runs every 10 minutes: the safety net for anything a watch missed.

Thin by design: at parse time it imports only airflow.sdk, kvfleet's light modules (the Params, the callbacks,
the trigger classes, whose clients load inside ``run()``) and reads the inventory's cluster names and regions as
plain YAML; no client is built and no API is called. Runbook: docs/runbook.md.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from pathlib import Path

import yaml
from airflow.sdk import Asset, AssetAny, AssetWatcher, dag, task

from kvfleet.airflow import callbacks
from kvfleet.airflow.params import DEFAULT_FLEET, drift_params
from kvfleet.airflow.triggers import KubeWatchTrigger

log = logging.getLogger(__name__)
QUIET_S = float(os.environ.get("KVFLEET_DRIFT_WATCH_QUIET_S", "15"))


def _inventory_clusters(fleet: str) -> list[tuple[str, str, str]]:
    """(name, region, Curvine namespace) of every inventory cluster, read as plain YAML (the full inventory
    model is for tasks).
    A relative path is the working directory's, else the checkout's (as ``kvfleet`` resolves it)."""
    path = Path(fleet)
    if not path.is_absolute() and not path.exists():
        path = Path(__file__).resolve().parents[1] / fleet
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        log.warning("kvfleet_drift_watch: inventory %s unreadable (%s): no cluster is watched; "
                    "kvfleet_drift_check's schedule still covers the fleet", path, exc)
        return []
    return [(str(c["name"]), str(c.get("region") or "us-east-1"),
             str((c.get("curvine") or {}).get("namespace") or "curvine"))
            for c in doc.get("clusters") or [] if isinstance(c, dict) and c.get("name")]


def cluster_asset(name: str, region: str, curvine_namespace: str) -> Asset:
    return Asset(name=f"kvfleet_cluster_changed_{name}", group="kvfleet", watchers=[AssetWatcher(
        name=f"kvfleet_watch_{name}",
        trigger=KubeWatchTrigger(name, region, aws_conn_id="aws_default", curvine_namespace=curvine_namespace,
                                 quiet_s=QUIET_S))])


ASSETS = [cluster_asset(*cluster) for cluster in _inventory_clusters(DEFAULT_FLEET)]


@dag(
    dag_id="kvfleet_drift_watch",
    schedule=AssetAny(*ASSETS) if ASSETS else None,
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
        from kvfleet.airflow.triggers import clusters_of_events

        changed = clusters_of_events(triggering_asset_events) or list(params.get("clusters") or [])
        return drift.open_run({**params, "clusters": changed})

    @task(max_active_tis_per_dagrun=16)
    def check_cluster(cluster, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import drift

        return drift.check_cluster(cluster, {**params, "clusters": [cluster]})

    @task(trigger_rule="none_failed")
    def summary(results):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import drift

        return drift.summarize(results)

    summary(check_cluster.expand(cluster=scope()))


kvfleet_drift_watch()
