"""Summaries maintained at write time and keyset-paging indexes, so that `kvfleet audit` and the kvfleet page stay
under 50 ms at 1 M history rows (bench/audit_scale.py).

- ``audit_open_intents``: the write-ahead intents that have no outcome yet, kept by a statement trigger on
  ``audit_log`` (an intent row adds its id, any row with an ``intent_id`` removes it). ``open_intents`` reads it
  instead of anti-joining every intent of the log.
- ``hit_stats_buckets``: cross-pod verifications counted and summed per line of business and quarter hour, kept by
  statement triggers on ``hit_verifications``. ``hit_stats_weekly`` adds up the buckets (and reads the rows of the
  partial quarter hour at the cutoff), instead of aggregating every verification of the window. Quarter hours
  because every time zone's offset is a multiple of 15 minutes: ``date_trunc('week', ...)`` of a bucket is that
  of every row in it, whatever the session's TimeZone.
- ``drift_day_counts``: drift findings counted per cluster and UTC day of ``last_seen`` (seen, open, resolved,
  remediation outcome), kept by statement triggers on ``drift_findings`` (its rows are updated: each update
  subtracts the old row and adds the new). ``drift_summary`` adds up the days after the cutoff and counts the
  rows of the day the cutoff falls in.
- Indexes for the keyset-paged queries (``verifications_page``, ``drift_page``, ``open_drift_page``) and
  ``drift_recurrence``.

The trigger functions are SECURITY DEFINER (the owner's) and the writer role may only read the summary tables:
like the audit log itself, it cannot rewrite what the summaries say, and it still cannot touch triggers. The
summaries are filled from the rows already recorded when this revision is applied.

Revision ID: 0008_query_rollups
Revises: 0007_drift_kinds
"""

from kvfleet.history.migrate import run_sql_file

revision = "0008_query_rollups"
down_revision = "0007_drift_kinds"


def upgrade() -> None:
    run_sql_file("0008_query_rollups.up.sql")


def downgrade() -> None:
    run_sql_file("0008_query_rollups.down.sql")
