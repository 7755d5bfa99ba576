"""kvfleet_curvine_upgrade's stage against the sandbox: format-flag gates before any change, snapshots, post-checks
and a rollback that never goes back to a revision with a format flag true."""

from __future__ import annotations

import pytest
import yaml
from opskit import CLUSTER, NS, wait

from kvfleet.errors import GateRefused, PermanentError
from kvfleet.fleet import actions as A
from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_values as cv
from kvfleet.stages import curvine_upgrade as up
from kvfleet.stages import executor
from kvfleet.stages.curvine_upgrade import UpgradeRequest
from kvfleet_sandbox.chart_repo import CRASHLOOP_WORKER

pytestmark = pytest.mark.integration


def _revisions(ctx):  # type: ignore[no-untyped-def]
    return [int(r["revision"]) for r in ctx.helm.history(C.CURVINE_RELEASE, NS)]


def _mutations(ops):  # type: ignore[no-untyped-def]
    return [(r.verb, r.resource, r.name) for r in ops.twin.store.request_log
            if r.verb in ("create", "update", "patch", "delete", "deletecollection") and not r.dry_run]


def _steps(ops, step: str):  # type: ignore[no-untyped-def]
    return [s for s in ops.history.runs.steps(ops.make().step_key.run_key) if s["step"] == step]


def test_upgrade_to_a_newer_chart_keeps_l2_files_and_metadata_counts(ops) -> None:  # type: ignore[no-untyped-def]
    paths = ops.write_files(6)
    before = ops.sim.overview()
    formats = len(ops.sim.formats)
    dry = ops.ctx("upgrade-dry", dry_run=True)
    assert up.upgrade(dry, UpgradeRequest(version="0.3.3-alpha", timeout_s=20), holder="run-a").outcome == "planned"
    ctx = ops.ctx("upgrade")
    out = up.upgrade(ctx, UpgradeRequest(version="0.3.3-alpha", timeout_s=20), holder="run-a")
    assert out.outcome == "changed"
    # the real run applied exactly the typed action the dry run listed (values files by digest included)
    assert [type(a).__name__ for a in executor.journal(ctx)] == ["HelmUpgrade"]
    assert executor.journal(ctx) == executor.journal(dry)
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
    assert checks["files_after"] >= checks["files_before"]
    assert checks["l2"]["missing"] == [] and checks["l2"]["files"] == 3
    # snapshots before/after and every revision with its flags are in the history store
    caps = ops.history.queries.rows("capacity_history", cluster=CLUSTER)
    assert [c["phase"] for c in caps if c["step"] == up.STAGE] == ["before", "after"]
    rels = ops.history.queries.rows("curvine_history", cluster=CLUSTER)
    assert [(r["revision"], r["chart_version"], r["format_master"]) for r in rels] == [
        (1, "0.3.2-alpha", True), (2, "0.3.2-alpha", False), (3, "0.3.3-alpha", False)]
    assert ops.history.leases.get(ctx.cluster.key) is None  # the lease was released

    # a second run is a no-op
    again = up.upgrade(ops.ctx("upgrade-again"), UpgradeRequest(version="0.3.3-alpha", timeout_s=20), holder="run-b")
    assert again.outcome == "unchanged" and _revisions(ctx) == [1, 2, 3]


def test_an_override_setting_format_master_is_refused_before_any_change(ops) -> None:  # type: ignore[no-untyped-def]
    paths = ops.write_files(2)
    ctx = ops.ctx("upgrade")
    uids = ops.pod_uids()
    ops.twin.store.reset_request_log()
    with pytest.raises(GateRefused, match=r"key .cluster.formatMaster. touches a Curvine format flag.*Approval does not change this"):
        up.upgrade(ctx, UpgradeRequest(version="0.3.3-alpha", overrides={"cluster.formatMaster": "true"}),
                   holder="run-a")
    # nested spelling too
    with pytest.raises(GateRefused, match=r"cluster\.formatWorker"):
        up.upgrade(ctx, UpgradeRequest(version="0.3.3-alpha", overrides={"cluster": {"formatWorker": True}}),
                   holder="run-a")
    assert _mutations(ops) == []
    assert _revisions(ctx) == [1, 2] and ops.pod_uids() == uids and all(ops.twin.l2.exists(p) for p in paths)
    assert ops.history.leases.get(ctx.cluster.key) is None
    refused = _steps(ops, "gates")
    assert refused and refused[0]["outcome"] == "refused" and "formatMaster" in refused[0]["detail"]["reason"]


