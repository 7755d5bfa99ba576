-- What changed on one endpoint since :cutoff, in which run, triggered by whom: the reconcilers' steps and the
-- write-ahead records (an intent without an outcome reads 'unknown — check live state'), failed runs included.
SELECT * FROM (
    SELECT s.at, s.cluster, s.endpoint, s.stage, s.step, s.outcome, s.detail,
           s.run_key, r.dag_id, r.trigger, r.triggered_by, r.status AS run_status
    FROM step_events s
    LEFT JOIN runs r ON r.run_key = s.run_key
    WHERE s.endpoint IS NOT NULL
      AND (s.endpoint = :endpoint OR split_part(s.endpoint, '/', 2) = :endpoint)
      AND s.at >= :cutoff
      AND s.outcome <> 'unchanged'
    UNION ALL
    SELECT i.at, i.cluster, i.endpoint, 'write-ahead' AS stage,
           substr(i.action, 8) || ' ' || COALESCE(i.detail->>'target', '') AS step,
           COALESCE(o.detail->>'result', 'unknown — check live state') AS outcome, i.detail,
           i.run_key, r.dag_id, r.trigger, r.triggered_by, r.status AS run_status
    FROM audit_log i
    LEFT JOIN LATERAL (
        SELECT detail FROM audit_log o WHERE o.intent_id = i.id ORDER BY o.id DESC LIMIT 1
    ) o ON true
    LEFT JOIN runs r ON r.run_key = i.run_key
    WHERE i.kind = 'intent' AND i.endpoint IS NOT NULL
      AND (i.endpoint = :endpoint OR split_part(i.endpoint, '/', 2) = :endpoint)
      AND i.at >= :cutoff
) changes
ORDER BY at DESC
