"""Each endpoint's latest state kept at write time, so that the kvfleet page's Fleet view (``ui_fleet``) reads one
row per endpoint instead of four index probes per endpoint into the history (bench/audit_scale.py).

- ``endpoint_state``: per (cluster, endpoint), what ``ui_fleet`` read from the history before this revision —
  the newest endpoint step that was not a plan (``ep_*``), the newest cross-pod verification (``v_*``), the open
  drift findings counted, their kinds, LOB and oldest ``first_seen`` (``open_drift``, ``drift_*``) and the newest
  step that changed something or failed (``change_*``). Each part is the same subquery as before, over the same
  indexes (revision 0006).
- Kept by statement-level triggers with transition tables on ``step_events``, ``hit_verifications`` and
  ``drift_findings``: each statement names the endpoints its rows touch (steps only when the row is an endpoint
  step or a change; drift findings only when open, and on update only when a column the summary reads changed),
  and those endpoints' rows are recomputed from the history. The recount locks the endpoints' rows first, in key
  order, so two writers of one endpoint cannot leave a stale row: the second waits for the first to commit and
  then reads its rows. A row is kept while any part has something (a change alone is kept, not listed: the view
  lists an endpoint with an endpoint step, a verification or open drift, as before) and removed when nothing is
  left.
- Steps recorded without a cluster or an endpoint cannot be keyed; ``ui_fleet`` reads them from the history as
  before, through a partial index that holds only them (none are recorded by kvfleet).

As in revision 0008, the trigger functions are SECURITY DEFINER (the owner's), the recount function cannot be
run by others, and the writer role may read ``endpoint_state`` but not write it. The summary is filled from the
rows already recorded when this revision is applied.

Revision ID: 0009_endpoint_state
Revises: 0008_query_rollups
"""

from kvfleet.history.migrate import run_sql_file

revision = "0009_endpoint_state"
down_revision = "0008_query_rollups"


def upgrade() -> None:
    run_sql_file("0009_endpoint_state.up.sql")


def downgrade() -> None:
    run_sql_file("0009_endpoint_state.down.sql")
