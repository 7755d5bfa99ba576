"""Deferrable waits: a rollout that must wait gives its worker slot back.

A gated, baked rollout of ``c-patch`` while another run holds the cluster's lease: ``cluster.stages`` defers on
``LeaseFreeTrigger`` (it is not running while the other run holds the cluster), takes the lease once it is freed
and goes on; each wave's bake defers on the standard provider's ``DateTimeTrigger`` and the wave is verified after
it. The task instances' state changes are read from a PostgreSQL trigger on Airflow's ``task_instance`` table
(``TiStateLog``, tests/support/ti_state_log.py): what the metadata database saw, in order, with the database's clock.

``dag.test()`` runs a deferred task's trigger in line: after the task instance went ``deferred`` it shows
``queued`` while the trigger runs, then ``scheduled`` and ``running`` again when it resumes. In a deployment the
triggerer runs the trigger and the task stays ``deferred``; in both, no worker runs the task meanwhile.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_rollout_sandbox import PATCH, conf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from ti_state_log import TiStateLog  # tests/support: shared with bench/fleet_scale.py

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OTHER = "kvfleet_curvine_upgrade/other-run"  # holds c-patch's lease, by the cluster's key as every run does


@pytest.fixture
def ti_states(airflow_db: Any) -> Iterator[TiStateLog]:
    import os

    with TiStateLog(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], "kvfleet_rollout") as log:
        yield log


def _classpath(row: dict[str, Any]) -> str:
    return str(row.get("classpath") or "")


def test_a_contended_lease_and_the_bakes_wait_deferred_and_the_rollout_completes(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, ti_states) -> None:
    from kvfleet.history.leases import Leases

    leases = Leases(history.engine)
    assert leases.try_take(PATCH, OTHER, "curvine upgrade", 3600)["holder"] == OTHER
    seen: dict[str, Any] = {}
    stop = threading.Event()

    def free_the_lease_once_the_rollout_waits_deferred() -> None:
        while not stop.wait(0.1):
            deferred = [r for r in ti_states.rows("cluster.stages") if r["state"] == "deferred"]
            if deferred:
                seen["deferred"] = deferred[0]
                seen["holder_then"] = (leases.get(PATCH) or {}).get("holder")
                seen["states_then"] = ti_states.states("cluster.stages")
                leases.release(PATCH, OTHER)
                return

    watcher = threading.Thread(target=free_the_lease_once_the_rollout_waits_deferred, daemon=True)
    watcher.start()
    try:
        dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, clusters=["c-patch"], gate="verify",
                                                                  bake_minutes=0.02, lock_wait_minutes=30))
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert dr.state == "success", ti_states.rows()
    # While the other run held c-patch, the stages task was deferred on the lease trigger, not running.
    assert seen, f"cluster.stages never deferred: {ti_states.states('cluster.stages')}"
    assert seen["holder_then"] == OTHER
    assert _classpath(seen["deferred"]) == "kvfleet.airflow.triggers.lease.LeaseFreeTrigger"
    assert seen["deferred"]["next_method"] == "resume"
    assert seen["states_then"][-1] in ("deferred", "queued"), seen["states_then"]  # queued: dag.test's inline run
    stages = ti_states.states("cluster.stages")
    assert stages.index("deferred") < len(stages) - 1 and stages[-1] == "success", stages
    # Then it took the lease and reconciled: stages 1-3 recorded, after the deferral.
    run_key = f"kvfleet_rollout/{dr.run_id}"
    steps = {s["step"] for s in history.runs.steps(run_key)}
    assert {"preflight", "tiered_storage", "addons"} <= steps, steps
    # Each wave baked deferred on DateTimeTrigger and was verified afterwards.
    for wave in ("cluster.wave_0", "cluster.wave_1"):
        rows = ti_states.rows(wave)
        bakes = [r for r in rows if r["state"] == "deferred"]
        assert bakes and all(_classpath(r).endswith("temporal.DateTimeTrigger") for r in bakes), rows
        assert rows[-1]["state"] == "success", rows
    gates = sorted(s for s in steps if s.startswith("gate:"))
    assert len(gates) == 2, steps  # both waves verified and gated after their bakes
    assert leases.get(PATCH) is None  # the teardown released it


def test_a_lease_wait_out_of_patience_fails_permanently_naming_the_holder(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, ti_states) -> None:
    from kvfleet.history.leases import Leases

    leases = Leases(history.engine)
    leases.try_take(PATCH, OTHER, "curvine upgrade", 3600)
    dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, clusters=["c-patch"],
                                                              lock_wait_minutes=0.02))
    assert dr.state == "failed"
    rows = ti_states.rows("cluster.stages")
    assert any(r["state"] == "deferred" and _classpath(r).endswith("LeaseFreeTrigger") for r in rows), rows
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    assert tis["cluster.stages"].state == "failed" and tis["cluster.stages"].try_number == 1  # permanent: no retry
    run_key = f"kvfleet_rollout/{dr.run_id}"
    errors = [s for s in history.runs.steps(run_key) if s["step"] == "error:cluster.stages"]
    assert errors and OTHER in str(errors[0]["detail"]), errors
    assert (leases.get(PATCH) or {}).get("holder") == OTHER  # nothing taken from the other run
