"""Curvine releases remember helm's "updated" time of each revision, so its values are read only once.

Revision ID: 0003_curvine_release_updated
Revises: 0002_drift_watches
"""

from kvfleet.history.migrate import run_sql_file

revision = "0003_curvine_release_updated"
down_revision = "0002_drift_watches"


def upgrade() -> None:
    run_sql_file("0003_curvine_release_updated.up.sql")


def downgrade() -> None:
    run_sql_file("0003_curvine_release_updated.down.sql")
