"""kvfleet_hit_verification: every hour, stage 5 on every managed endpoint — a fresh long prompt cold on one
pod, then on a pod on another node — with the cross-pod hit ratio and TTFT speedup against the published curve;
and the L2 advisor per cluster (does the shared L2 pay off for each endpoint's traffic, is Curvine's capacity
right).

Thin by design: at parse time it imports only airflow.sdk and kvfleet's light modules (the Params, the
callbacks) and does no I/O; each task imports its body (kvfleet.airflow.verification) when it runs. Runbook:
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
from kvfleet.airflow.params import MAP_INDEX_TEMPLATE, verification_params


@dag(
    dag_id="kvfleet_hit_verification",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=verification_params(),
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": callbacks.on_task_failure},
    on_success_callback=callbacks.on_dag_success,
    on_failure_callback=callbacks.on_dag_failure,
    tags=["kvfleet"],
    doc_md=__doc__,
)
def kvfleet_hit_verification() -> None:
    @task
    def scope(params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import verification

        return verification.open_run(params)

    @task(max_active_tis_per_dagrun=4, map_index_template=MAP_INDEX_TEMPLATE)
    def verify_cluster(cluster, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import verification

        return verification.verify_cluster(cluster, params)

    @task(trigger_rule="none_failed")
    def summary(results):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import verification

        return verification.summarize(results)

    # The L2 advisor (read-only): per endpoint, whether the shared L2 pays off for its traffic, and the cluster's
    # Curvine capacity recommendation, recorded as a step for `kvfleet audit` and the kvfleet page.
    @task(max_active_tis_per_dagrun=4, retries=0, map_index_template=MAP_INDEX_TEMPLATE)
    def advise(cluster, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import verification

        return verification.advise_cluster(cluster, params)

    clusters = scope()
    summary(verify_cluster.expand(cluster=clusters))
    advise.expand(cluster=clusters)


kvfleet_hit_verification()
