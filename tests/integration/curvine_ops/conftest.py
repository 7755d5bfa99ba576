"""Curvine upgrade and scale-out against the sandbox: one small cluster (two GPU nodes) with Curvine installed by
stage 3's first install (revision 1 with the format flags true, revision 2 flipped false — what a rollout leaves),
a fresh history database, and the process environment pointing kvfleet's clients at the sandbox."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from opskit import CLUSTER, FLEET, CurvineOps

from kvfleet.fleet.inventory import load_inventory
from kvfleet.history.keys import StepKey
from kvfleet.stages import curvine
from kvfleet.stages.base import StageContext, Timeouts

_runs = itertools.count(1)


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
    history.runs.start(run_key, dag_id="test", run_id=run_key, trigger="test", triggered_by=None, params={})

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
