"""kvfleet_curvine_scale_out: add NVMe workers to Curvine and prove the capacity arrived.

Scheduled, it detects: GPU nodes without a Curvine worker (new nodes joined) or fs_used/capacity staying above the
threshold; it records the decision and scales only on clusters whose inventory says `curvine.scale_out: auto`,
reporting elsewhere. On demand, `target_workers` or `all_eligible` ask for a count. Scale-in is refused unless
`allow_scale_in` is set, and the log says how much cached data it would drop.

Thin by design: at parse time it imports only airflow.sdk and kvfleet's light modules (the Params, the
callbacks) and does no I/O; each task imports its body (kvfleet.airflow.curvine) when it runs. Runbook:
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
from kvfleet.airflow.params import MAP_INDEX_TEMPLATE, curvine_scale_out_params


@dag(
    dag_id="kvfleet_curvine_scale_out",
    schedule="*/30 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=curvine_scale_out_params(),
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": callbacks.on_task_failure},
    on_success_callback=callbacks.on_dag_success,
    on_failure_callback=callbacks.on_dag_failure,
    tags=["kvfleet", "curvine"],
    doc_md=__doc__,
)
def kvfleet_curvine_scale_out() -> None:
    @task
    def scope(params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import curvine

        return curvine.open_scale(params)

    @task(max_active_tis_per_dagrun=8, map_index_template=MAP_INDEX_TEMPLATE)
    def scale(cluster, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import curvine

        return curvine.scale_cluster(cluster, params)

    @task(trigger_rule="none_failed")
    def summary(results, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import curvine

        return curvine.summarize(results, params)

    summary(scale.expand(cluster=scope()))


kvfleet_curvine_scale_out()
