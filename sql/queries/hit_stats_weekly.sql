-- Hit ratio and TTFT speedup per LOB per week.
-- Served from hit_stats_buckets (counts and sums per LOB and quarter hour, kept at write time; revision 0008):
-- the whole quarter hours since :cutoff come from the buckets, the rows of the quarter hour :cutoff falls in
-- from hit_verifications, so the figures are those of every verification since :cutoff.
WITH edge AS (
    SELECT CAST(:cutoff AS timestamptz) AS cutoff,
           to_timestamp(CAST(ceil(extract(epoch FROM CAST(:cutoff AS timestamptz)) / 900) * 900
                             AS double precision)) AS first_full
), parts AS (
    SELECT b.lob, b.bucket AS at, b.verifications, b.passed, b.hit_ratio_sum, b.hit_ratio_n, b.speedup_sum,
           b.speedup_n, b.expected_sum, b.expected_n
    FROM hit_stats_buckets b, edge
    WHERE b.bucket >= edge.first_full
    UNION ALL
    SELECT h.lob, h.at, 1, CAST(h.verdict = 'pass' AS int), coalesce(h.hit_ratio, 0),
           CAST(h.hit_ratio IS NOT NULL AS int), coalesce(h.speedup, 0), CAST(h.speedup IS NOT NULL AS int),
           coalesce(h.expected_speedup, 0), CAST(h.expected_speedup IS NOT NULL AS int)
    FROM hit_verifications h, edge
    WHERE h.at >= edge.cutoff AND h.at < edge.first_full
)
SELECT lob, date_trunc('week', at) AS week, sum(verifications) AS verifications,
       sum(hit_ratio_sum) / CAST(NULLIF(sum(hit_ratio_n), 0) AS double precision) AS avg_hit_ratio,
       sum(speedup_sum) / CAST(NULLIF(sum(speedup_n), 0) AS double precision) AS avg_speedup,
       sum(expected_sum) / CAST(NULLIF(sum(expected_n), 0) AS double precision) AS avg_expected_speedup,
       sum(passed) AS passed
FROM parts
GROUP BY lob, week
HAVING sum(verifications) > 0
ORDER BY week DESC, lob
