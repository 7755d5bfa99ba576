"""An audit history you can trust: run end reasons, write-ahead records, a hash-chained audit log, drift
resolutions, and the writer role's grants.

Revision ID: 0005_audit_trail
Revises: 0004_lease_liveness
"""

from kvfleet.history.migrate import run_sql_file

revision = "0005_audit_trail"
down_revision = "0004_lease_liveness"


def upgrade() -> None:
    run_sql_file("0005_audit_trail.up.sql")


def downgrade() -> None:
    run_sql_file("0005_audit_trail.down.sql")
