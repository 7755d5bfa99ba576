"""Curvine upgrade and scale-out against the sandbox: one small cluster (two GPU nodes) with Curvine installed by
stage 3's first install (revision 1 with the format flags true, revision 2 flipped false — what a rollout leaves),
a fresh history database, and the process environment pointing kvfleet's clients at the sandbox."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kvfleet.fleet.inventory import Inventory, load_inventory
from kvfleet.history.repo import History, StepKey
from kvfleet.sandbox.runtime import Sandbox
from kvfleet.stages import curvine
from kvfleet.stages.base import StageContext, Timeouts

CLUSTER = "ml-cv"
NS = "curvine"
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
_runs = itertools.count(1)


@dataclass
class CurvineOps:
    sandbox: Sandbox
    inventory: Inventory
    history: History
    make: Callable[..., StageContext]

    @property
    def twin(self) -> Any:
        return self.sandbox.twin(CLUSTER)

    @property
    def sim(self) -> Any:
        return self.twin.services["curvine"]

    @property
    def repo(self) -> Any:
        return self.twin.services["chart_repo"]

    def ctx(self, task: str = "task", **kw: Any) -> StageContext:
        return self.make(task, **kw)

    def write_files(self, n: int, prefix: str = "/l2cache/pvc-1/vllm@qwen2") -> list[str]:
        paths = [f"{prefix}/chunk-{i:03d}.pt" for i in range(n)]
        for p in paths:
            self.twin.l2.write(p, 1_000_000 + len(p))
            time.sleep(0.002)  # distinct write times: round-robin placement follows write order
        wait(lambda: set(paths) <= set(self.sim.placement()), "files placed on workers")
        return paths

    def pod_uids(self) -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.twin.store.list("", "pods", NS)
                if p["metadata"]["name"].startswith("curvine-")}


def wait(predicate: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for: {what}")


@pytest.fixture
def ops(sandbox_factory, history, monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[CurvineOps]:  # type: ignore[no-untyped-def]
    sandbox = sandbox_factory(FLEET, controllers=("workloads", "curvine"), time_scale=0.005)
    for key, value in sandbox.exports().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KVFLEET_POLL_SECONDS", "0.05")
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    inv = load_inventory(fleet)
    made: list[StageContext] = []
    run_key = f"test/{next(_runs)}"
    history.start_run(run_key, dag_id="test", run_id=run_key, trigger="test", triggered_by=None, params={})

    def make(task: str = "task", **kw: Any) -> StageContext:
        ctx = StageContext(inventory=inv, cluster=inv.cluster(CLUSTER), aws_conn_id=None, history=history,
                           step_key=StepKey(run_key, task), actor="pytest",
                           timeouts=Timeouts(cluster_update_s=30, addon_s=30, pods_s=30, pvc_s=15), **kw)
        made.append(ctx)
        return ctx

    ctx = make("install")
    curvine.first_install(ctx)  # what stage 3 does: revision 1 (flags true), revision 2 (flipped false)
    curvine.wait_rolled_out(ctx, 15)
    try:
        yield CurvineOps(sandbox, inv, history, make)
    finally:
        for c in made:
            c.close()
