-- Write-ahead intents that never got an outcome: the change may or may not have happened.
SELECT i.id, i.at, i.run_key, i.cluster, i.endpoint, substr(i.action, 8) AS action, i.detail->>'target' AS target,
       i.actor, i.detail
FROM audit_log i
WHERE i.kind = 'intent'
  AND NOT EXISTS (SELECT 1 FROM audit_log o WHERE o.intent_id = i.id)
  AND (CAST(:cluster AS text) IS NULL OR i.cluster = :cluster)
  AND (CAST(:endpoint AS text) IS NULL OR i.endpoint = :endpoint OR split_part(i.endpoint, '/', 2) = :endpoint)
  AND (CAST(:run_key AS text) IS NULL OR i.run_key = :run_key)
ORDER BY i.id
