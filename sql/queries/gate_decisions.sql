-- Human gate decisions since :cutoff (optionally of one run), newest first: who answered which gate with what
-- (the audit log's actor; 'timeout' when nobody answered and the gate took its default), what the wave's
-- verifications showed at that moment, and how long the gate waited (from the wave's gate step to the answer; with
-- gate=none, which records no gate step, from the wave's last step on that cluster).
SELECT r.at AS answered_at, r.run_key, r.cluster, r.task_id AS gate, r.map_index,
       r.detail->'waves' AS waves, r.detail->>'asked' AS asked, r.detail->>'chosen' AS chosen,
       r.outcome AS decision,
       COALESCE(r.detail->'responded_by'->>'name', a.actor, 'kvfleet') AS answered_by,
       (COALESCE(a.actor, '') = 'timeout' OR COALESCE((r.detail->>'timedout')::boolean, false)) AS timed_out,
       COALESCE(g.at, w.at) AS asked_at,
       round(CAST(EXTRACT(epoch FROM r.at - COALESCE(g.at, w.at)) AS numeric), 1) AS waited_s,
       g.outcome AS wave_verdict,
       COALESCE(g.detail->'verdicts', '{}'::jsonb) AS verdicts,
       v.verifications
FROM step_events r
LEFT JOIN audit_log a ON a.event_key = r.run_key || '|' || r.task_id || '|' || r.map_index || '|' || r.step
LEFT JOIN LATERAL (
    SELECT at, outcome, detail FROM step_events g
    WHERE g.run_key = r.run_key AND g.cluster IS NOT DISTINCT FROM r.cluster AND g.stage = 'gate'
      AND g.step LIKE 'gate:%' AND g.at <= r.at
    ORDER BY g.at DESC, g.id DESC LIMIT 1
) g ON true
LEFT JOIN LATERAL (
    SELECT max(w.at) AS at FROM step_events w
    WHERE w.run_key = r.run_key AND w.cluster IS NOT DISTINCT FROM r.cluster AND w.at <= r.at
      AND w.step NOT LIKE 'gate_response:%' AND w.id <> r.id
) w ON true
LEFT JOIN LATERAL (
    SELECT jsonb_object_agg(endpoint, jsonb_build_object('verdict', verdict, 'hit_ratio', hit_ratio,
                                                         'speedup', speedup, 'expected', expected_speedup))
           AS verifications
    FROM (SELECT DISTINCT ON (endpoint) endpoint, verdict, hit_ratio, speedup, expected_speedup
          FROM hit_verifications h
          WHERE h.run_key = r.run_key AND h.cluster = r.cluster AND h.at <= r.at
          ORDER BY endpoint, h.at DESC, h.id DESC) latest
) v ON true
WHERE r.stage = 'gate' AND r.step LIKE 'gate_response:%' AND r.at >= :cutoff
  AND (CAST(:run_key AS text) IS NULL OR r.run_key = :run_key)
ORDER BY r.at DESC, r.id DESC
LIMIT :limit
