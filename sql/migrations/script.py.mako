"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from kvfleet.history.migrate import run_sql_file

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}


def upgrade() -> None:
    run_sql_file("${up_revision}.up.sql")


def downgrade() -> None:
    run_sql_file("${up_revision}.down.sql")
