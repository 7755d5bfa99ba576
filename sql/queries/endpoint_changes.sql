-- What changed on one endpoint since :cutoff, in which run, triggered by whom.
SELECT s.at, s.cluster, s.endpoint, s.stage, s.step, s.outcome, s.detail,
       r.run_key, r.dag_id, r.trigger, r.triggered_by
FROM step_events s
JOIN runs r ON r.run_key = s.run_key
WHERE s.endpoint IS NOT NULL
  AND (s.endpoint = :endpoint OR split_part(s.endpoint, '/', 2) = :endpoint)
  AND s.at >= :cutoff
  AND s.outcome <> 'unchanged'
ORDER BY s.at DESC
