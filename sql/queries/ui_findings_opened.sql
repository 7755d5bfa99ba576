-- The drift findings one check (:run_key) opened on :clusters (a key and its older bare name: kvfleet.history.clusters), worst first: the drift notification names them
-- (kvfleet.airflow.notify), so an operator paused past its threshold or a Curvine data loss reads as such.
SELECT fingerprint, kind, severity, lob, endpoint, object_ref, field, expected, actual, first_seen
FROM drift_findings
WHERE cluster = ANY(:clusters) AND first_run_key = :run_key
ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'high' THEN 1 WHEN 'medium' THEN 2 ELSE 3 END, kind, id
