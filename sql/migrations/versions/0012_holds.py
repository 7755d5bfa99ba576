"""Freezes and emergency stops: ``holds``, one row per `kvfleet freeze on` or `kvfleet stop`.

- ``kind``: ``freeze`` (no mutating run starts in its scope, and one in flight ends at its next safe point, until it
  is lifted) or ``stop`` (the runs in its scope that were in flight when it was given stop at their next safe
  point; a run started later is not held, so a stop is never lifted).
- ``scope`` and ``target``: ``all`` (target ''), ``lob`` (a LOB's name), ``cluster`` (a cluster key
  ``account/region/name``) or, for a stop only, ``run`` (a run key ``dag_id/run_id``).
- ``reason`` (required, at most 500 characters), ``requested_by``, ``requested_at``; for a freeze, ``lifted_at``,
  ``lifted_by`` and ``lift_reason`` when it is lifted.
At most one active freeze per scope (a unique partial index), which makes `freeze on` idempotent. The writer role
may read, add and lift holds, never delete one. Read by ``kvfleet.history.holds``.

Revision ID: 0012_holds
Revises: 0011_cluster_keys
"""

from kvfleet.history.migrate import run_sql_file

revision = "0012_holds"
down_revision = "0011_cluster_keys"


def upgrade() -> None:
    run_sql_file("0012_holds.up.sql")


def downgrade() -> None:
    run_sql_file("0012_holds.down.sql")
