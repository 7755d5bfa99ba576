"""kvfleet_drift_check: every 10 minutes, compare every managed endpoint and cluster with the inventory; record
what drifted (opened, still open, resolved) and, when asked, remediate with the rollout's own reconcilers.

Clusters are checked in parallel; an unreachable cluster is recorded as ``cluster_unreachable`` without failing
the others.

Thin by design: at parse time it imports only airflow.sdk and kvfleet's light modules (the Params, the
callbacks) and does no I/O; each task imports its body (kvfleet.airflow.drift) when it runs. Runbook:
docs/runbook.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# `task` comes from airflow.sdk.definitions.decorators, which airflow.sdk imports lazily, on first use. It is
# named here so that Airflow's DAG processor pre-imports it in its manager before forking the child that parses
# this file ([dag_processor] parsing_pre_import_modules, default True: airflow/dag_processing/processor.py
# `_pre_import_airflow_modules`, Airflow 3.3.2): the child inherits it (and the standard provider's python
# operators it loads) instead of importing them on every parse (bench/parse_time.py).
import airflow.sdk.definitions.decorators  # noqa: F401
from airflow.sdk import dag, task

from kvfleet.airflow import callbacks
from kvfleet.airflow.params import MAP_INDEX_TEMPLATE, drift_params


@dag(
    dag_id="kvfleet_drift_check",
    schedule=timedelta(minutes=10),
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
def kvfleet_drift_check() -> None:
    @task
    def scope(params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import drift

        return drift.open_run(params)

    @task(max_active_tis_per_dagrun=16, map_index_template=MAP_INDEX_TEMPLATE)
    def check_cluster(cluster, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import drift

        return drift.check_cluster(cluster, params)

    @task(trigger_rule="none_failed")
    def summary(results):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import drift

        return drift.summarize(results)

    summary(check_cluster.expand(cluster=scope()))


kvfleet_drift_check()
