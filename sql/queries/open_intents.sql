-- Write-ahead intents that never got an outcome: the change may or may not have happened.
-- The open intents are kept at write time in audit_open_intents (a trigger on audit_log, revision 0008): this
-- reads a few rows instead of anti-joining every intent of the log.
SELECT i.id, i.at, i.run_key, i.cluster, i.endpoint, substr(i.action, 8) AS action, i.detail->>'target' AS target,
       i.actor, i.detail
FROM audit_open_intents oi
JOIN audit_log i ON i.id = oi.intent_id
WHERE i.kind = 'intent'
  AND (CAST(:clusters AS text[]) IS NULL OR i.cluster = ANY(:clusters))
  AND (CAST(:endpoint AS text) IS NULL OR i.endpoint = :endpoint OR split_part(i.endpoint, '/', 2) = :endpoint)
  AND (CAST(:run_key AS text) IS NULL OR i.run_key = :run_key)
ORDER BY i.id
