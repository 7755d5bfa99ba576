-- The exact actions a dry run would take, per cluster and endpoint, in the order they were planned.
SELECT cluster, endpoint, stage, detail->>'action' AS action, detail->>'diff' AS diff
FROM step_events
WHERE run_key = :run_key AND outcome = 'planned' AND step LIKE 'planned:%'
ORDER BY cluster, task_id, map_index, step
