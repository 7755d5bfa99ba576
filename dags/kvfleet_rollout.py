"""kvfleet_rollout: plan, then per cluster stages 1–3, then endpoints in waves (canary first), each wave
verified by stage 5; a teardown restores the Inference Operator if this run paused it and anything failed.

Thin by design: it imports airflow.sdk and kvfleet, and does no I/O at import time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag, task, task_group

from kvfleet.airflow import rollout
from kvfleet.airflow.params import rollout_params


@dag(
    dag_id="kvfleet_rollout",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=rollout_params(),
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["kvfleet"],
    doc_md=__doc__,
)
def kvfleet_rollout() -> None:
    @task
    def plan(params=None):  # type: ignore[no-untyped-def]
        return rollout.plan_rollout(params)

    @task
    def clusters(plan_dict):  # type: ignore[no-untyped-def]
        return rollout.cluster_names(plan_dict)

    @task_group(group_id="cluster")
    def per_cluster(cluster: str, plan_dict: dict) -> None:
        @task(max_active_tis_per_dagrun=8)
        def cluster_stages(cluster, params=None):  # type: ignore[no-untyped-def]
            return rollout.run_cluster_stages(cluster, params)

        @task(max_active_tis_per_dagrun=8)
        def cluster_waves(cluster, plan_dict, params=None):  # type: ignore[no-untyped-def]
            return rollout.run_cluster_waves(cluster, plan_dict, params)

        @task(retries=3)
        def restore_operator(cluster, params=None):  # type: ignore[no-untyped-def]
            return rollout.restore_operator(cluster, params)

        stages = cluster_stages(cluster)
        waves = cluster_waves(cluster, plan_dict)
        # A failed restore must fail the run loudly: the operator would be left paused.
        restore = restore_operator(cluster).as_teardown(setups=stages, on_failure_fail_dagrun=True)
        stages >> waves >> restore

    @task(trigger_rule="none_failed")
    def finish(plan_dict, params=None):  # type: ignore[no-untyped-def]
        return rollout.finish_rollout(plan_dict, params)

    p = plan()
    groups = per_cluster.partial(plan_dict=p).expand(cluster=clusters(p))
    groups >> finish(p)


kvfleet_rollout()
