-- Cross-pod hit verifications since :cutoff, optionally for one LOB or endpoint.
SELECT at, cluster, endpoint, lob, prompt_tokens, stored_tokens, hit_tokens, hit_ratio, l2_read_ms,
       ttft_cold_ms, ttft_warm_ms, speedup, expected_speedup, verdict, diagnosis, run_key
FROM hit_verifications
WHERE at >= :cutoff
  AND (CAST(:lob AS text) IS NULL OR lob = :lob)
  AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint OR split_part(endpoint, '/', 2) = :endpoint)
ORDER BY at DESC
