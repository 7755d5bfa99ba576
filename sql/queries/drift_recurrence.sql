-- How many times each kind of drift was opened per cluster since :cutoff. One event = one endpoint (or object)
-- in one check, however many fields of it drifted: a re-render that drops both the volume and the mount is
-- one patch loss, not two.
SELECT cluster, kind, count(DISTINCT (coalesce(endpoint, object_ref), first_run_key)) AS occurrences,
       min(first_seen) AS first_seen, max(first_seen) AS last_opened
FROM drift_findings
WHERE first_seen >= :cutoff AND kind = :kind
GROUP BY cluster, kind
ORDER BY cluster, kind