def test_a_release_whose_values_carry_a_flag_true_is_refused_with_the_reason(ops) -> None:  # type: ignore[no-untyped-def]
    ctx = ops.ctx("upgrade")
    # someone left formatJournal=true in the release (revision 3)
    ctx.helm.upgrade(C.CURVINE_RELEASE, "curvine", NS, repo=ops.twin.services["chart_repo_url"],
                     version="0.3.2-alpha", values={"cluster.formatJournal": True})
    with pytest.raises(GateRefused) as err:
        up.upgrade(ctx, UpgradeRequest(version="0.3.3-alpha"), holder="run-a")
    text = str(err.value)
    assert "revision 3" in text and "cluster.formatJournal=true" in text and "Fix that first" in text
    assert _revisions(ctx) == [1, 2, 3] and ops.history.leases.get(ctx.cluster.key) is None


def test_missing_version_and_busy_cluster_are_refused(ops) -> None:  # type: ignore[no-untyped-def]
    ctx = ops.ctx("upgrade")
    with pytest.raises(GateRefused, match=r"version 9\.9\.9 was not found"):
        up.upgrade(ctx, UpgradeRequest(version="9.9.9"), holder="run-a")
    assert ops.history.leases.get(ctx.cluster.key) is None
    ops.history.leases.try_take(ctx.cluster.key, "kvfleet_rollout/manual__1", "rollout", 300)
    with pytest.raises(GateRefused, match="a rollout is running on the cluster"):
        up.upgrade(ctx, UpgradeRequest(version="0.3.3-alpha"), holder="run-a")
    ops.history.leases.release(ctx.cluster.key, "kvfleet_rollout/manual__1")
    ops.history.leases.try_take(ctx.cluster.key, "kvfleet_drift_check/x", "drift-remediation", 300)
    with pytest.raises(GateRefused, match="cluster lock is held by kvfleet_drift_check/x"):
        up.upgrade(ctx, UpgradeRequest(version="0.3.3-alpha"), holder="run-a")
    assert _revisions(ctx) == [1, 2]


def test_a_failed_upgrade_rolls_back_to_the_newest_safe_revision_not_revision_1(ops) -> None:  # type: ignore[no-untyped-def]
    ops.repo.publish("curvine", "0.3.4-alpha", value_overrides=CRASHLOOP_WORKER)  # its workers never get Ready
    paths = ops.write_files(6)
    formats = len(ops.sim.formats)
    ctx = ops.ctx("upgrade")
    with pytest.raises(PermanentError) as err:
        up.upgrade(ctx, UpgradeRequest(version="0.3.4-alpha", timeout_s=3, rollback=True), holder="run-a")
    text = str(err.value)
    assert "Rolled back from revision 3 to revision 2" in text and "L2 files and metadata kept" in text
    history = ctx.helm.history(C.CURVINE_RELEASE, NS)
    assert [int(r["revision"]) for r in history] == [1, 2, 3, 4]
    assert "Rollback to 2" in history[-1]["description"]
    assert not cv.flags_set(ctx.helm.values(C.CURVINE_RELEASE, NS))
    assert all(ops.twin.l2.exists(p) for p in paths) and ops.sim.formats[formats:] == []
    wait(lambda: ops.sim.overview()["live_workers"] == 2, "workers back")
    rollback = _steps(ops, "rollback")[0]
    assert rollback["outcome"] == "changed" and rollback["detail"]["to"] == 2 and rollback["detail"]["from"] == 3
    assert rollback["detail"]["replaced_stuck_pods"] == ["curvine-worker-1"]
    assert executor.journal(ctx)[-1] == A.HelmRollback(C.CURVINE_RELEASE, NS, revision=2, from_revision=3)
    rels = ops.history.queries.rows("curvine_history", cluster=CLUSTER)
    assert [(r["revision"], r["format_master"]) for r in rels] == [(1, True), (2, False), (3, False), (4, False)]
    assert ops.history.leases.get(ctx.cluster.key) is None


