-- The kvfleet page's Fleet view: every endpoint the history knows, per cluster and LOB, with its L2 state
-- (from its newest endpoint step and its open drift), its newest verification, its open drift and its newest
-- change. :clusters (a key and its older bare name: kvfleet.history.clusters) and :lob filter when not NULL.
-- Read from endpoint_state (one row per endpoint, kept at write time; revision 0009): an endpoint is listed
-- when it has an endpoint step (not a plan), a verification or open drift. Endpoint steps recorded without a
-- cluster or an endpoint (kvfleet records none) are listed from the history, as before, with nothing joined.
SELECT s.cluster, s.endpoint, COALESCE(s.ep_lob, s.v_lob, s.drift_lob) AS lob,
       CASE
           WHEN s.open_drift > 0 THEN 'drifted'
           WHEN s.ep_outcome IN ('changed', 'unchanged') THEN 'applied'
           WHEN s.ep_outcome IN ('failed', 'refused') THEN 'failed'
           WHEN s.ep_outcome IS NOT NULL THEN 'not applied'
           ELSE 'unknown'
       END AS l2_state,
       s.ep_outcome AS endpoint_outcome, s.ep_at AS endpoint_at,
       s.v_verdict AS last_verdict, s.v_hit_ratio AS hit_ratio, s.v_speedup AS speedup,
       s.v_expected_speedup AS expected_speedup, s.v_prompt_tokens AS prompt_tokens,
       s.v_instance_type AS instance_type, s.v_diagnosis AS diagnosis, s.v_at AS verified_at,
       s.open_drift, s.drift_kinds, s.drift_since,
       s.change_at AS last_change_at, s.change_stage AS last_change_stage, s.change_outcome AS last_change_outcome,
       s.change_run_key AS last_change_run
FROM endpoint_state s
WHERE (s.ep_id IS NOT NULL OR s.v_id IS NOT NULL OR s.open_drift > 0)
  AND (CAST(:clusters AS text[]) IS NULL OR s.cluster = ANY(:clusters))
  AND (CAST(:lob AS text) IS NULL OR COALESCE(s.ep_lob, s.v_lob, s.drift_lob) = :lob)
UNION ALL
SELECT k.cluster, k.endpoint, CAST(NULL AS text), 'unknown', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, CAST(0 AS bigint), NULL, NULL, NULL, NULL, NULL, NULL
FROM (SELECT DISTINCT cluster, endpoint FROM step_events
      WHERE stage = 'endpoint' AND step LIKE 'endpoint:%' AND outcome <> 'planned'
        AND (cluster IS NULL OR endpoint IS NULL)) k
WHERE (CAST(:clusters AS text[]) IS NULL OR k.cluster = ANY(:clusters))
  AND CAST(:lob AS text) IS NULL
ORDER BY 1, 3, 2
