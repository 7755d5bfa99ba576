-- Hit ratio and TTFT speedup per LOB per week.
SELECT lob, date_trunc('week', at) AS week, COUNT(*) AS verifications,
       AVG(hit_ratio) AS avg_hit_ratio, AVG(speedup) AS avg_speedup,
       AVG(expected_speedup) AS avg_expected_speedup,
       COUNT(*) FILTER (WHERE verdict = 'pass') AS passed
FROM hit_verifications
WHERE at >= :cutoff
GROUP BY lob, week
ORDER BY week DESC, lob
