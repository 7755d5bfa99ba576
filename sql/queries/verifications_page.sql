-- One page of `verifications`: cross-pod hit verifications since :cutoff, optionally for one LOB, cluster or
-- endpoint, newest first, at most :limit rows after the cursor (:after_at, :after_id: the last row of the
-- previous page; NULL for the first page). `kvfleet audit verifications` pages with --limit / --after.
SELECT at, cluster, endpoint, lob, prompt_tokens, stored_tokens, hit_tokens, hit_ratio, l2_read_ms,
       ttft_cold_ms, ttft_warm_ms, speedup, expected_speedup, verdict, diagnosis,
       split_part(run_key, '/', 1) AS run, run_key, id
FROM hit_verifications
WHERE at >= :cutoff
  AND (CAST(:lob AS text) IS NULL OR lob = :lob)
  AND (CAST(:clusters AS text[]) IS NULL OR cluster = ANY(:clusters))
  AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint OR split_part(endpoint, '/', 2) = :endpoint)
  AND (CAST(:after_at AS timestamptz) IS NULL
       OR (at, id) < (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint)))
ORDER BY at DESC, id DESC
LIMIT :limit
