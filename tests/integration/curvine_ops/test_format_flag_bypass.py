"""The format-flag bypass class against the sandbox: the comma case is refused before any change,
and a flag that reaches the rendered objects another way (here an env var from a hand-applied values file, with
every stored ``cluster.format*`` value false) is caught in what helm would deploy, before a scale-out or upgrade."""

from __future__ import annotations

import pytest
from opskit import CLUSTER, NS

from kvfleet.errors import GateRefused
from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_values as cv
from kvfleet.stages import curvine
from kvfleet.stages import curvine_scale as sc
from kvfleet.stages import curvine_upgrade as up
from kvfleet.stages.curvine_scale import ScaleRequest
from kvfleet.stages.curvine_upgrade import UpgradeRequest

pytestmark = pytest.mark.integration


def _revisions(ctx):  # type: ignore[no-untyped-def]
    return [int(r["revision"]) for r in ctx.helm.history(C.CURVINE_RELEASE, NS)]


def _mutations(ops):  # type: ignore[no-untyped-def]
    return [(r.verb, r.resource, r.name) for r in ops.twin.store.request_log
            if r.verb in ("create", "update", "patch", "delete", "deletecollection") and not r.dry_run]


def test_the_comma_case_is_refused_before_any_change(ops) -> None:  # type: ignore[no-untyped-def]
    paths = ops.write_files(3)
    ctx = ops.ctx("upgrade")
    uids, formats = ops.pod_uids(), len(ops.sim.formats)
    ops.twin.store.reset_request_log()
    for overrides in ({"config.log.level": "INFO,cluster.formatMaster=true"},
                      {"config.log.level": "INFO\\,cluster.formatMaster=true"},
                      {"cluster": {"formatMaster": True}},
                      {"CLUSTER.FormatWorker": "true"}):
        with pytest.raises(GateRefused, match=r"(?i)format.*Approval does not change this"):
            up.upgrade(ctx, UpgradeRequest(version="0.3.3-alpha", overrides=overrides, timeout_s=20),
                       holder="run-a")
    assert _mutations(ops) == []  # nothing written: no helm revision, no pod touched
    assert _revisions(ctx) == [1, 2] and ops.pod_uids() == uids and ops.sim.formats[formats:] == []
    assert all(ops.twin.l2.exists(p) for p in paths) and ops.sim.overview()["files_total"] == 3
    assert ops.history.leases.get(CLUSTER) is None


def test_a_flag_in_the_rendered_objects_is_refused_for_scale_out_and_upgrade(ops, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ctx = ops.ctx("hand-made")
    spec = ctx.cluster.curvine
    # A person applies a values file whose format flags are all false, but whose worker env formats the workers:
    # the stored cluster.format* values stay false, only the rendered objects show the flag.
    values = tmp_path / "by-hand.yaml"
    values.write_text("worker:\n  extraEnv:\n    - {name: CURVINE_FORMAT_WORKER, value: 'true'}\n")
    ctx.helm.run("upgrade", C.CURVINE_RELEASE, spec.chart, "-n", NS, "--repo", curvine.repo_url(ctx), "--version",
                 spec.version, "--reuse-values", "-f", str(values), what="hand-made helm upgrade")
    assert not cv.flags_set(ctx.helm.values(C.CURVINE_RELEASE, NS))  # the values-level gate cannot see it
    revisions = _revisions(ctx)

    scale_ctx = ops.ctx("scale")
    with pytest.raises(GateRefused, match=r"scale-out refused .* before any change: .*CURVINE_FORMAT_WORKER=true"):
        sc.scale(scale_ctx, ScaleRequest(target=1, allow_scale_in=True, timeout_s=20), holder="run-s")
    with pytest.raises(GateRefused, match=r"upgrade refused .* before any change: .*CURVINE_FORMAT_WORKER=true"):
        up.upgrade(ops.ctx("upgrade"), UpgradeRequest(version="0.3.3-alpha", timeout_s=20), holder="run-u")
    assert _revisions(ctx) == revisions  # no new revision from either
    assert ops.history.leases.get(CLUSTER) is None
    # and stage 3's post-flip check reads the deployed objects, not only the values
    with pytest.raises(Exception, match=r"deployed: .*CURVINE_FORMAT_WORKER=true"):
        curvine.verify_flags_false(ops.ctx("verify"))
