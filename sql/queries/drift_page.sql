-- One page of `drift_since`: findings seen since :cutoff (open or resolved), optionally on one :clusters (a key and its older bare name: kvfleet.history.clusters), newest
-- first_seen first, at most :limit rows after the cursor (:after_first_seen, :after_id: the last row of the
-- previous page; NULL for the first page). `kvfleet audit drift` pages with --limit / --after.
SELECT cluster, lob, endpoint, kind, severity, object_ref, field, expected, actual,
       first_seen, last_seen, resolved_at, resolution,
       remediation->>'action' AS remediation_action, remediation->>'outcome' AS remediation_outcome, remediation, id
FROM drift_findings
WHERE last_seen >= :cutoff
  AND (CAST(:clusters AS text[]) IS NULL OR cluster = ANY(:clusters))
  AND (CAST(:after_first_seen AS timestamptz) IS NULL
       OR (first_seen, id) < (CAST(:after_first_seen AS timestamptz), CAST(:after_id AS bigint)))
ORDER BY first_seen DESC, id DESC
LIMIT :limit
