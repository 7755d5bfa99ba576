"""kvfleet_curvine_upgrade and kvfleet_curvine_scale_out through dag.test() against the sandbox: one small cluster
with Curvine installed by stage 3's first install; the history store records the run, the steps, the revisions
with their flags and the capacity snapshots."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvfleet.airflow.params import CURVINE_APPROVE_TASK, CURVINE_NO_APPROVAL_TASK
from kvfleet.fleet.inventory import load_inventory
from kvfleet.stages import curvine
from kvfleet.stages.base import StageContext
from kvfleet_sandbox.runtime import Sandbox, start_sandbox
from kvfleet_sandbox.twin import SandboxSettings

pytestmark = pytest.mark.e2e

CLUSTER = "ml-cv-dag"
GIB = 1024**3
FLEET = f"""
clusters:
  - name: {CLUSTER}
    region: us-east-1
    production: true
    gpu_nodes: {{count: 2, instance_type: ml.g5.4xlarge}}
    curvine:
      worker: {{replicas: 2, size: 100Gi}}
      scale_out: auto
"""


@pytest.fixture
def installed(tmp_path: Path, history, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Sandbox, Path]]:  # type: ignore[no-untyped-def]
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    sandbox = start_sandbox(fleet, tmp_path / "sandbox", SandboxSettings(time_scale=0.005),
                            controllers=("workloads", "curvine"))
    try:
        for key, value in sandbox.exports().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("KVFLEET_POLL_SECONDS", "0.05")
        monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
        inv = load_inventory(fleet)
        ctx = StageContext(inventory=inv, cluster=inv.cluster(CLUSTER), aws_conn_id=None)
        try:
            curvine.first_install(ctx)
            curvine.wait_rolled_out(ctx, 15)
        finally:
            ctx.close()
        yield sandbox, fleet
    finally:
        sandbox.stop()


def _conf(fleet: Path, **params: Any) -> dict[str, Any]:
    # dag.test() in one process keeps an earlier run's conf in the DAG's params: pass every Param that matters
    base = {"fleet": str(fleet), "clusters": [CLUSTER], "dry_run": False, "overrides": {}, "approval": "never",
            "target_workers": None, "all_eligible": False}
    return {**base, **params}


def test_upgrade_dag_upgrades_keeps_l2_and_records_revisions(dagbag, history, installed) -> None:  # type: ignore[no-untyped-def]
    sandbox, fleet = installed
    twin = sandbox.twin(CLUSTER)
    twin.l2.write("/l2cache/pvc-1/vllm@qwen2/chunk-000.pt", 1_000_000)
    dag = dagbag.get_dag("kvfleet_curvine_upgrade")

    dry = dag.test(run_conf=_conf(fleet, version="0.3.3-alpha", dry_run=True, approval="auto"))
    assert dry.state == "success"
    assert not [r for r in history.queries.rows("curvine_history", cluster=CLUSTER) if r["revision"] > 2]

    dr = dag.test(run_conf=_conf(fleet, version="0.3.3-alpha", timeout_minutes=1))
    assert dr.state == "success"
    run = history.runs.get(f"kvfleet_curvine_upgrade/{dr.run_id}")
    assert run["status"] == "success" and run["summary"]["outcomes"] == {"changed": 1}
    steps = {(s["task_id"], s["step"]): s["outcome"] for s in history.runs.steps(run["run_key"])}
    assert steps[("upgrade", "gates")] == "passed" and steps[("upgrade", "upgrade")] == "changed"
    assert steps[("preflight", "upgrade")] == "planned"
    rels = history.queries.rows("curvine_history", cluster=CLUSTER)
    assert [(r["revision"], r["chart_version"], r["format_master"]) for r in rels] == [
        (1, "0.3.2-alpha", True), (2, "0.3.2-alpha", False), (3, "0.3.3-alpha", False)]
    assert twin.l2.exists("/l2cache/pvc-1/vllm@qwen2/chunk-000.pt")



def test_scale_out_dag_detects_new_nodes_and_scales_to_four_workers(dagbag, history, installed) -> None:  # type: ignore[no-untyped-def]
    sandbox, fleet = installed
    twin = sandbox.twin(CLUSTER)
    twin.services["workloads"].add_nodes(2)
    dag = dagbag.get_dag("kvfleet_curvine_scale_out")
    dr = dag.test(run_conf=_conf(fleet, timeout_minutes=1))  # scheduled-path defaults: detection
    assert dr.state == "success"
    overview = twin.services["curvine"].overview()
    assert overview["live_workers"] == 4 and overview["capacity"] == 400 * GIB
    run_key = f"kvfleet_curvine_scale_out/{dr.run_id}"
    scale = next(s for s in history.runs.steps(run_key) if s["step"] == "scale")
    assert scale["outcome"] == "changed" and scale["detail"]["decision"]["mode"] == "detect"
    caps = [c for c in history.queries.rows("capacity_history", cluster=CLUSTER) if c["run_key"] == run_key]
    assert [(c["phase"], c["live_workers"]) for c in caps] == [("before", 2), ("after", 4)]

    again = dag.test(run_conf=_conf(fleet, all_eligible=True))
    assert again.state == "success"
    assert history.runs.get(f"kvfleet_curvine_scale_out/{again.run_id}")["summary"]["outcomes"] == {"unchanged": 1}


def test_approval_is_on_by_default_for_production_clusters(tmp_path: Path, history: Any) -> None:
    """The route reads which clusters are production from the run's pinned inventory (an edit after the run
    started changes nothing)."""
    from types import SimpleNamespace

    from airflow.sdk.execution_time.context import set_current_context

    from kvfleet.fleet.pinning import pin

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET + FLEET.replace(CLUSTER, "ml-cv-dev").replace("production: true", "production: false")
                     .replace("clusters:\n", ""))
    history.runs.start("kvfleet_curvine_upgrade/manual__1", dag_id="kvfleet_curvine_upgrade", run_id="manual__1",
                       trigger="manual", triggered_by="ann", params={}, inventory=pin(fleet))
    fleet.write_text(fleet.read_text().replace("production: true", "production: false"))
    dag_run = SimpleNamespace(dag_id="kvfleet_curvine_upgrade", run_id="manual__1", run_type="manual",
                              triggering_user_name="ann")
    task = SimpleNamespace(task_id="approval_route", map_index=-1)
    with set_current_context({"dag_run": dag_run, "ti": task}):  # type: ignore[typeddict-item]
        _routes(fleet)


def _routes(fleet: Path) -> None:
    from kvfleet.airflow import curvine as glue

    # The route is given what the scope task returned: the clusters' keys (the Param still names them freely).
    prod, dev = f"default/us-east-1/{CLUSTER}", "default/us-east-1/ml-cv-dev"
    conf = {"fleet": str(fleet), "approval": "auto"}
    assert glue.approval_route([prod], {**conf, "clusters": [CLUSTER]}) == CURVINE_APPROVE_TASK
    assert glue.approval_route([dev], {**conf, "clusters": ["ml-cv-dev"]}) == CURVINE_NO_APPROVAL_TASK
    assert glue.approval_route([dev], {**conf, "approval": "always"}) == CURVINE_APPROVE_TASK
    assert glue.approval_route([prod], {**conf, "approval": "never"}) == CURVINE_NO_APPROVAL_TASK
    assert glue.approval_route([prod], {**conf, "dry_run": True}) == CURVINE_NO_APPROVAL_TASK
