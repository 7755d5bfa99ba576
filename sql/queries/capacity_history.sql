-- Curvine capacity snapshots of one cluster.
SELECT at, cluster, phase, step, capacity_bytes, fs_used_bytes, live_workers, lost_workers, files_total, run_key
FROM capacity_snapshots
WHERE cluster = ANY(:clusters)
ORDER BY at
