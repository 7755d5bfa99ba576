-- Metrics (/kvfleet/metrics): per cluster, the newest pause or restore of the inference operator the history
-- records (stage 'operator': operator_pause:<holder>, operator_restore:<holder>, teardown_restore:<cluster>, that
-- changed something). A cluster whose newest one is a pause is paused since its time; a failed restore
-- (outcome 'failed') leaves the pause the newest change.
SELECT DISTINCT ON (cluster) cluster, starts_with(step, 'operator_pause:') AS paused, at, run_key
FROM step_events
WHERE stage = 'operator' AND outcome = 'changed' AND cluster IS NOT NULL
  AND (starts_with(step, 'operator_pause:') OR starts_with(step, 'operator_restore:')
       OR starts_with(step, 'teardown_restore:'))
ORDER BY cluster, at DESC, id DESC
