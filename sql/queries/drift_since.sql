-- Every finding seen since :cutoff (open or resolved).
SELECT cluster, lob, endpoint, kind, severity, object_ref, field, expected, actual,
       first_seen, last_seen, resolved_at, resolution,
       remediation->>'action' AS remediation_action, remediation->>'outcome' AS remediation_outcome, remediation
FROM drift_findings
WHERE last_seen >= :cutoff
ORDER BY first_seen DESC
