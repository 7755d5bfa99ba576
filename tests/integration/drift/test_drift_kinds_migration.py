"""Migration 0007_drift_kinds on a real PostgreSQL: rows of the overloaded kinds are renamed where their columns
tell the conditions apart, get the fingerprint the next check computes, and come back on downgrade."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from kvfleet.fleet import drift as rules
from kvfleet.history import migrate

pytestmark = pytest.mark.integration

BEFORE, AFTER = "0006_query_indexes", "0007_drift_kinds"
# (old kind, object_ref, field, actual) -> the kind a check makes of the same condition today
ROWS = {
    ("addon_not_active", "EksAddon/metrics-server", "status", "not installed"): "addon_missing",
    ("addon_not_active", "EksAddon/cert-manager", "status", "DEGRADED"): "addon_not_active",
    ("addon_not_active", "EksAddon/cert-manager", "addonVersion", "v1.2"): "addon_version_mismatch",
    ("addon_not_active", "EksAddon/aws-fsx-csi-driver", "configurationValues", "differs"): "addon_config_mismatch",
    ("addon_not_active", "Deployment/hyperpod-inference-system/hyperpod-inference-controller-manager", "metadata",
     "absent"): "operator_missing",
    ("curvine_workers_mismatch", "HelmRelease/curvine/curvine", "release", "release not found"):
        "curvine_release_missing",
    ("curvine_workers_mismatch", "CurvineMaster/curvine/curvine-master-0", "live_workers",
     "unknown: master API: timeout"): "curvine_master_unreadable",
    ("curvine_workers_mismatch", "CurvineMaster/curvine/curvine-master-1", "live_workers", "2"):
        "curvine_workers_mismatch",
    ("policy_missing", "ClusterPolicy/kvfleet-curvine-l2", "metadata", "absent"): "policy_missing",
    ("policy_missing", "ClusterPolicy/kvfleet-curvine-l2", "spec", "changed"): "policy_changed",
}


def _finding(kind: str, obj: str, field: str, actual: str) -> rules.Finding:
    return rules.Finding(kind, "c1", obj, field, "e", actual)


def _rows(engine) -> dict[tuple[str, str], tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        got = conn.execute(text("SELECT object_ref, field, kind, severity, fingerprint FROM drift_findings"))
        return {(r.object_ref, r.field): (r.kind, r.severity, r.fingerprint) for r in got}


def test_overloaded_kinds_are_renamed_with_their_fingerprints_and_restored_on_downgrade(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine, BEFORE)
    with engine.begin() as conn:
        for (kind, obj, field, actual) in ROWS:
            f = _finding(kind, obj, field, actual)
            conn.execute(text(
                "INSERT INTO drift_findings (fingerprint, cluster, kind, severity, object_ref, field, expected, actual) "
                "VALUES (:fp, 'c1', :k, :s, :o, :f, 'e', :a)"),
                {"fp": f.fingerprint, "k": kind, "s": f.severity, "o": obj, "f": field, "a": actual})
    old = _rows(engine)

    migrate.upgrade(engine, AFTER)
    new = _rows(engine)
    for (kind, obj, field, actual), want in ROWS.items():
        f = _finding(want, obj, field, actual)
        assert new[(obj, field)] == (want, f.severity, f.fingerprint), (kind, obj, field)

    migrate.downgrade(engine, BEFORE)
    assert _rows(engine) == old
    engine.dispose()
