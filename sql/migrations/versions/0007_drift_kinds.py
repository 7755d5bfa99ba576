"""Drift kinds that tell the truth: the overloaded kinds are split, and recorded findings are renamed
where their own columns tell the conditions apart.

- ``addon_not_active`` covered a missing add-on, a wrong version, a wrong configuration and a missing operator
  controller: rows become ``addon_missing`` (field ``status``, actual ``not installed``),
  ``addon_version_mismatch`` (field ``addonVersion``), ``addon_config_mismatch`` (field ``configurationValues``)
  and ``operator_missing`` (object ``Deployment/...``); the rest (a status other than ACTIVE) keep the name.
- ``curvine_workers_mismatch`` covered a missing release and an unreadable master: rows become
  ``curvine_release_missing`` (field ``release``) and ``curvine_master_unreadable`` (actual ``unknown: ...``).
- ``policy_missing`` covered a changed policy: rows with field ``spec`` become ``policy_changed``.

A finding's fingerprint hashes its kind (``fleet.drift.Finding.fingerprint``: the first 24 hex digits of
sha256("cluster|kind|object|field")), so renamed rows get the fingerprint the next check computes, and an open
finding stays one finding instead of being resolved and reopened; severity follows the new kind. What is not
rewritten, on purpose: the kinds listed inside ``drift_findings.remediation`` (what the remediation saw when it
ran) and ``audit_log`` rows, which are append-only and hash-chained (revision 0005).

Revision ID: 0007_drift_kinds
Revises: 0006_query_indexes
"""

from alembic import op

revision = "0007_drift_kinds"
down_revision = "0006_query_indexes"

FINGERPRINT = ("left(encode(sha256(convert_to(cluster || '|' || kind || '|' || object_ref || '|' || "
               "coalesce(field, ''), 'UTF8')), 'hex'), 24)")

# (old kind, new kind, new severity, the condition that tells the rows apart), in order.
RENAMES: tuple[tuple[str, str, str, str], ...] = (
    ("addon_not_active", "operator_missing", "high", "object_ref LIKE 'Deployment/%'"),
    ("addon_not_active", "addon_version_mismatch", "high", "field = 'addonVersion'"),
    ("addon_not_active", "addon_config_mismatch", "high", "field = 'configurationValues'"),
    ("addon_not_active", "addon_missing", "high", "field = 'status' AND actual = 'not installed'"),
    ("curvine_workers_mismatch", "curvine_release_missing", "high", "field = 'release'"),
    ("curvine_workers_mismatch", "curvine_master_unreadable", "medium",
     "field = 'live_workers' AND actual LIKE 'unknown:%'"),
    ("policy_missing", "policy_changed", "high", "field = 'spec'"),
)
OLD_SEVERITY = {"addon_not_active": "high", "curvine_workers_mismatch": "medium", "policy_missing": "high"}


def upgrade() -> None:
    for old, new, severity, where in RENAMES:
        op.execute(f"UPDATE drift_findings SET kind = '{new}', severity = '{severity}' "
                   f"WHERE kind = '{old}' AND {where}")
    _refingerprint(sorted({new for _old, new, _s, _w in RENAMES}))


def downgrade() -> None:
    for old, new, _severity, _where in RENAMES:
        op.execute(f"UPDATE drift_findings SET kind = '{old}', severity = '{OLD_SEVERITY[old]}' WHERE kind = '{new}'")
    _refingerprint(sorted(OLD_SEVERITY))


def _refingerprint(kinds: list[str]) -> None:
    listed = ", ".join(f"'{k}'" for k in kinds)
    op.execute(f"UPDATE drift_findings SET fingerprint = {FINGERPRINT} WHERE kind IN ({listed})")
