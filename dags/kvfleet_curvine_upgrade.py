"""kvfleet_curvine_upgrade: on demand, upgrade the Curvine chart on the chosen clusters without ever bringing a
format flag back — gates before any change, snapshots before and after, post-checks, and a rollback (when asked)
only to the newest revision whose stored values have every format flag false. Production clusters wait for a
human approval unless the `approval` Param says otherwise.

Thin by design: at parse time it imports only airflow.sdk, the standard provider's operators (which the DAG
processor pre-imports once, see below) and kvfleet's light modules (the Params, the callbacks and the gate's
notifier, which imports kvfleet.airflow.notify only when it fires) and does no I/O; each task imports its body
(kvfleet.airflow.curvine) when it runs. Runbook: docs/runbook.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# The approval gate is a HITL operators (kvfleet.airflow.operators subclasses the standard provider's), and
# `task` comes from airflow.sdk.definitions.decorators, which airflow.sdk imports lazily, on first use. Both
# modules are named here because this file uses them: Airflow's DAG processor imports the `airflow.*` modules
# a DAG file names in its manager process before forking the child that parses the file ([dag_processor]
# parsing_pre_import_modules, default True: airflow/dag_processing/processor.py `_pre_import_airflow_modules`,
# called from `DagFileProcessorProcess.start`; airflow/utils/file.py `iter_airflow_imports`, Airflow 3.3.2), so
# the forked child inherits them (and the standard provider's python operators that the decorators load)
# instead of importing them on every parse (bench/parse_time.py).
import airflow.providers.standard.operators.hitl
import airflow.sdk.definitions.decorators  # noqa: F401
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import dag, task

from kvfleet.airflow import callbacks
from kvfleet.airflow.operators import CurvineApprovalOperator
from kvfleet.airflow.params import (
    CURVINE_APPROVE_TASK,
    CURVINE_NO_APPROVAL_TASK,
    MAP_INDEX_TEMPLATE,
    curvine_upgrade_params,
)


@dag(
    dag_id="kvfleet_curvine_upgrade",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=curvine_upgrade_params(),
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": callbacks.on_task_failure},
    on_success_callback=callbacks.on_dag_success,
    on_failure_callback=callbacks.on_dag_failure,
    tags=["kvfleet", "curvine"],
    doc_md=__doc__,
)
def kvfleet_curvine_upgrade() -> None:
    @task
    def scope(params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import curvine

        return curvine.open_upgrade(params)

    @task(max_active_tis_per_dagrun=8, map_index_template=MAP_INDEX_TEMPLATE)
    def preflight(cluster, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import curvine

        return curvine.preflight_cluster(cluster, params)

    @task.branch
    def approval_route(clusters, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import curvine

        return curvine.approval_route(clusters, params)

    approve = CurvineApprovalOperator(
        task_id=CURVINE_APPROVE_TASK,
        subject="Curvine upgrade to {{ params.version }} on {{ params.clusters or 'every cluster' }}",
        response_timeout=timedelta(hours=24),
        notifiers=[callbacks.gate_waiting_notifier()],
    )
    straight_on = EmptyOperator(task_id=CURVINE_NO_APPROVAL_TASK)

    @task(trigger_rule="none_failed_min_one_success", retries=0, map_index_template=MAP_INDEX_TEMPLATE)
    def upgrade(cluster, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import curvine

        return curvine.upgrade_cluster(cluster, params)

    @task(trigger_rule="none_failed")
    def summary(results, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import curvine

        return curvine.summarize(results, params)

    clusters = scope()
    plans = preflight.expand(cluster=clusters)
    route = approval_route(clusters)
    plans >> route >> [approve, straight_on]
    results = upgrade.expand(cluster=clusters)
    [approve, straight_on] >> results
    summary(results)


kvfleet_curvine_upgrade()
