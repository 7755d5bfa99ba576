-- Metrics (/kvfleet/metrics): verification verdicts per LOB. latest: the endpoints whose newest verification has
-- that verdict (endpoint_state, every endpoint, not only the ones a scrape lists); recorded: every verification the
-- history holds with that verdict (a counter: it only grows, until rows are pruned).
SELECT COALESCE(l.lob, r.lob) AS lob, COALESCE(l.verdict, r.verdict) AS verdict,
       COALESCE(l.endpoints, 0) AS latest, COALESCE(r.verifications, 0) AS recorded
FROM (SELECT COALESCE(v_lob, '') AS lob, v_verdict AS verdict, count(*) AS endpoints
      FROM endpoint_state WHERE v_id IS NOT NULL GROUP BY 1, 2) l
FULL JOIN (SELECT COALESCE(lob, '') AS lob, verdict, count(*) AS verifications
           FROM hit_verifications GROUP BY 1, 2) r ON r.lob = l.lob AND r.verdict = l.verdict
ORDER BY 1, 2
