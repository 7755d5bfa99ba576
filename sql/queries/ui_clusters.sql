-- Every cluster the history knows, with its newest recorded activity (the kvfleet page's cluster picker).
-- Each table's distinct clusters are walked through its (cluster, time) index one cluster at a time (a
-- loose index scan), and each cluster's newest time read from the same index: a few hundred index probes
-- instead of reading every row of the history.
WITH RECURSIVE se AS (
    (SELECT cluster FROM step_events WHERE cluster IS NOT NULL ORDER BY cluster LIMIT 1)
    UNION ALL
    SELECT (SELECT x.cluster FROM step_events x WHERE x.cluster > se.cluster ORDER BY x.cluster LIMIT 1)
    FROM se WHERE se.cluster IS NOT NULL
), hv AS (
    (SELECT cluster FROM hit_verifications WHERE cluster IS NOT NULL ORDER BY cluster LIMIT 1)
    UNION ALL
    SELECT (SELECT x.cluster FROM hit_verifications x WHERE x.cluster > hv.cluster ORDER BY x.cluster LIMIT 1)
    FROM hv WHERE hv.cluster IS NOT NULL
), cr AS (
    (SELECT cluster FROM curvine_releases WHERE cluster IS NOT NULL ORDER BY cluster LIMIT 1)
    UNION ALL
    SELECT (SELECT x.cluster FROM curvine_releases x WHERE x.cluster > cr.cluster ORDER BY x.cluster LIMIT 1)
    FROM cr WHERE cr.cluster IS NOT NULL
), cs AS (
    (SELECT cluster FROM capacity_snapshots WHERE cluster IS NOT NULL ORDER BY cluster LIMIT 1)
    UNION ALL
    SELECT (SELECT x.cluster FROM capacity_snapshots x WHERE x.cluster > cs.cluster ORDER BY x.cluster LIMIT 1)
    FROM cs WHERE cs.cluster IS NOT NULL
), df AS (
    (SELECT cluster FROM drift_findings WHERE cluster IS NOT NULL ORDER BY cluster LIMIT 1)
    UNION ALL
    SELECT (SELECT x.cluster FROM drift_findings x WHERE x.cluster > df.cluster ORDER BY x.cluster LIMIT 1)
    FROM df WHERE df.cluster IS NOT NULL
)
SELECT cluster, max(at) AS last_seen
FROM (
    SELECT cluster, (SELECT max(x.at) FROM step_events x WHERE x.cluster = se.cluster) AS at
    FROM se WHERE cluster IS NOT NULL
    UNION ALL
    SELECT cluster, (SELECT max(x.at) FROM hit_verifications x WHERE x.cluster = hv.cluster) AS at
    FROM hv WHERE cluster IS NOT NULL
    UNION ALL
    SELECT cluster, (SELECT max(x.recorded_at) FROM curvine_releases x WHERE x.cluster = cr.cluster) AS at
    FROM cr WHERE cluster IS NOT NULL
    UNION ALL
    SELECT cluster, (SELECT max(x.at) FROM capacity_snapshots x WHERE x.cluster = cs.cluster) AS at
    FROM cs WHERE cluster IS NOT NULL
    UNION ALL
    SELECT cluster, (SELECT max(x.last_seen) FROM drift_findings x WHERE x.cluster = df.cluster) AS at
    FROM df WHERE cluster IS NOT NULL
) seen
GROUP BY cluster
ORDER BY cluster
