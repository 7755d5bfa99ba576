"""Indexes for the named queries of `kvfleet audit` and the kvfleet page at fleet scale (bench/audit_scale.py).

Revision ID: 0006_query_indexes
Revises: 0005_audit_trail
"""

from alembic import op

revision = "0006_query_indexes"
down_revision = "0005_audit_trail"

# From the plans that bench/audit_scale.py --plans prints at 1 M rows (sequential scans, or a sort of a whole
# table, where a named query or the audit chain's insert trigger needs a few rows). Name, definition.
INDEXES: tuple[tuple[str, str], ...] = (
    # The chain trigger (0005) reads the newest row with ORDER BY seq DESC NULLS LAST LIMIT 1 on every insert;
    # the UNIQUE (seq) index (ASC NULLS LAST) cannot give that order, so each insert scanned and sorted the log.
    ("audit_log_seq_desc", "ON audit_log (seq DESC NULLS LAST)"),
    # write_ahead, endpoint_changes, open_intents: the intents, newest first.
    ("audit_log_intents_at", "ON audit_log (at DESC, id DESC) WHERE kind = 'intent'"),
    # endpoint_changes / open_intents / write_ahead: an endpoint named as namespace/name or as its bare name.
    ("audit_log_intents_endpoint", "ON audit_log (endpoint) WHERE kind = 'intent'"),
    ("audit_log_intents_endpoint_name", "ON audit_log (split_part(endpoint, '/', 2)) WHERE kind = 'intent'"),
    # verifications, hit_stats_weekly: everything since a cutoff.
    ("hit_verifications_at", "ON hit_verifications (at DESC)"),
    # verifications --endpoint, ui_endpoint_verifications: the bare-name form of an endpoint.
    ("hit_verifications_endpoint", "ON hit_verifications (endpoint, at)"),
    ("hit_verifications_endpoint_name", "ON hit_verifications (split_part(endpoint, '/', 2), at)"),
    # drift_since: findings seen since a cutoff; drift_recurrence: one kind since a cutoff.
    ("drift_findings_last_seen", "ON drift_findings (last_seen DESC)"),
    ("drift_findings_kind_first_seen", "ON drift_findings (kind, first_seen)"),
    # ui_gate_steps, gate_decisions: the gate steps since a cutoff.
    ("step_events_gate_at", "ON step_events (at DESC, id DESC) WHERE stage = 'gate'"),
    # endpoint_changes: one endpoint's steps, by namespace/name or by bare name.
    ("step_events_endpoint", "ON step_events (endpoint, at) WHERE endpoint IS NOT NULL"),
    ("step_events_endpoint_name", "ON step_events (split_part(endpoint, '/', 2), at) WHERE endpoint IS NOT NULL"),
    # ui_clusters and ui_lobs walk each table's distinct clusters / LOBs through these (a loose index scan) and
    # read each cluster's newest time from the same index.
    ("hit_verifications_cluster_at", "ON hit_verifications (cluster, at DESC)"),
    ("curvine_releases_cluster_at", "ON curvine_releases (cluster, recorded_at DESC)"),
    ("drift_findings_cluster_last_seen", "ON drift_findings (cluster, last_seen DESC)"),
    ("drift_findings_lob", "ON drift_findings (lob) WHERE lob IS NOT NULL"),
    ("step_events_endpoint_lob", "ON step_events (lob) WHERE stage = 'endpoint' AND lob IS NOT NULL"),
    # ui_fleet: each endpoint's newest change (most steps are 'unchanged' drift checks, which it skips).
    ("step_events_endpoint_change", "ON step_events (cluster, endpoint, at DESC, id DESC) "
                                    "WHERE endpoint IS NOT NULL AND outcome NOT IN ('unchanged', 'planned', 'passed')"),
    # ui_fleet: each endpoint's open drift (drift_findings_open leads with the cluster only).
    ("drift_findings_open_endpoint", "ON drift_findings (cluster, endpoint) WHERE resolved_at IS NULL"),
    # ui_fleet: each endpoint's newest verification.
    ("hit_verifications_endpoint_latest", "ON hit_verifications (cluster, endpoint, id DESC)"),
    # ui_fleet, rollout_by_lob: the newest endpoint step per (cluster, endpoint).
    ("step_events_endpoint_latest",
     "ON step_events (cluster, endpoint, id DESC) WHERE stage = 'endpoint' AND step LIKE 'endpoint:%'"),
)


def upgrade() -> None:
    for name, definition in INDEXES:
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} {definition}")


def downgrade() -> None:
    for name, _definition in reversed(INDEXES):
        op.execute(f"DROP INDEX IF EXISTS {name}")
