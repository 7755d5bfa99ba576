-- Runs started since :cutoff, newest first, with step counts per outcome.
SELECT r.run_key, r.dag_id, r.run_id, r.trigger, r.triggered_by, r.status, r.reason, r.started_at,
       r.ended_at, r.params,
       COUNT(s.id) FILTER (WHERE s.outcome = 'changed') AS changed,
       COUNT(s.id) FILTER (WHERE s.outcome = 'unchanged') AS unchanged,
       COUNT(s.id) FILTER (WHERE s.outcome IN ('failed', 'refused')) AS failed,
       COUNT(s.id) FILTER (WHERE s.outcome = 'planned') AS planned,
       (SELECT count(*) FROM audit_log i WHERE i.run_key = r.run_key AND i.kind = 'intent'
          AND NOT EXISTS (SELECT 1 FROM audit_log o WHERE o.intent_id = i.id)) AS unknown_changes
FROM runs r
LEFT JOIN step_events s ON s.run_key = r.run_key
WHERE r.started_at >= :cutoff
GROUP BY r.run_key
ORDER BY r.started_at DESC
LIMIT :limit
