"""kvfleet_curvine_scale_out: add NVMe workers to Curvine and prove the capacity arrived.

Scheduled, it detects: GPU nodes without a Curvine worker (new nodes joined) or fs_used/capacity staying above the
threshold; it records the decision and scales only on clusters whose inventory says `curvine.scale_out: auto`,
reporting elsewhere. On demand, `target_workers` or `all_eligible` ask for a count. Scale-in is refused unless
`allow_scale_in` is set, and the log says how much cached data it would drop.

Thin by design: it imports airflow.sdk and kvfleet, and does no I/O at import time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task

from kvfleet.airflow import curvine, run_status
from kvfleet.airflow.params import fleet_param, scope_params


@dag(
    dag_id="kvfleet_curvine_scale_out",
    schedule="*/30 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={
        "fleet": fleet_param(),
        "clusters": scope_params()["clusters"],
        "target_workers": Param(None, type=["null", "integer"], minimum=1, title="Target worker count",
                                description="On demand. Empty (and all_eligible off): detect, as the schedule does."),
        "all_eligible": Param(False, type="boolean", title="One worker per eligible GPU node"),
        "allow_scale_in": Param(False, type="boolean", title="Allow scale-in",
                                description="Dropping workers drops their cached KV blocks (recomputable, a TTFT "
                                            "hit)."),
        "threshold_percent": Param(80, type="number", minimum=1, maximum=100, title="fs_used/capacity threshold (%)"),
        "dry_run": Param(False, type="boolean", title="Dry run",
                         description="Print the exact helm command and values diff; change nothing."),
        "timeout_minutes": Param(15, type="number", minimum=1, maximum=240, title="Timeout (minutes)"),
        "lock_wait_minutes": Param(0, type="number", minimum=0, maximum=120, title="Wait for the cluster lock"),
    },
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": run_status.on_task_failure},
    on_success_callback=run_status.on_dag_success,
    on_failure_callback=run_status.on_dag_failure,
    tags=["kvfleet", "curvine"],
    doc_md=__doc__,
)
def kvfleet_curvine_scale_out() -> None:
    @task
    def scope(params=None):  # type: ignore[no-untyped-def]
        return curvine.open_scale(params)

    @task(max_active_tis_per_dagrun=8)
    def scale(cluster, params=None):  # type: ignore[no-untyped-def]
        return curvine.scale_cluster(cluster, params)

    @task(trigger_rule="none_failed")
    def summary(results, params=None):  # type: ignore[no-untyped-def]
        return curvine.summarize(results, params)

    summary(scale.expand(cluster=scope()))


kvfleet_curvine_scale_out()
