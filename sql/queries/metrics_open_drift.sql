-- Metrics (/kvfleet/metrics): the open drift findings (not resolved), counted by cluster, kind and LOB ('' when a
-- finding belongs to no LOB, e.g. the inference operator's), with the first_seen of the oldest one.
SELECT cluster, kind, COALESCE(lob, '') AS lob, count(*) AS findings, min(first_seen) AS oldest
FROM drift_findings
WHERE resolved_at IS NULL
GROUP BY cluster, kind, COALESCE(lob, '')
ORDER BY cluster, kind, lob
