-- The kvfleet page's Fleet view: every endpoint the history knows, per cluster and LOB, with its L2 state
-- (from its newest endpoint step and its open drift), its newest verification, its open drift and its newest
-- change. :cluster and :lob filter when not NULL.
WITH ep AS (
    SELECT DISTINCT ON (cluster, endpoint) cluster, endpoint, lob, outcome, at, run_key
    FROM step_events
    WHERE stage = 'endpoint' AND step LIKE 'endpoint:%' AND outcome <> 'planned'
    ORDER BY cluster, endpoint, id DESC
), v AS (
    SELECT DISTINCT ON (cluster, endpoint) cluster, endpoint, lob, instance_type, prompt_tokens, verdict,
           hit_ratio, speedup, expected_speedup, diagnosis, at, run_key
    FROM hit_verifications
    ORDER BY cluster, endpoint, id DESC
), d AS (
    SELECT cluster, endpoint, max(lob) AS lob, count(*) AS open_drift, min(first_seen) AS drift_since,
           string_agg(DISTINCT kind, ', ' ORDER BY kind) AS drift_kinds
    FROM drift_findings
    WHERE resolved_at IS NULL AND endpoint IS NOT NULL
    GROUP BY cluster, endpoint
), c AS (
    SELECT DISTINCT ON (cluster, endpoint) cluster, endpoint, at, stage, step, outcome, run_key
    FROM step_events
    WHERE endpoint IS NOT NULL AND outcome NOT IN ('unchanged', 'planned', 'passed')
    ORDER BY cluster, endpoint, at DESC, id DESC
), keys AS (
    SELECT cluster, endpoint FROM ep UNION SELECT cluster, endpoint FROM v UNION SELECT cluster, endpoint FROM d
)
SELECT k.cluster, k.endpoint, COALESCE(ep.lob, v.lob, d.lob) AS lob,
       CASE
           WHEN COALESCE(d.open_drift, 0) > 0 THEN 'drifted'
           WHEN ep.outcome IN ('changed', 'unchanged') THEN 'applied'
           WHEN ep.outcome IN ('failed', 'refused') THEN 'failed'
           WHEN ep.outcome IS NOT NULL THEN 'not applied'
           ELSE 'unknown'
       END AS l2_state,
       ep.outcome AS endpoint_outcome, ep.at AS endpoint_at,
       v.verdict AS last_verdict, v.hit_ratio, v.speedup, v.expected_speedup, v.prompt_tokens, v.instance_type,
       v.diagnosis, v.at AS verified_at,
       COALESCE(d.open_drift, 0) AS open_drift, d.drift_kinds, d.drift_since,
       c.at AS last_change_at, c.stage AS last_change_stage, c.outcome AS last_change_outcome,
       c.run_key AS last_change_run
FROM keys k
LEFT JOIN ep ON ep.cluster = k.cluster AND ep.endpoint = k.endpoint
LEFT JOIN v ON v.cluster = k.cluster AND v.endpoint = k.endpoint
LEFT JOIN d ON d.cluster = k.cluster AND d.endpoint = k.endpoint
LEFT JOIN c ON c.cluster = k.cluster AND c.endpoint = k.endpoint
WHERE (CAST(:cluster AS text) IS NULL OR k.cluster = :cluster)
  AND (CAST(:lob AS text) IS NULL OR COALESCE(ep.lob, v.lob, d.lob) = :lob)
ORDER BY k.cluster, COALESCE(ep.lob, v.lob, d.lob), k.endpoint
