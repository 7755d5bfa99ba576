"""kvfleet_curvine_scale_out's stage against the sandbox: new GPU nodes get NVMe workers, the capacity arrives and is
recorded, a second run changes nothing, scale-in needs an explicit Param, detection decides and records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from opskit import CLUSTER, GIB, NS

from kvfleet.errors import GateRefused
from kvfleet.fleet import actions as A
from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_values as cv
from kvfleet.stages import curvine_scale as sc
from kvfleet.stages import executor
from kvfleet.stages.curvine_scale import ScaleRequest

pytestmark = pytest.mark.integration


def _mutations(ops):  # type: ignore[no-untyped-def]
    return [(r.verb, r.resource, r.name) for r in ops.twin.store.request_log
            if r.verb in ("create", "update", "patch", "delete", "deletecollection") and not r.dry_run]


def test_scale_out_after_two_gpu_nodes_join_doubles_capacity_and_a_second_run_is_a_no_op(ops) -> None:  # type: ignore[no-untyped-def]
    paths = ops.write_files(4)
    uids = ops.pod_uids()
    assert ops.sim.overview()["capacity"] == 200 * GIB
    added = ops.twin.services["workloads"].add_nodes(2)

    said: list[str] = []
    dry = ops.ctx("dry", dry_run=True, progress=said.append)
    planned = sc.scale(dry, ScaleRequest(all_eligible=True), holder="run-a")
    assert planned.outcome == "planned" and ops.sim.overview()["live_workers"] == 2
    [upgrade] = executor.journal(dry)  # one typed action: the helm upgrade, values as a file named by its digest
    assert isinstance(upgrade, A.HelmUpgrade) and upgrade.reuse_values
    assert upgrade.values_map() == {"worker.replicas": 4, **cv.placement_values(), **cv.safe_flags(), **cv.NO_CHART_RBAC}
    assert dry.planned[0].action == upgrade.equivalent()
    assert f" --reuse-values -f values-{upgrade.values_digest}.yaml   # " in upgrade.equivalent()
    assert "worker.replicas=4" in upgrade.equivalent() and "--set" not in upgrade.equivalent()
    assert planned.detail["decision"]["rendered"]["format_findings"] == []  # rendered and checked, even dry
    assert dry.planned[0].diff == "~ worker.replicas: 2 -> 4"

    ctx = ops.ctx("scale")
    out = sc.scale(ctx, ScaleRequest(all_eligible=True, timeout_s=20), holder="run-a")
    assert out.outcome == "changed", out.detail
    assert executor.journal(ctx) == [upgrade]  # the real run applied exactly what the dry run listed
    audit = ops.history.queries.rows("write_ahead", cutoff=datetime.now(UTC) - timedelta(days=1),
                              run_key=ctx.step_key.run_key, cluster=None, endpoint=None, limit=10)
    assert [(r["action"], r["outcome"]) for r in audit if "worker.replicas" in r["target"]] == [
        ("helm_upgrade", "changed")]  # its write-ahead record (the fixture's install shares the run)
    assert upgrade.target() == f"release {NS}/{C.CURVINE_RELEASE} worker.replicas 2 -> 4"
    assert (out.detail["from_workers"], out.detail["to_workers"]) == (2, 4)
    ov = ops.sim.overview()
    assert ov["live_workers"] == 4 and ov["capacity"] == 400 * GIB
    assert out.detail["growth"] == out.detail["expected_growth"] == 200 * GIB
    values = ctx.helm.values(C.CURVINE_RELEASE, NS)
    assert values["worker"]["replicas"] == 4 and not cv.flags_set(values)
    nodes = {p["spec"]["nodeName"] for p in ops.twin.store.list("", "pods", NS)
             if p["metadata"]["name"].startswith("curvine-worker")}
    assert set(added) <= nodes and len(nodes) == 4
    # the existing pods were not restarted, and L2 kept every file
    servers = ("curvine-master", "curvine-worker")
    assert all(ops.pod_uids()[n] == uid for n, uid in uids.items() if n.startswith(servers))
    assert all(ops.twin.l2.exists(p) for p in paths)
    caps = [c for c in ops.history.queries.rows("capacity_history", cluster=CLUSTER) if c["step"] == sc.STAGE]
    assert [(c["phase"], c["live_workers"], c["capacity_bytes"]) for c in caps] == [
        ("before", 2, 200 * GIB), ("after", 4, 400 * GIB)]
    steps = [s for s in ops.history.runs.steps(ctx.step_key.run_key) if s["stage"] == sc.STAGE]
    assert ("scale", "changed") in [(s["step"], s["outcome"]) for s in steps]
    assert ops.history.leases.get(ctx.cluster.key) is None

    ops.twin.store.reset_request_log()
    again = sc.scale(ops.ctx("again"), ScaleRequest(all_eligible=True), holder="run-b")
    assert again.outcome == "unchanged" and _mutations(ops) == []
    detect = sc.scale(ops.ctx("detect"), ScaleRequest(), holder="run-c")
    assert detect.outcome == "unchanged" and detect.detail["decision"]["due"] is False


def test_audit_curvine_prints_revisions_with_flags_and_capacity_snapshots(ops, capsys) -> None:  # type: ignore[no-untyped-def]
    from kvfleet.cli import main
    from kvfleet.stages import curvine

    ctx = ops.ctx("audit")
    curvine._record_revisions(ctx, C.CURVINE_RELEASE)
    curvine.capacity_snapshot(ctx, "curvine", "verify")
    capsys.readouterr()
    assert main(["audit", "curvine", "--cluster", CLUSTER]) == 0
    out = capsys.readouterr().out
    releases, capacity = out.split("Capacity snapshots on")
    lines = [ln.split() for ln in releases.splitlines()[2:] if ln.strip()]
    assert [ln[:7] for ln in lines] == [["curvine", "1", "0.3.2-alpha", "superseded", "True", "True", "True"],
                                       ["curvine", "2", "0.3.2-alpha", "deployed", "False", "False", "False"]]
    assert "capacity_gib" in capacity and " 200 " in capacity and "verify" in capacity


def test_scale_in_without_the_param_is_refused_and_says_what_would_be_dropped(ops) -> None:  # type: ignore[no-untyped-def]
    ops.write_files(4)
    ctx = ops.ctx("scale")
    ops.twin.store.reset_request_log()
    with pytest.raises(GateRefused) as err:
        sc.scale(ctx, ScaleRequest(target=1), holder="run-a")
    text = str(err.value)
    assert "scale-in 2 -> 1 workers" in text and "curvine-worker-1" in text and "GiB of cached KV blocks" in text
    assert "recomputable" in text and "allow_scale_in" in text
    assert _mutations(ops) == [] and ctx.helm.values(C.CURVINE_RELEASE, NS)["worker"]["replicas"] == 2
    with pytest.raises(GateRefused, match="only 2 node"):
        sc.scale(ctx, ScaleRequest(target=3), holder="run-a")


def test_detection_reports_when_the_inventory_does_not_allow_scale_out(ops) -> None:  # type: ignore[no-untyped-def]
    ops.twin.services["workloads"].add_nodes(1)
    cluster = ops.inventory.cluster(CLUSTER)
    report_only = cluster.model_copy(update={"curvine": cluster.curvine.model_copy(update={"scale_out": "report"})})
    ctx = ops.ctx("detect")
    ctx.cluster = report_only
    out = sc.scale(ctx, ScaleRequest(), holder="run-a")
    assert out.outcome == "reported"
    decision = out.detail["decision"]
    assert decision["due"] and decision["target"] == 3
    assert "1 GPU node(s) without a Curvine worker" in decision["reasons"][0]
    assert ctx.helm.values(C.CURVINE_RELEASE, NS)["worker"]["replicas"] == 2
