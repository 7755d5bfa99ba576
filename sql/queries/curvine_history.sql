-- Curvine release history of one cluster, with the format flags at every revision.
SELECT cluster, namespace, release, revision, chart_version, status,
       format_master, format_worker, format_journal, recorded_at, run_key
FROM curvine_releases
WHERE cluster = ANY(:clusters)
ORDER BY release, revision
