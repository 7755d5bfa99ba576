"""The waits after a change kvfleet itself just made give the worker slot back.

A rollout of a fresh ``c-patch`` (tiered storage off, no add-on): stage 1 sends ``UpdateCluster`` and stage 2
creates the five add-ons. Each of those changes is followed by a wait (InService, ACTIVE) that ``cluster.stages``
now defers on ``ClusterReadyTrigger`` (``stages.base.Pending``, ``act``/``finish``) instead of polling in the
worker. What must hold: one deferral per change, each change sent exactly once (the resumed task goes on from the
stage's ``progress``, it does not redo the change), and the stages' outcomes recorded once each, as ``changed``,
with what ``finish`` verified.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_deferral import ti_states  # noqa: F401  (the fixture: the task instances' states from the database)
from test_rollout_sandbox import conf

from conftest import mutating_requests
from kvfleet.fleet import constants as C

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
KUBECTL = Path(__file__).resolve().parents[3] / ".tools" / "bin" / "kubectl"
SCALE = ("--context", "c-patch", "-n", C.OPERATOR_NAMESPACE, "scale", "deployment", C.OPERATOR_DEPLOYMENT)


def _kubectl(*args: str) -> str:
    return subprocess.run([str(KUBECTL), *args], check=True, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ)).stdout


def _map_labels(run_id: str) -> dict[str, set[str]]:
    """The rendered map index of the run's preflight, stages and release task instances (Airflow's metadata DB)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT task_id, rendered_map_index FROM task_instance WHERE dag_id = 'kvfleet_rollout' AND run_id = :r "
                "AND task_id IN ('cluster.preflight', 'cluster.stages', 'cluster.release')"), {"r": run_id}).all()
    finally:
        engine.dispose()
    out: dict[str, set[str]] = {}
    for task_id, label in rows:
        out.setdefault(task_id, set()).add(label)
    return out


def _operator_down() -> None:
    _kubectl(*SCALE, "--replicas=0")
    deadline = time.monotonic() + 60  # the Deployment controller's next pass (readyReplicas is omitted at 0)
    while True:
        ready = _kubectl("--context", "c-patch", "-n", C.OPERATOR_NAMESPACE, "get", "deployment",
                         C.OPERATOR_DEPLOYMENT, "-o", "jsonpath={.status.readyReplicas}").strip()
        if ready in ("", "0"):
            return
        assert time.monotonic() < deadline, f"the operator was not scaled to 0 ready within 60 s: {ready!r}"
        time.sleep(0.1)


def test_update_cluster_and_each_addon_wait_deferred_and_each_change_is_sent_once(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, ti_states) -> None:  # noqa: F811
    dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, clusters=["c-patch"], gate="none"))
    assert dr.state == "success", ti_states.rows()
    rows = ti_states.rows("cluster.stages")
    ready = [r for r in rows if r["state"] == "deferred"
             and str(r.get("classpath") or "").endswith("ClusterReadyTrigger")]
    run_key = f"kvfleet_rollout/{dr.run_id}"
    # A fresh cluster: one UpdateCluster and one CreateAddon per add-on reached AWS, each exactly once across the
    # deferrals (the twin's request log; a redone change after a resume would show twice).
    aws = [op.split(":", 1)[-1] for op in mutating_requests(sandbox_process)["aws"]]
    assert aws.count("UpdateCluster") == 1, aws
    assert aws.count("CreateAddon") == len(C.ADDON_ORDER), aws
    intents = [r for r in history.queries.rows("write_ahead", cutoff="1970-01-01", run_key=run_key, cluster=None,
                                        endpoint=None, limit=1000)
               if r["action"].startswith(("update_cluster", "create_addon"))]
    assert len(intents) == 1 + len(C.ADDON_ORDER), intents
    assert not [r for r in intents if r["outcome"].startswith("unknown")], intents  # every intent has its outcome
    # ... and each of them was waited for in the triggerer, not in a worker slot.
    assert len(ready) == 1 + len(C.ADDON_ORDER), [(r["state"], r.get("classpath")) for r in rows]  # one per change
    assert all(r["next_method"] == "resume" for r in ready)
    assert rows[-1]["state"] == "success", rows
    steps: dict[str, list[dict[str, Any]]] = {}
    for s in history.runs.steps(run_key):
        steps.setdefault(s["step"], []).append(s)
    tiered, addons = steps["tiered_storage"], steps["addons"]
    assert len(tiered) == 1 and tiered[0]["outcome"] == "changed", tiered
    assert "ai-toolkit ready" in str(tiered[0]["detail"].get("verified")), tiered  # finish verified the daemon
    assert len(addons) == 1 and addons[0]["outcome"] == "changed", addons
    assert addons[0]["detail"]["addons"] == {name: "changed" for name in C.ADDON_ORDER}, addons
    assert "ready" in str(addons[0]["detail"].get("operator")), addons  # finish verified the operator
    # Stage 3 too: installed and flipped once, its waits (rollout, PVCs, the master's capacity) met before finish
    # recorded it, once; any of them not met at its first look was deferred (KubeReadyTrigger) and resumed.
    from kvfleet.fleet.inventory import load_inventory

    curvine = steps["curvine"]
    assert len(curvine) == 1 and curvine[0]["outcome"] == "changed", curvine
    detail = curvine[0]["detail"]
    assert [(r["revision"], r["status"], any(r["flags"].values())) for r in detail["revisions"]] == \
        [(1, "superseded", True), (2, "deployed", False)], detail["revisions"]  # one install, one flip
    workers = load_inventory(small_fleet).cluster("c-patch").curvine_workers
    assert detail["capacity"]["live_workers"] == workers and detail.get("rollout"), detail
    # Airflow names each per-cluster mapped task by the cluster's key, not by its index (map_index_template)
    assert _map_labels(dr.run_id) == {"cluster.preflight": {"default/us-east-1/c-patch"},
                                      "cluster.stages": {"default/us-east-1/c-patch"},
                                      "cluster.release": {"default/us-east-1/c-patch"}}, _map_labels(dr.run_id)

    # A rerun while the operator's controller is not Ready (scaled to 0 by hand): stage 2 changes nothing, looks
    # once, and waits for the controller in the triggerer; it comes back (scaled up while the task is deferred).
    _operator_down()
    seen: dict[str, Any] = {}
    stop = threading.Event()

    def scale_up_once_deferred_on_the_operator() -> None:
        while not stop.wait(0.1):
            waiting = [r for r in ti_states.rows("cluster.stages") if r["run_id"] != dr.run_id
                       and r["state"] == "deferred" and str(r.get("classpath") or "").endswith("KubeReadyTrigger")]
            if waiting:
                seen["deferred"] = waiting[0]
                _kubectl(*SCALE, "--replicas=1")
                return

    watcher = threading.Thread(target=scale_up_once_deferred_on_the_operator, daemon=True)
    watcher.start()
    try:
        again = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, clusters=["c-patch"], gate="none"))
    finally:
        stop.set()
        watcher.join(timeout=10)
        _kubectl(*SCALE, "--replicas=1")
    assert again.state == "success", ti_states.rows()
    assert seen, f"never deferred on the operator: {ti_states.rows('cluster.stages')}"
    assert seen["deferred"]["next_method"] == "resume"
    rerun = [s for s in history.runs.steps(f"kvfleet_rollout/{again.run_id}") if s["step"] == "addons"]
    assert len(rerun) == 1 and rerun[0]["outcome"] == "unchanged", rerun
    assert "ready 1" in str(rerun[0]["detail"].get("operator")), rerun  # what the resumed stage saw
