"""Initial history schema: runs, step events, Curvine releases, drift, verifications, capacity, audit, locks.

Revision ID: 0001_initial
Revises:
"""

from kvfleet.history.migrate import run_sql_file

revision = "0001_initial"
down_revision = None


def upgrade() -> None:
    run_sql_file("0001_initial.up.sql")


def downgrade() -> None:
    run_sql_file("0001_initial.down.sql")
