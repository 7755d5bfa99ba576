-- Write-ahead records since :cutoff (optionally of one run, cluster or endpoint): each intent with its newest
-- outcome; an intent without one reads 'unknown — check live state'.
SELECT i.at, i.run_key, i.cluster, i.endpoint, substr(i.action, 8) AS action, i.detail->>'target' AS target,
       COALESCE(o.detail->>'result', 'unknown — check live state') AS outcome, o.at AS outcome_at,
       i.actor, i.id AS intent_id, o.detail AS outcome_detail
FROM audit_log i
LEFT JOIN LATERAL (
    SELECT at, detail FROM audit_log o WHERE o.intent_id = i.id ORDER BY o.id DESC LIMIT 1
) o ON true
WHERE i.kind = 'intent' AND i.at >= :cutoff
  AND (CAST(:run_key AS text) IS NULL OR i.run_key = :run_key)
  AND (CAST(:clusters AS text[]) IS NULL OR i.cluster = ANY(:clusters))
  AND (CAST(:endpoint AS text) IS NULL OR i.endpoint = :endpoint OR split_part(i.endpoint, '/', 2) = :endpoint)
ORDER BY i.at DESC, i.id DESC
LIMIT :limit
