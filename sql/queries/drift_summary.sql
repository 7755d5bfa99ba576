-- Drift findings seen since :cutoff per cluster (optionally one :clusters (a key and its older bare name: kvfleet.history.clusters)): seen, open, resolved, and the outcome
-- of their remediation. The kvfleet page's drift counts, without reading every finding: served from
-- drift_day_counts (per cluster and UTC day of last_seen, kept at write time; revision 0008) for the whole days
-- after :cutoff, and from drift_findings for the day :cutoff falls in.
WITH edge AS (
    SELECT CAST(:cutoff AS timestamptz) AS cutoff,
           kvfleet_utc_day(CAST(:cutoff AS timestamptz)) + 1 AS first_full_day,
           CAST(kvfleet_utc_day(CAST(:cutoff AS timestamptz)) + 1 AS timestamp) AT TIME ZONE 'UTC' AS first_full_at
), parts AS (
    SELECT d.cluster, d.seen, d.open, d.resolved, d.remediated, d.remediation_refused, d.remediation_failed
    FROM drift_day_counts d, edge
    WHERE d.day >= edge.first_full_day
      AND (CAST(:clusters AS text[]) IS NULL OR d.cluster = ANY(:clusters))
    UNION ALL
    SELECT f.cluster, 1, CAST(f.resolved_at IS NULL AS int), CAST(f.resolved_at IS NOT NULL AS int),
           CASE WHEN f.remediation->>'outcome' = 'changed' THEN 1 ELSE 0 END, CASE WHEN f.remediation->>'outcome' = 'refused' THEN 1 ELSE 0 END,
           CASE WHEN f.remediation->>'outcome' = 'failed' THEN 1 ELSE 0 END
    FROM drift_findings f, edge
    WHERE f.last_seen >= edge.cutoff AND f.last_seen < edge.first_full_at
      AND (CAST(:clusters AS text[]) IS NULL OR f.cluster = ANY(:clusters))
)
SELECT cluster, CAST(sum(seen) AS bigint) AS seen, CAST(sum(open) AS bigint) AS open,
       CAST(sum(resolved) AS bigint) AS resolved, CAST(sum(remediated) AS bigint) AS remediated,
       CAST(sum(remediation_refused) AS bigint) AS remediation_refused,
       CAST(sum(remediation_failed) AS bigint) AS remediation_failed
FROM parts
GROUP BY cluster
HAVING sum(seen) > 0
ORDER BY cluster
