"""The history upgraded to revision 0011 (clusters named by their key) while a rollout waits at its gate, holding its
cluster's lease: the run then completes, leaves no lease, and the audit chain verifies.

The history is put back to revision 0010 while the gate waits (``migrate.downgrade``: every row names its cluster
by its bare name again, the lease held is keyed ``c-patch`` and the run's slot is held by ``<run>#c-patch``), then
upgraded again: the upgrade runs on a live history with a lease held and a gate waiting, as an operator upgrading
kvfleet between two waves does. What this does not reproduce of the previous code: the run's tasks were mapped
over keys (XCom), and the audit log, append-only, keeps the keys its rows were written with.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import text
from test_rollout_sandbox import gated_rollout

from kvfleet.history import migrate

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
KEY = "default/us-east-1/c-patch"


def _leases(history: Any) -> list[tuple[str, str, str]]:
    with history.engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(text("SELECT cluster, holder, state FROM cluster_locks")))


def test_the_upgrade_while_a_gate_waits_keeps_the_lease_and_the_run_completes(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, capsys) -> None:
    from kvfleet.airflow import hitl
    from kvfleet.cli import main

    seen: dict[str, Any] = {}

    def upgrade_then_approve(done: threading.Event) -> None:
        while not done.wait(0.2):
            gates = hitl.pending()
            if not gates:
                continue
            seen["held"] = _leases(history)
            migrate.downgrade(history.engine, "0010_pinned_inventory")
            seen["at_0010"] = _leases(history)
            migrate.upgrade(history.engine)
            seen["at_head"] = _leases(history)
            for gate in gates:
                hitl.respond(gate, "Approve", "alice")
            return

    dr = gated_rollout(dagbag, small_fleet, upgrade_then_approve)
    run_key = f"kvfleet_rollout/{dr.run_id}"
    slot = (f"slot:{run_key}:0", f"{run_key}#{KEY}", "parked")
    assert seen["held"] == [(KEY, run_key, "parked"), slot]
    assert seen["at_0010"] == [("c-patch", run_key, "parked"), (slot[0], f"{run_key}#c-patch", "parked")]
    assert seen["at_head"] == seen["held"]  # keyed again, for the same holder
    assert dr.state == "success"
    assert history.runs.get(run_key)["status"] == "success"
    assert _leases(history) == []
    with history.engine.connect() as conn:
        clusters = {r[0] for r in conn.execute(text("SELECT DISTINCT cluster FROM step_events WHERE run_key = :k "
                                                    "AND cluster IS NOT NULL"), {"k": run_key})}
    assert clusters == {KEY}
    capsys.readouterr()
    assert main(["audit", "verify"]) == 0, capsys.readouterr()
