-- Drift that is open now, oldest first, and how long it has been open.
SELECT cluster, lob, endpoint, kind, severity, object_ref, field, expected, actual,
       first_seen, last_seen, now() - first_seen AS open_for,
       remediation->>'action' AS remediation_action, remediation->>'outcome' AS remediation_outcome, remediation
FROM drift_findings
WHERE resolved_at IS NULL
ORDER BY first_seen, cluster, kind
