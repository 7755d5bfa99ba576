-- Metrics (/kvfleet/metrics): the human gates answered (gate_response steps), by cluster ('' when none) and
-- decision, with how long they waited in total: from the wave's gate step (gate:<wave>) of the same run and cluster
-- to the answer, 0 for a gate with no gate step before it (a Curvine approval, gate=none).
SELECT COALESCE(r.cluster, '') AS cluster, r.outcome AS decision, count(*) AS answered,
       COALESCE(sum(EXTRACT(epoch FROM r.at - g.at)), 0)::double precision AS waited_s
FROM step_events r
LEFT JOIN LATERAL (
    SELECT g.at FROM step_events g
    WHERE g.run_key = r.run_key AND g.cluster IS NOT DISTINCT FROM r.cluster AND g.stage = 'gate'
      AND starts_with(g.step, 'gate:') AND g.at <= r.at
    ORDER BY g.at DESC, g.id DESC LIMIT 1
) g ON true
WHERE r.stage = 'gate' AND starts_with(r.step, 'gate_response:')
GROUP BY 1, 2
ORDER BY 1, 2
