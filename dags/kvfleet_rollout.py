"""kvfleet_rollout: plan, then per cluster stages 1–3, then endpoints in waves (canary first) with gates.

Thin by design: it imports airflow.sdk and kvfleet, and does no I/O at import time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag, task

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
    def finish(plan_dict, params=None):  # type: ignore[no-untyped-def]
        return rollout.finish_rollout(plan_dict, params)

    finish(plan())


kvfleet_rollout()
