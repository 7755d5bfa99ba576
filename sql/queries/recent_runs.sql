-- Runs started since :cutoff, newest first, with step counts per outcome and the inventory each applied (its sha256,
-- and the git commit of its work tree, revision 0010).
-- The :limit newest runs are chosen first (runs_started_at), then each one's steps are counted through its own
-- index range (step_events_run): the counts never read the steps of runs that are not shown. Its write-ahead
-- intents without an outcome are counted in audit_open_intents (kept at write time; revision 0008).
SELECT r.run_key, r.dag_id, r.run_id, r.trigger, r.triggered_by, r.status, r.reason, r.started_at,
       r.ended_at, r.params, r.inventory_sha256, r.inventory_commit, r.inventory_dirty,
       s.changed, s.unchanged, s.failed, s.planned,
       (SELECT count(*) FROM audit_open_intents oi WHERE oi.run_key = r.run_key) AS unknown_changes
FROM (
    SELECT * FROM runs
    WHERE started_at >= :cutoff
    ORDER BY started_at DESC
    LIMIT :limit
) r
CROSS JOIN LATERAL (
    SELECT COUNT(*) FILTER (WHERE outcome = 'changed') AS changed,
           COUNT(*) FILTER (WHERE outcome = 'unchanged') AS unchanged,
           COUNT(*) FILTER (WHERE outcome IN ('failed', 'refused')) AS failed,
           COUNT(*) FILTER (WHERE outcome = 'planned') AS planned
    FROM step_events s
    WHERE s.run_key = r.run_key
) s
ORDER BY r.started_at DESC
