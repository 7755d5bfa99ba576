"""kvfleet_hit_verification: every hour, stage 5 on every managed endpoint — a fresh long prompt cold on one
pod, then on a pod on another node — with the cross-pod hit ratio and TTFT speedup against the published curve.

Thin by design: it imports airflow.sdk and kvfleet, and does no I/O at import time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task

from kvfleet.airflow import run_status, verification
from kvfleet.airflow.params import fleet_param, scope_params


@dag(
    dag_id="kvfleet_hit_verification",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={
        "fleet": fleet_param(),
        **scope_params(),
        "prompt_tokens": Param(2000, type="integer", minimum=512, maximum=32768, title="Prompt length (tokens)",
                               description="At least two 256-token chunks: shorter prompts never write L2."),
        "sweep": Param(False, type="boolean", title="Sweep 500…3,000 tokens",
                       description="Record the endpoint's speedup curve beside the published one."),
    },
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": run_status.on_task_failure},
    on_success_callback=run_status.on_dag_success,
    on_failure_callback=run_status.on_dag_failure,
    tags=["kvfleet"],
    doc_md=__doc__,
)
def kvfleet_hit_verification() -> None:
    @task
    def scope(params=None):  # type: ignore[no-untyped-def]
        return verification.open_run(params)

    @task(max_active_tis_per_dagrun=4)
    def verify_cluster(cluster, params=None):  # type: ignore[no-untyped-def]
        return verification.verify_cluster(cluster, params)

    @task(trigger_rule="none_failed")
    def summary(results):  # type: ignore[no-untyped-def]
        return verification.summarize(results)

    summary(verify_cluster.expand(cluster=scope()))


kvfleet_hit_verification()
