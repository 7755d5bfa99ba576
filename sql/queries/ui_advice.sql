-- The L2 advisor's reports since :cutoff, newest first (the kvfleet page's Advisor view): the `advise:<cluster>`
-- steps kvfleet_hit_verification records (kvfleet.airflow.verification.advise_cluster), with the per-endpoint
-- verdicts and the cluster's capacity recommendation in detail. The page keeps each endpoint's newest advice (a
-- run scoped to some endpoints reports only those). :clusters (a key and its older bare name: kvfleet.history.clusters) filters when not NULL.
SELECT at, cluster, step, outcome, detail, run_key
FROM step_events
WHERE stage = 'advise' AND step LIKE 'advise:%' AND at >= :cutoff
  AND (CAST(:clusters AS text[]) IS NULL OR cluster = ANY(:clusters))
ORDER BY at DESC, id DESC
LIMIT :limit
