-- ui_fleet as it was before revision 0009 (read from the history itself): the reference test_history_rollups.py
-- compares the summary-backed ui_fleet with, over the same rows.
-- The kvfleet page's Fleet view: every endpoint the history knows, per cluster and LOB, with its L2 state
-- (from its newest endpoint step and its open drift), its newest verification, its open drift and its newest
-- change. :cluster and :lob filter when not NULL.
-- The endpoints are found by walking the (cluster, endpoint) indexes one endpoint at a time (a loose index scan),
-- and each endpoint's newest step, verification and change is one index probe: the view reads a few rows per
-- endpoint, not the whole history.
WITH RECURSIVE hv_keys AS (
    (SELECT cluster, endpoint FROM hit_verifications ORDER BY cluster, endpoint LIMIT 1)
    UNION ALL
    SELECT n.cluster, n.endpoint
    FROM hv_keys k
    CROSS JOIN LATERAL (
        SELECT x.cluster, x.endpoint FROM hit_verifications x
        WHERE (x.cluster, x.endpoint) > (k.cluster, k.endpoint)
        ORDER BY x.cluster, x.endpoint LIMIT 1
    ) n
), ep_keys AS (
    (SELECT cluster, endpoint FROM step_events
     WHERE stage = 'endpoint' AND step LIKE 'endpoint:%' AND outcome <> 'planned'
       AND cluster IS NOT NULL AND endpoint IS NOT NULL
     ORDER BY cluster, endpoint LIMIT 1)
    UNION ALL
    SELECT n.cluster, n.endpoint
    FROM ep_keys k
    CROSS JOIN LATERAL (
        SELECT x.cluster, x.endpoint FROM step_events x
        WHERE x.stage = 'endpoint' AND x.step LIKE 'endpoint:%' AND x.outcome <> 'planned'
          AND (x.cluster, x.endpoint) > (k.cluster, k.endpoint)
        ORDER BY x.cluster, x.endpoint LIMIT 1
    ) n
), keys AS (
    SELECT cluster, endpoint FROM ep_keys
    UNION
    -- endpoint steps with no cluster or no endpoint, which the walk cannot step over (none are recorded)
    SELECT cluster, endpoint FROM step_events
    WHERE stage = 'endpoint' AND step LIKE 'endpoint:%' AND outcome <> 'planned'
      AND (cluster IS NULL OR endpoint IS NULL)
    UNION
    SELECT cluster, endpoint FROM hv_keys  -- hit_verifications' cluster and endpoint are NOT NULL
    UNION
    SELECT cluster, endpoint FROM drift_findings WHERE resolved_at IS NULL AND endpoint IS NOT NULL
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
LEFT JOIN LATERAL (
    SELECT e.lob, e.outcome, e.at, e.run_key FROM step_events e
    WHERE e.cluster = k.cluster AND e.endpoint = k.endpoint
      AND e.stage = 'endpoint' AND e.step LIKE 'endpoint:%' AND e.outcome <> 'planned'
    ORDER BY e.id DESC LIMIT 1
) ep ON true
LEFT JOIN LATERAL (
    SELECT h.lob, h.instance_type, h.prompt_tokens, h.verdict, h.hit_ratio, h.speedup, h.expected_speedup,
           h.diagnosis, h.at
    FROM hit_verifications h
    WHERE h.cluster = k.cluster AND h.endpoint = k.endpoint
    ORDER BY h.id DESC LIMIT 1
) v ON true
LEFT JOIN LATERAL (
    SELECT max(f.lob) AS lob, count(*) AS open_drift, min(f.first_seen) AS drift_since,
           string_agg(DISTINCT f.kind, ', ' ORDER BY f.kind) AS drift_kinds
    FROM drift_findings f
    WHERE f.resolved_at IS NULL AND f.cluster = k.cluster AND f.endpoint = k.endpoint
) d ON true
LEFT JOIN LATERAL (
    SELECT s.at, s.stage, s.outcome, s.run_key FROM step_events s
    WHERE s.cluster = k.cluster AND s.endpoint = k.endpoint
      AND s.outcome NOT IN ('unchanged', 'planned', 'passed')
    ORDER BY s.at DESC, s.id DESC LIMIT 1
) c ON true
WHERE (CAST(:cluster AS text) IS NULL OR k.cluster = :cluster)
  AND (CAST(:lob AS text) IS NULL OR COALESCE(ep.lob, v.lob, d.lob) = :lob)
ORDER BY k.cluster, COALESCE(ep.lob, v.lob, d.lob), k.endpoint
