"""kvfleet_curvine_upgrade's stage against the sandbox: format-flag gates before any change, snapshots, post-checks
and a rollback that never goes back to a revision with a format flag true."""

from __future__ import annotations

import pytest
from conftest import CLUSTER, NS, wait

from kvfleet.errors import GateRefused, PermanentError
from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_values as cv
from kvfleet.sandbox.chart_repo import CRASHLOOP_WORKER
from kvfleet.stages import curvine_upgrade as up
from kvfleet.stages.curvine_upgrade import UpgradeRequest

pytestmark = pytest.mark.integration


def _revisions(ctx):  # type: ignore[no-untyped-def]
    return [int(r["revision"]) for r in ctx.helm.history(C.CURVINE_RELEASE, NS)]


def _steps(ops, step: str):  # type: ignore[no-untyped-def]
    return [s for s in ops.history.steps(ops.make().step_key.run_key) if s["step"] == step]


def test_upgrade_to_a_newer_chart_keeps_l2_files_and_metadata_counts(ops) -> None:  # type: ignore[no-untyped-def]
    paths = ops.write_files(6)
    before = ops.sim.overview()
    formats = len(ops.sim.formats)
    ctx = ops.ctx("upgrade")
    out = up.upgrade(ctx, UpgradeRequest(version="0.3.3-alpha", timeout_s=20), holder="run-a")
    assert out.outcome == "changed"
    assert out.detail["from_revision"] == 2 and out.detail["to_revision"] == 3
    values = ctx.helm.values(C.CURVINE_RELEASE, NS)
    assert cv.flags_of(values) == {"formatMaster": False, "formatWorker": False, "formatJournal": False}
    assert all(ops.twin.l2.exists(p) for p in paths)
    after = ops.sim.overview()
    assert after["files_total"] == before["files_total"] == 6 and after["dir_total"] == before["dir_total"]
    assert after["live_workers"] == 2 and ops.sim.formats[formats:] == []  # no format, no data loss
    pods = ops.twin.store.list("", "pods", NS)
    assert {p["spec"]["containers"][0]["image"].rsplit(":", 1)[1] for p in pods
            if p["metadata"]["name"].startswith(("curvine-master", "curvine-worker"))} == {"v0.3.3-alpha"}
    checks = out.detail["post_checks"]
    assert checks["files_after"] >= checks["files_before"] and checks["l2"]["missing"] == [] and checks["l2"]["files"] == 3
    # snapshots before/after and every revision with its flags are in the history store
    caps = ops.history.query("capacity_history", cluster=CLUSTER)
    assert [(c["step"], c["phase"]) for c in caps if c["step"] == up.STAGE] == [(up.STAGE, "before"), (up.STAGE, "after")]
    rels = ops.history.query("curvine_history", cluster=CLUSTER)
    assert [(r["revision"], r["chart_version"], r["format_master"]) for r in rels] == [
        (1, "0.3.2-alpha", True), (2, "0.3.2-alpha", False), (3, "0.3.3-alpha", False)]
    assert ops.history.lock_of(CLUSTER) is None  # the lease was released

    # a second run is a no-op
    again = up.upgrade(ops.ctx("upgrade-again"), UpgradeRequest(version="0.3.3-alpha", timeout_s=20), holder="run-b")
    assert again.outcome == "unchanged" and _revisions(ctx) == [1, 2, 3]
