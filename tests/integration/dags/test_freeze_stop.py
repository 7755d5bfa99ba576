"""A freeze (``kvfleet freeze on``) and an emergency stop (``kvfleet stop``) given while a kvfleet_rollout run is in
flight, on the twin through dag.test(): the run waits at the canary's approval gate on c-patch (its canary wave: alpha-chat and beta-rag) (a patch-mode cluster:
its waves pause the Inference Operator), the hold is given with the CLI, then the gate is approved. The waves after
the canary do not start: their endpoints are recorded frozen or stopped, no endpoint is left at 0 replicas, the
operator is running, the lease is freed, and the run ends frozen or stopped in the history. A new run in the frozen
scope is refused before it changes anything, with the freeze's reason and who froze; lifted, the next run goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from test_rollout_sandbox import PATCH, _operator_state, _outcomes, conf

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REASON = "INC-4711: L2 latency on c-patch"
KUBECTL = Path(__file__).resolve().parents[3] / ".tools" / "bin" / "kubectl"


def kvfleet(*args: str, fleet: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvfleet.cli", *args, "--fleet", str(fleet), "--by", "oncall"],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))


def _run_holding(dagbag: Any, fleet: Path, hold: list[str]) -> tuple[Any, list[Any]]:
    """The rollout on c-patch with approval after the canary; when its gate waits, ``hold`` (the CLI's arguments,
    ``{run}`` filled with the run's key) is given, then the gate approved by alice."""
    from kvfleet.airflow import hitl

    done, seen = threading.Event(), []

    def answer() -> None:
        while not done.is_set() and not seen:
            for gate in hitl.pending():
                seen.append(kvfleet(*[a.format(run=f"{gate.dag_id}/{gate.run_id}") for a in hold], fleet=fleet))
                hitl.respond(gate, "Approve", "alice")
            time.sleep(0.2)

    responder = threading.Thread(target=answer, daemon=True)
    responder.start()
    try:
        dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(fleet, approval="after_canary", clusters=["c-patch"]))
    finally:
        done.set()
        responder.join(timeout=30)
    return dr, seen


def _ready_replicas(fleet: Path) -> dict[str, str]:
    """Each c-patch endpoint's ready replicas, read with kubectl from the twin."""
    from kvfleet.fleet.inventory import load_inventory

    inv = load_inventory(fleet)
    out = {}
    for ep in inv.endpoints_of(inv.cluster("c-patch").key):
        got = subprocess.run([str(KUBECTL), "--context", "c-patch", "-n", ep.namespace, "get", "deployment", ep.name,
                              "-o", "jsonpath={.status.readyReplicas}"], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ))
        out[ep.key] = got.stdout if got.returncode == 0 else got.stderr
    return out


def _leases(history: Any) -> list[Any]:
    with history.engine.connect() as conn:
        return list(conn.execute(text("SELECT cluster, holder, state FROM cluster_locks")).all())


@pytest.mark.parametrize("kind", ["freeze", "stop"])
def test_a_hold_given_in_flight_ends_the_run_at_the_next_safe_point(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, kind) -> None:
    hold = (["freeze", "on", "--cluster", "c-patch", "--reason", REASON] if kind == "freeze"
            else ["stop", "--run", "{run}", "--reason", REASON])
    dr, seen = _run_holding(dagbag, small_fleet, hold)
    assert [p.returncode for p in seen] == [0], [(p.stdout, p.stderr) for p in seen]
    run_key = f"kvfleet_rollout/{dr.run_id}"
    outcome = "frozen" if kind == "freeze" else "stopped"
    outcomes = _outcomes(history, run_key)
    # the canary wave (one endpoint per LOB), rolled before the hold; the wave after it never started
    assert outcomes == [(PATCH, "alpha/alpha-chat", "changed"), (PATCH, "alpha/alpha-docs", outcome),
                        (PATCH, "beta/beta-rag", "changed")], outcomes
    run = history.runs.get(run_key)
    assert run["status"] == outcome and REASON in (run["reason"] or ""), run
    assert dr.state == "success"  # held on purpose, not a failure of kvfleet's
    assert _operator_state(small_fleet, "c-patch")["paused_by"] is None
    assert _leases(history) == []
    ready = _ready_replicas(small_fleet)  # the moved ones serve (none at 0); the held one was never created
    assert ready["alpha/alpha-chat"] == ready["beta/beta-rag"] == "2" and "NotFound" in ready["alpha/alpha-docs"], \
        ready
    if kind == "stop":  # a stop holds only the runs in flight when it was given: the next one goes on
        again = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, clusters=["c-patch"]))
        assert again.state == "success"
        return
    refused = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, clusters=["c-patch"]))
    assert refused.state == "failed"
    refused_key = f"kvfleet_rollout/{refused.run_id}"
    assert history.runs.get(refused_key)["status"] == "refused"
    [step] = [s for s in history.runs.steps(refused_key) if s["step"] == "freeze"]
    assert step["outcome"] == "refused" and f"cluster {PATCH} is frozen by oncall" in step["detail"]["reason"]
    assert REASON in step["detail"]["reason"] and "kvfleet freeze off --cluster" in step["detail"]["reason"]
    assert not [s for s in history.runs.steps(refused_key) if s["endpoint"]]  # nothing was changed
    lifted = kvfleet("freeze", "off", "--cluster", "c-patch", "--reason", "INC-4711 closed", fleet=small_fleet)
    assert lifted.returncode == 0, lifted.stderr
    again = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, clusters=["c-patch"]))
    assert again.state == "success"
    assert {o for c, e, o in _outcomes(history, f"kvfleet_rollout/{again.run_id}")} >= {"changed"}
