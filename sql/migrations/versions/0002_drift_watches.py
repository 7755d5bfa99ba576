"""Drift watches: when the drift check first saw a condition that only becomes a finding after a threshold
(an operator scaled to 0 by hand, with no pause annotation to date it).

Revision ID: 0002_drift_watches
Revises: 0001_initial
"""

from kvfleet.history.migrate import run_sql_file

revision = "0002_drift_watches"
down_revision = "0001_initial"


def upgrade() -> None:
    run_sql_file("0002_drift_watches.up.sql")


def downgrade() -> None:
    run_sql_file("0002_drift_watches.down.sql")
