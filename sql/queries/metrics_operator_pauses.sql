-- Metrics (/kvfleet/metrics): per cluster, the newest pause or restore of the inference operator the history
-- records (stage 'operator': operator_pause:<holder>, operator_restore:<holder>, teardown_restore:<cluster>, that
-- changed something), and how long ago it was by the database's clock. A cluster whose newest one is a pause is
-- paused since then; a failed restore (outcome 'failed') leaves the pause the newest change.
SELECT DISTINCT ON (cluster) cluster, starts_with(step, 'operator_pause:') AS paused, at,
       EXTRACT(epoch FROM now() - at)::double precision AS since_s, run_key
FROM step_events
WHERE stage = 'operator' AND outcome = 'changed' AND cluster IS NOT NULL
  AND (starts_with(step, 'operator_pause:') OR starts_with(step, 'operator_restore:')
       OR starts_with(step, 'teardown_restore:'))
ORDER BY cluster, at DESC, id DESC