def test_rollback_is_refused_when_only_revision_1_with_flags_true_precedes(ops) -> None:  # type: ignore[no-untyped-def]
    paths = ops.write_files(3)
    ctx = ops.ctx("rollback")
    with pytest.raises(GateRefused) as err:
        up.rollback_to_safe_revision(ctx, failed_revision=2, reason="revision 2 failed")
    text = str(err.value)
    assert "no revision before 2 has every format flag false" in text
    assert "revision 1 (superseded): formatMaster=True, formatWorker=True, formatJournal=True" in text
    assert _revisions(ctx) == [1, 2] and all(ops.twin.l2.exists(p) for p in paths)
    assert _steps(ops, "rollback")[0]["outcome"] == "refused"


def test_dry_run_prints_the_exact_helm_command_and_the_values_diff_and_changes_nothing(ops) -> None:  # type: ignore[no-untyped-def]
    said: list[str] = []
    ctx = ops.ctx("upgrade", dry_run=True, progress=said.append)
    uids = ops.pod_uids()
    ops.twin.store.reset_request_log()
    out = up.upgrade(ctx, UpgradeRequest(version="0.3.3-alpha", overrides={"config.log.level": "DEBUG"}),
                     holder="run-a")
    assert out.outcome == "planned"
    repo = ops.twin.services["chart_repo_url"]
    # values files kvfleet writes, never --set (a comma in a --set value would set a second key); the flags last
    [action] = executor.journal(ctx)  # one typed action, each values file named by its content digest
    assert isinstance(action, A.HelmUpgrade)
    first, last = f"values-{action.values_digest}.yaml", f"values-{action.last_digest}.yaml"
    command = (f"helm upgrade curvine curvine --repo {repo} --version 0.3.3-alpha -n curvine -f {first} "
               f"--reset-then-reuse-values -f {last}   # {first}: config.log.level=DEBUG; {last}: "
               "cluster.formatJournal=false cluster.formatMaster=false cluster.formatWorker=false rbac.create=false")
    assert [p.action for p in ctx.planned] == [command] == [action.equivalent()]
    files = out.detail["values_files"]
    assert yaml.safe_load(files[first]) == {"config": {"log": {"level": "DEBUG"}}}
    assert yaml.safe_load(files[last]) == {"cluster": {
        "formatMaster": False, "formatWorker": False, "formatJournal": False}, "rbac": {"create": False}}
    assert out.detail["rendered"]["format_findings"] == []  # what helm would deploy was rendered and checked
    assert "~ config.log.level: 'INFO' -> 'DEBUG'" in ctx.planned[0].diff
    assert any(command in line and "~ config.log.level: 'INFO' -> 'DEBUG'" in line for line in said)  # the log
    assert _mutations(ops) == []
    assert _revisions(ctx) == [1, 2] and ops.pod_uids() == uids and ops.history.leases.get(ctx.cluster.key) is None


def test_an_upgrade_warns_when_eligible_gpu_nodes_run_no_worker(ops) -> None:  # type: ignore[no-untyped-def]
    """Required anti-affinity keeps two workers off one node, not a restarted worker on its own: with GPU nodes
    free of workers, a worker the upgrade restarts may land on one, without its blocks. The gates say so (in the
    dry run's planned outcome and its log; a real upgrade records the same warnings in its gates step), and say
    nothing when every eligible node runs a worker."""
    req = UpgradeRequest(version="0.3.3-alpha")
    quiet = up.upgrade(ops.ctx("before", dry_run=True), req, holder="run-a")
    assert quiet.outcome == "planned"
    assert not [w for w in quiet.detail["warnings"] if "run no Curvine worker" in w]  # 2 workers on 2 nodes
    added = ops.twin.services["workloads"].add_nodes(2)
    ops.twin.store.reset_request_log()
    said: list[str] = []
    out = up.upgrade(ops.ctx("after", dry_run=True, progress=said.append), req, holder="run-a")
    assert out.outcome == "planned"
    [warning] = [w for w in out.detail["warnings"] if "run no Curvine worker" in w]
    assert warning.startswith("2 eligible GPU node(s) run no Curvine worker") and all(n in warning for n in added)
    assert "all_eligible" in warning and any(warning in line for line in said)  # the fix, and the log says it
    assert _mutations(ops) == []  # a dry run
