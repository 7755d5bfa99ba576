-- Per-LOB summary of one rollout run: endpoints moved, unchanged, skipped, failed, and verification figures.
-- :lob keeps one line of business when not NULL (`kvfleet audit rollout --lob`).
WITH ep AS (
    SELECT DISTINCT ON (cluster, endpoint) cluster, endpoint, lob, outcome
    FROM step_events
    WHERE run_key = :run_key AND stage = 'endpoint' AND step LIKE 'endpoint:%'
    ORDER BY cluster, endpoint, id DESC
), v AS (
    SELECT DISTINCT ON (cluster, endpoint) cluster, endpoint, lob, verdict, hit_ratio, speedup, expected_speedup
    FROM hit_verifications
    WHERE run_key = :run_key
    ORDER BY cluster, endpoint, id DESC
)
SELECT COALESCE(ep.lob, v.lob) AS lob,
       COUNT(*) FILTER (WHERE ep.outcome = 'changed') AS moved,
       COUNT(*) FILTER (WHERE ep.outcome = 'unchanged') AS unchanged,
       COUNT(*) FILTER (WHERE ep.outcome IN ('skipped', 'skipped_by_gate', 'paused_for_review', 'aborted', 'frozen',
                                            'stopped')) AS skipped,
       COUNT(*) FILTER (WHERE ep.outcome IN ('failed', 'refused')) AS failed,
       COUNT(v.verdict) FILTER (WHERE v.verdict = 'pass') AS verified_pass,
       COUNT(v.verdict) FILTER (WHERE v.verdict <> 'pass') AS verified_other,
       AVG(v.hit_ratio) AS avg_hit_ratio,
       AVG(v.speedup) AS avg_speedup,
       AVG(v.expected_speedup) AS avg_expected
FROM ep FULL OUTER JOIN v ON v.cluster = ep.cluster AND v.endpoint = ep.endpoint
GROUP BY 1
HAVING CAST(:lob AS text) IS NULL OR COALESCE(ep.lob, v.lob) = :lob
ORDER BY 1
