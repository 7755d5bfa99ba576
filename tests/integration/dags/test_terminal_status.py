"""Terminal status: the history's status of a DAG run matches Airflow's when the run fails, through
dag.test() against the twin in its own process, failures injected through the twin's admin fault API.

Two DAG runs back these assertions:
- one kvfleet_rollout on the small fleet's two clusters, where c-kyverno's stages fail (every mutating Kubernetes
  request there answers 409) and c-patch's canary wave fails AFTER applying its InferenceEndpointConfigs (the
  Deployments of c-patch answer 409 from the moment its stages are done, so the operator pause fails): Airflow
  says failed, the history says failed, and the CRs the failed wave applied are in `kvfleet audit endpoint`;
- one kvfleet_curvine_upgrade whose override would set a format flag: refused by its safety gate before any
  cluster is touched; Airflow says failed, the history says refused with the gate's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
ALL_MUTATIONS_409 = {"kind": "api_conflict", "count": 10_000, "target": "kube"}
# The history names a cluster by its key account/region/name (the small fleet declares no account).
PATCH = "default/us-east-1/c-patch"
KYVERNO = "default/us-west-2/c-kyverno"


def rollout_conf(fleet: Path, **overrides: Any) -> dict[str, Any]:
    """Every Param explicitly: dag.test() keeps the Params of an earlier run in the same process."""
    base = {"fleet": str(fleet), "lobs": [], "clusters": [], "endpoints": [], "dry_run": False, "wave_size": 1,
            "max_parallel_clusters": 4, "canary": True, "bake_minutes": 0, "gate": "none", "approval": "none",
            "remediate_drift": False, "prompt_tokens": 2000, "lock_wait_minutes": 10}
    return {**base, **overrides}


def audit_json(*args: str) -> Any:
    """`kvfleet audit ... --json` as a user runs it (KVFLEET_HISTORY_URL: the test's history), parsed: stdout
    must be JSON alone."""
    proc = subprocess.run([sys.executable, "-m", "kvfleet.cli", "audit", *args, "--json"], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _fail_deployments_once_stages_are_done(history: Any, sandbox: Any, cluster: str, key: str,
                                           done: threading.Event) -> None:
    """Inject 409s on the Deployments of ``cluster`` (the twin's name for it) as soon as its stages recorded their
    Curvine step (under its ``key``, as the history names it): the stages
    (whose CSI controller is a Deployment) succeed, the wave that follows applies its CRs, then fails to pause
    the operator."""
    while not done.wait(0.05):
        with history.engine.connect() as conn:
            ready = conn.execute(text("SELECT 1 FROM step_events WHERE cluster = :c AND step = 'curvine'"),
                                 {"c": key}).first()
        if ready:
            sandbox.admin("/fault", {**ALL_MUTATIONS_409, "cluster": cluster, "resource": "deployments"})
            return


def test_failed_stages_and_a_wave_failed_after_its_crs_end_failed_and_the_crs_are_audited(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet) -> None:
    sandbox_process.admin("/fault", {**ALL_MUTATIONS_409, "cluster": "c-kyverno"})
    done = threading.Event()
    injector = threading.Thread(target=_fail_deployments_once_stages_are_done,
                                args=(history, sandbox_process, "c-patch", PATCH, done), daemon=True)
    injector.start()
    try:
        dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=rollout_conf(small_fleet))
    finally:
        done.set()
        injector.join(timeout=5)
        sandbox_process.admin("/fault", {"cluster": "*", "kind": "clear"})
    assert dr.state == "failed"
    run_key = f"kvfleet_rollout/{dr.run_id}"
    run = history.runs.get(run_key)
    assert run is not None and run["status"] == "failed", run  # never running, never success
    assert run["ended_at"] is not None

    steps = history.runs.steps(run_key)
    errors = {(s["task_id"], s["cluster"]): s for s in steps if s["step"].startswith("error:")}
    # c-kyverno failed in its stages, c-patch in its canary wave: each error step names its cluster and message
    assert set(errors) == {("cluster.stages", KYVERNO), ("cluster.wave_0", PATCH)}, errors
    assert "injected conflict" in errors[("cluster.stages", KYVERNO)]["detail"]["error"], errors
    assert "pause the inference operator" in errors[("cluster.wave_0", PATCH)]["detail"]["error"], errors
    # The failed wave applied both canary CRs before failing: written ahead, with their outcome ...
    changes = history.queries.rows("write_ahead", cutoff=EPOCH, run_key=run_key, cluster="c-patch", endpoint=None,
                            limit=1000)
    created = {r["endpoint"] for r in changes if r["action"] == "create_iec" and r["outcome"] == "changed"}
    assert created == {"alpha/alpha-chat", "beta/beta-rag"}, changes
    assert any(r["action"] == "pause_operator" and r["outcome"] == "failed" for r in changes), changes
    # ... and `kvfleet audit endpoint` shows them in the failed run
    rows = audit_json("endpoint", "--endpoint",
                      "alpha/alpha-chat")
    iec = [r for r in rows if r["run_key"] == run_key and r["stage"] == "write-ahead" and "create_iec" in r["step"]]
    assert iec and iec[0]["outcome"] == "changed" and iec[0]["run_status"] == "failed", rows
    # c-kyverno never got a CR: its stages failed first
    assert not history.queries.rows("write_ahead", cutoff=EPOCH, run_key=run_key, cluster="c-kyverno",
                             endpoint="alpha/alpha-chat", limit=100)


def test_a_curvine_upgrade_refused_by_its_format_flag_gate_ends_refused(dagbag, history, small_fleet) -> None:  # type: ignore[no-untyped-def]
    """Refused in `scope`, before any cluster is touched: no sandbox needed, and none is reached."""
    dr = dagbag.get_dag("kvfleet_curvine_upgrade").test(run_conf={
        "fleet": str(small_fleet), "clusters": [], "version": "0.3.3-alpha",
        "overrides": {"cluster": {"formatMaster": True}}, "dry_run": False, "approval": "never", "rollback": True,
        "timeout_minutes": 1, "expired_files_allowance": 0, "l2_check": "file", "lock_wait_minutes": 0})
    assert dr.state == "failed"
    run = history.runs.get(f"kvfleet_curvine_upgrade/{dr.run_id}")
    assert run is not None and run["status"] == "refused", run
    assert "format" in (run["reason"] or "").lower(), run
    assert history.queries.rows("write_ahead", cutoff=EPOCH, run_key=run["run_key"], cluster=None, endpoint=None,
                         limit=100) == []
    (listed,) = [r for r in audit_json("runs")
                 if r["run_key"] == run["run_key"]]
    assert listed["status"] == "refused"
