-- Cross-pod hit verifications since :cutoff, optionally for one LOB or endpoint, with the run that made each
-- (run: the DAG, i.e. a rollout's gate or the hourly check; run_key: the exact run).
SELECT at, cluster, endpoint, lob, prompt_tokens, stored_tokens, hit_tokens, hit_ratio, l2_read_ms,
       ttft_cold_ms, ttft_warm_ms, speedup, expected_speedup, verdict, diagnosis,
       split_part(run_key, '/', 1) AS run, run_key
FROM hit_verifications
WHERE at >= :cutoff
  AND (CAST(:lob AS text) IS NULL OR lob = :lob)
  AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint OR split_part(endpoint, '/', 2) = :endpoint)
ORDER BY at DESC
