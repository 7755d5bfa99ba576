-- One endpoint's cross-pod verifications on one cluster since :cutoff, oldest first: the kvfleet page's trend
-- plots and its speedup-vs-prompt-length points (a sweep writes one row per prompt length).
SELECT at, cluster, endpoint, lob, instance_type, prompt_tokens, hit_ratio, ttft_cold_ms, ttft_warm_ms, speedup,
       expected_speedup, verdict, diagnosis, run_key
FROM hit_verifications
WHERE cluster = ANY(:clusters)
  AND (endpoint = :endpoint OR split_part(endpoint, '/', 2) = :endpoint)
  AND at >= :cutoff
ORDER BY at, id
