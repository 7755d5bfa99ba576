"""The reader role: ``kvfleet_reader`` may SELECT every table and view of the history and nothing else. `kvfleet
audit` and the kvfleet page read as it (``kvfleet.history.db.reader_url``); tables a later revision adds are
readable through the owner's default privileges. Granted only where the role exists (the embedded server creates
it; docs/run-for-real.md 4a says how on a managed PostgreSQL).

Revision ID: 0013_reader
Revises: 0012_holds
"""

from kvfleet.history.migrate import run_sql_file

revision = "0013_reader"
down_revision = "0012_holds"


def upgrade() -> None:
    run_sql_file("0013_reader.up.sql")


def downgrade() -> None:
    run_sql_file("0013_reader.down.sql")
