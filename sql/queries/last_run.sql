-- The newest run of a DAG.
SELECT run_key, dag_id, run_id, trigger, triggered_by, status, started_at, ended_at, summary
FROM runs WHERE dag_id = :dag_id ORDER BY started_at DESC LIMIT 1
