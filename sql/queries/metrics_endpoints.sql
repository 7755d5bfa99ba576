-- Metrics (/kvfleet/metrics): each endpoint's newest verification (endpoint_state, kept at write time), the most
-- recently verified first, at most :limit of them; total is the number of verified endpoints (all of them), so a
-- scrape can say how many it left out.
SELECT cluster, endpoint, COALESCE(v_lob, '') AS lob, v_verdict AS verdict, v_hit_ratio AS hit_ratio,
       v_speedup AS speedup, v_expected_speedup AS expected_speedup, v_at AS verified_at,
       count(*) OVER () AS total
FROM endpoint_state
WHERE v_id IS NOT NULL
ORDER BY v_at DESC, cluster, endpoint
LIMIT :limit
