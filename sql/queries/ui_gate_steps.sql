-- Gate steps recorded since :cutoff, newest first: the automatic gate after each wave (gate:<wave>) and every
-- human answer (gate_response:<task>), with who answered (the audit log's actor; automatic gates are kvfleet's).
SELECT s.at, s.cluster, s.step, s.outcome, s.detail->>'chosen' AS chosen, s.detail->>'asked' AS asked,
       s.detail->'waves' AS waves, s.detail->'verdicts' AS verdicts,
       COALESCE(a.actor, 'kvfleet') AS decided_by, s.run_key, s.task_id, s.map_index
FROM step_events s
LEFT JOIN audit_log a ON a.event_key = s.run_key || '|' || s.task_id || '|' || s.map_index || '|' || s.step
WHERE s.stage = 'gate' AND s.at >= :cutoff
ORDER BY s.at DESC, s.id DESC
LIMIT :limit
