"""Indexes for the named queries of `kvfleet audit` and the kvfleet page at fleet scale (bench/audit_scale.py).

Revision ID: 0006_query_indexes
Revises: 0005_audit_trail
"""

from alembic import op

revision = "0006_query_indexes"
down_revision = "0005_audit_trail"

# Filled from the plans that bench/audit_scale.py --plans prints at 1 M rows.
INDEXES: tuple[tuple[str, str], ...] = ()


def upgrade() -> None:
    for name, definition in INDEXES:
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} {definition}")


def downgrade() -> None:
    for name, _definition in reversed(INDEXES):
        op.execute(f"DROP INDEX IF EXISTS {name}")
