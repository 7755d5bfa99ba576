"""Cluster leases carry a state: 'active' (a running task heartbeats it) or 'parked' (kept while a gate waits).

Revision ID: 0004_lease_liveness
Revises: 0003_curvine_release_updated
"""

from kvfleet.history.migrate import run_sql_file

revision = "0004_lease_liveness"
down_revision = "0003_curvine_release_updated"


def upgrade() -> None:
    run_sql_file("0004_lease_liveness.up.sql")


def downgrade() -> None:
    run_sql_file("0004_lease_liveness.down.sql")
