-- Open drift per line of business and cluster, worst first: what the drift check's summary prints.
SELECT coalesce(lob, '(cluster)') AS lob, cluster, kind, severity, object_ref, field, expected, actual,
       first_seen, last_seen, remediation
FROM drift_findings
WHERE resolved_at IS NULL
ORDER BY coalesce(lob, '(cluster)'), cluster,
         CASE severity WHEN 'critical' THEN 0 WHEN 'high' THEN 1 WHEN 'medium' THEN 2 ELSE 3 END, kind, object_ref
