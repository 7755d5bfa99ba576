-- The L2 advisor's newest report per cluster since :cutoff (the kvfleet page's Advisor view): the
-- `advise:<cluster>` step kvfleet_hit_verification records (kvfleet.airflow.verification.advise_cluster), with its
-- per-endpoint verdicts and the cluster's capacity recommendation in detail. :cluster filters when not NULL.
SELECT DISTINCT ON (cluster) at, cluster, step, outcome, detail, run_key
FROM step_events
WHERE stage = 'advise' AND step LIKE 'advise:%' AND at >= :cutoff
  AND (CAST(:cluster AS text) IS NULL OR cluster = :cluster)
ORDER BY cluster, at DESC, id DESC
