-- One page of `open_drift`: drift open now, oldest first, at most :limit rows after the cursor
-- (:after_first_seen, :after_cluster, :after_kind, :after_id: the last row of the previous page; NULL for the
-- first page). `kvfleet audit drift --open` pages with --limit / --after. :clusters (a key and its older bare name: kvfleet.history.clusters) keeps one cluster and :cutoff
-- the findings seen since then, when not NULL.
SELECT cluster, lob, endpoint, kind, severity, object_ref, field, expected, actual,
       first_seen, last_seen, now() - first_seen AS open_for,
       remediation->>'action' AS remediation_action, remediation->>'outcome' AS remediation_outcome, remediation, id
FROM drift_findings
WHERE resolved_at IS NULL
  AND (CAST(:cutoff AS timestamptz) IS NULL OR last_seen >= :cutoff)
  AND (CAST(:clusters AS text[]) IS NULL OR cluster = ANY(:clusters))
  AND (CAST(:after_first_seen AS timestamptz) IS NULL
       OR (first_seen, cluster, kind, id) > (CAST(:after_first_seen AS timestamptz), CAST(:after_cluster AS text),
                                             CAST(:after_kind AS text), CAST(:after_id AS bigint)))
ORDER BY first_seen, cluster, kind, id
LIMIT :limit
