"""Helpers for the Curvine upgrade and scale-out tests: the one-cluster fleet, a handle on its sandbox twin, waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvfleet.fleet.inventory import Inventory
from kvfleet.history.repos import HistoryRepos
from kvfleet.stages.base import StageContext
from kvfleet_sandbox.runtime import Sandbox

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


@dataclass
class CurvineOps:
    sandbox: Sandbox
    inventory: Inventory
    history: HistoryRepos
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
        # No pause between writes: the twin places files in (write time, path) order, and these paths sort in
        # write order, so equal write times change nothing (nor does the wall clock's resolution).
        for p in paths:
            self.twin.l2.write(p, 1_000_000 + len(p))
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


