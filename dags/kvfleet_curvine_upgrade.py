"""kvfleet_curvine_upgrade: on demand, upgrade the Curvine chart on the chosen clusters without ever bringing a
format flag back — gates before any change, snapshots before and after, post-checks, and a rollback (when asked)
only to the newest revision whose stored values have every format flag false. Production clusters wait for a
human approval unless the `approval` Param says otherwise.

Thin by design: it imports airflow.sdk and kvfleet, and does no I/O at import time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, dag, task

from kvfleet.airflow import curvine, run_status
from kvfleet.airflow.params import fleet_param, scope_params


@dag(
    dag_id="kvfleet_curvine_upgrade",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={
        "fleet": fleet_param(),
        "clusters": scope_params()["clusters"],
        "version": Param("", type="string", title="Target chart version",
                         description="The curvine chart version to upgrade to, e.g. 0.3.3-alpha."),
        "overrides": Param({}, type="object", title="Extra value overrides",
                           description="Dotted keys to values, e.g. {\"config.log.level\": \"DEBUG\"}; kvfleet "
                                       "writes them to a values file (-f), never --set. Any key or value touching a "
                                       "format flag (cluster.*format*) is refused, even with approval."),
        "dry_run": Param(False, type="boolean", title="Dry run",
                         description="Run every gate and print the exact helm command and values diff; change "
                                     "nothing."),
        "approval": Param("auto", type="string", enum=["auto", "always", "never"], title="Human approval",
                          description="auto: required when a selected cluster is production in the inventory."),
        "rollback": Param(True, type="boolean", title="Roll back on failure",
                          description="To the newest earlier revision with every format flag false; never to one "
                                      "with a flag true."),
        "timeout_minutes": Param(15, type="number", minimum=1, maximum=240, title="Rollout timeout (minutes)"),
        "expired_files_allowance": Param(0, type="integer", minimum=0, title="Files allowed to expire",
                                         description="Post-check: files after >= files before - this (Curvine "
                                                     "TTL). LMCache writes L2 without a TTL."),
        "l2_check": Param("file", type="string", enum=["file", "endpoint"], title="L2-still-serves check",
                          description="file: re-read files written before; endpoint: stage 5 on one endpoint."),
        "lock_wait_minutes": Param(0, type="number", minimum=0, maximum=120, title="Wait for the cluster lock"),
    },
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": run_status.on_task_failure},
    on_success_callback=run_status.on_dag_success,
    on_failure_callback=run_status.on_dag_failure,
    tags=["kvfleet", "curvine"],
    doc_md=__doc__,
)
def kvfleet_curvine_upgrade() -> None:
    @task
    def scope(params=None):  # type: ignore[no-untyped-def]
        return curvine.open_upgrade(params)

    @task(max_active_tis_per_dagrun=8)
    def preflight(cluster, params=None):  # type: ignore[no-untyped-def]
        return curvine.preflight_cluster(cluster, params)

    @task.branch
    def approval_route(clusters, params=None):  # type: ignore[no-untyped-def]
        return curvine.approval_route(clusters, params)

    approve = ApprovalOperator(
        task_id=curvine.APPROVE_TASK,
        subject="Curvine upgrade to {{ params.version }} on {{ params.clusters or 'every cluster' }}",
        body="The preflight task's log shows, per cluster, the exact helm command and the values diff. Every "
             "format flag stays false; approving does not allow an override that sets one.",
        response_timeout=timedelta(hours=24),
    )
    straight_on = EmptyOperator(task_id=curvine.NO_APPROVAL_TASK)

    @task(trigger_rule="none_failed_min_one_success", retries=0)
    def upgrade(cluster, params=None):  # type: ignore[no-untyped-def]
        return curvine.upgrade_cluster(cluster, params)

    @task(trigger_rule="none_failed")
    def summary(results, params=None):  # type: ignore[no-untyped-def]
        return curvine.summarize(results, params)

    clusters = scope()
    plans = preflight.expand(cluster=clusters)
    route = approval_route(clusters)
    plans >> route >> [approve, straight_on]
    results = upgrade.expand(cluster=clusters)
    [approve, straight_on] >> results
    summary(results)


kvfleet_curvine_upgrade()
