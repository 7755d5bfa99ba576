"""The inventory each run applies, pinned with the run.

- ``inventory_snapshots``: a validated inventory as canonical JSON (``kvfleet.fleet.pinning``), keyed by its
  sha256, stored once however many runs apply it (the drift check runs every 10 minutes on the same file). The
  key is checked to be the digest of the body. The writer role may read and add snapshots, never change or delete
  one.
- ``runs.inventory_sha256`` (the snapshot the run applies), ``runs.inventory_commit`` and ``runs.inventory_dirty``
  (the git commit of the file's work tree, and whether the file differs from that commit's copy; null when git
  does not track the file). Runs recorded before this revision have none.

Revision ID: 0010_pinned_inventory
Revises: 0009_endpoint_state
"""

from kvfleet.history.migrate import run_sql_file

revision = "0010_pinned_inventory"
down_revision = "0009_endpoint_state"


def upgrade() -> None:
    run_sql_file("0010_pinned_inventory.up.sql")


def downgrade() -> None:
    run_sql_file("0010_pinned_inventory.down.sql")
