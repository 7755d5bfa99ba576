-- How many times each kind of drift was opened per cluster since :cutoff. One event = one endpoint (or object)
-- in one check, however many fields of it drifted: a re-render that drops both the volume and the mount is
-- one patch loss, not two.
-- The events are grouped first (a hash aggregate over the covering index drift_findings_kind_first_seen_cover,
-- revision 0008), then counted: the same figures as count(DISTINCT (object, run)), without sorting row values.
SELECT cluster, kind, count(*) AS occurrences, min(first_seen) AS first_seen, max(last_opened) AS last_opened
FROM (
    SELECT cluster, kind, coalesce(endpoint, object_ref) AS object, first_run_key,
           min(first_seen) AS first_seen, max(first_seen) AS last_opened
    FROM drift_findings
    WHERE first_seen >= :cutoff AND kind = :kind
    GROUP BY cluster, kind, coalesce(endpoint, object_ref), first_run_key
) events
GROUP BY cluster, kind
ORDER BY cluster, kind
