-- Metrics (/kvfleet/metrics): every run the history records, counted by DAG and status (running, success,
-- failed, aborted). One row per (dag_id, status): bounded by kvfleet's DAGs and their statuses.
SELECT dag_id, status, count(*) AS runs
FROM runs
GROUP BY dag_id, status
ORDER BY dag_id, status
