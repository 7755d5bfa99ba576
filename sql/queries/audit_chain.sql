-- The audit log in chain order with each row's canonical JSON, rebuilt here (not by the database's
-- kvfleet_audit_canonical function, which the owner could replace): `kvfleet audit verify` hashes it.
SELECT id, seq, event_key, prev_hash, row_hash,
       jsonb_build_object(
           'seq', seq, 'run_key', run_key, 'event_key', event_key, 'actor', actor, 'action', action,
           'cluster', cluster, 'endpoint', endpoint, 'detail', detail, 'kind', kind, 'intent_id', intent_id,
           'at', to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))::text AS canonical
FROM audit_log
ORDER BY seq NULLS FIRST, id
