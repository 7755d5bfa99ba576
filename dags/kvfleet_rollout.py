"""kvfleet_rollout: the tiered KV cache rolled out as a progressive delivery, and the daily reconcile.

plan (stored with the run in the history store; the task returns the clusters' names) -> per cluster (in
parallel up to ``max_parallel_clusters``): preflight (the prerequisites; a cluster missing any is refused with
the fixes, before anything changes) -> stages 1–3 -> canary wave (one endpoint per LOB) -> gate -> the
remaining waves in plan order, each followed by a gate -> teardown (operator restored, lease released) -> a
summary per line of business. A gate passes on verified cross-pod hits, stops the cluster's later waves on a
failure, and asks a human (approve / skip the endpoint / abort) when the verification is inconclusive or when
``approval`` asks for it. ``dry_run`` prints the exact diff instead.

Waits do not hold a worker slot: the lease wait, a cluster or add-on still converging and the bake defer to the
triggerer (``deferrable_task``); the mutating tasks run in the pools ``kvfleet_cluster_changes`` and
``kvfleet_endpoint_waves`` (docs/run-for-real.md). The teardown (``cluster.release``) runs in no kvfleet pool
(Airflow's ``default_pool``) and with a higher priority weight, so that it never queues behind other runs'
stages: it is what frees the cluster's lease and restores its operator.

Thin by design: at parse time it imports only airflow.sdk, the standard provider's HITL operators (which the
DAG processor pre-imports once, see below) and kvfleet's light modules (the Params, the gate operator, the
callbacks and the gate's notifier, which imports kvfleet.airflow.notify only when it fires) and does no I/O;
each task imports its body (kvfleet.airflow.rollout: the stages, the Kubernetes and AWS clients, the history)
when it runs. Runbook: docs/runbook.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

# The wave gates are HITL operators (kvfleet.airflow.operators subclasses the standard provider's), and
# `task` comes from airflow.sdk.definitions.decorators, which airflow.sdk imports lazily, on first use. Both
# modules are named here because this file uses them: Airflow's DAG processor imports the `airflow.*` modules
# a DAG file names in its manager process before forking the child that parses the file ([dag_processor]
# parsing_pre_import_modules, default True: airflow/dag_processing/processor.py `_pre_import_airflow_modules`,
# called from `DagFileProcessorProcess.start`; airflow/utils/file.py `iter_airflow_imports`, Airflow 3.3.2), so
# the forked child inherits them (and the standard provider's python operators that the decorators load)
# instead of importing them on every parse (bench/parse_time.py).
import airflow.providers.standard.operators.hitl
import airflow.sdk.definitions.decorators  # noqa: F401
from airflow.sdk import dag, task, task_group

from kvfleet.airflow import callbacks
from kvfleet.airflow.operators import CLUSTER_POOL, ENDPOINT_POOL, WaveGateOperator, deferrable_task
from kvfleet.airflow.params import MAP_INDEX_TEMPLATE, WAVE_SLOTS, rollout_params

TEARDOWN_PRIORITY_WEIGHT = 10


def wave_slot(slot: int):  # type: ignore[no-untyped-def]
    """Slot ``slot`` of a cluster's waves (slot 0 is the canary; the last slot runs every remaining wave)."""

    @deferrable_task(task_id=f"wave_{slot}", max_active_tis_per_dagrun=16, pool=ENDPOINT_POOL,
                     map_index_template=MAP_INDEX_TEMPLATE)
    def wave(cluster, previous, params=None, kvfleet_resume=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import rollout

        return rollout.run_wave_slot(cluster, slot, previous, params, kvfleet_resume)

    return wave


@dag(
    dag_id="kvfleet_rollout",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=rollout_params(),
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10),
                  "on_failure_callback": callbacks.on_task_failure},
    on_success_callback=callbacks.on_dag_success,
    on_failure_callback=callbacks.on_dag_failure,
    tags=["kvfleet"],
    doc_md=__doc__,
)
def kvfleet_rollout() -> None:
    # Returns the plan's cluster names; the plan goes to the history store (runs.plan), where each task reads its
    # cluster's part, so no XCom grows with the fleet.
    @task(retries=0)
    def plan(params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import rollout

        return rollout.plan_rollout(params)

    @task_group(group_id="cluster")
    def per_cluster(cluster: str):  # type: ignore[no-untyped-def]
        @task(max_active_tis_per_dagrun=16, map_index_template=MAP_INDEX_TEMPLATE)
        def preflight(cluster, params=None):  # type: ignore[no-untyped-def]
            from kvfleet.airflow import rollout

            return rollout.run_preflight(cluster, params)

        @deferrable_task(max_active_tis_per_dagrun=16, pool=CLUSTER_POOL, map_index_template=MAP_INDEX_TEMPLATE)
        def stages(cluster, params=None, kvfleet_resume=None):  # type: ignore[no-untyped-def]
            from kvfleet.airflow import rollout

            return rollout.run_cluster_stages(cluster, params, kvfleet_resume)

        # No kvfleet pool: the teardown frees the lease and restores the operator, so it must not queue behind
        # other runs' `stages` in kvfleet_cluster_changes; it runs in Airflow's default_pool. Its weight puts it
        # ahead of the other kvfleet DAGs' tasks there (with Airflow's default "downstream" weight rule, the
        # tasks upstream of it add this weight to theirs; no other rollout run competes: max_active_runs=1).
        @task(retries=3, priority_weight=TEARDOWN_PRIORITY_WEIGHT, map_index_template=MAP_INDEX_TEMPLATE)
        def release(cluster, params=None):  # type: ignore[no-untyped-def]
            from kvfleet.airflow import rollout

            return rollout.release_cluster(cluster, params)

        first = stages(cluster)
        preflight(cluster) >> first
        # The first slot reads the stages' result: a freeze or a stop that held the cluster there is carried on.
        previous = first
        upstream: Any = first
        for slot in range(WAVE_SLOTS):
            wave = wave_slot(slot)(cluster, previous)
            upstream >> wave
            upstream = wave
            if slot < WAVE_SLOTS - 1:
                gate = WaveGateOperator(task_id=f"gate_{slot}", wave_task_id=f"cluster.wave_{slot}", slot=slot,
                                        notifiers=[callbacks.gate_waiting_notifier()])
                wave >> gate
                previous, upstream = gate.output, gate
        # A teardown WITHOUT a setup: it runs once everything upstream is done, whatever their states, so a
        # failed `stages` (which would mark a setup's teardown upstream_failed) still frees the lease and slot.
        # A failed restore must fail the run loudly: the operator would be left paused.
        upstream >> release(cluster).as_teardown(on_failure_fail_dagrun=True)
        return wave

    @task(trigger_rule="none_failed")
    def finish(clusters, last_slots, params=None):  # type: ignore[no-untyped-def]
        from kvfleet.airflow import rollout

        return rollout.finish_rollout(clusters, last_slots, params)

    names = plan()
    finish(names, per_cluster.expand(cluster=names))


kvfleet_rollout()
