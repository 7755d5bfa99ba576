-- Every cluster the history knows, with its newest recorded activity (the kvfleet page's cluster picker).
SELECT cluster, max(at) AS last_seen
FROM (
    SELECT cluster, at FROM step_events WHERE cluster IS NOT NULL
    UNION ALL
    SELECT cluster, at FROM hit_verifications
    UNION ALL
    SELECT cluster, recorded_at AS at FROM curvine_releases
    UNION ALL
    SELECT cluster, at FROM capacity_snapshots
    UNION ALL
    SELECT cluster, last_seen AS at FROM drift_findings
) seen
GROUP BY cluster
ORDER BY cluster
