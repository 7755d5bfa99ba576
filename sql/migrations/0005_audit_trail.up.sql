-- kvfleet history schema, revision 0005: an audit history you can trust.
--   runs.reason                      why a run ended as it did (a plan refusal's message, the failed task)
--   audit_log.kind / intent_id       write-ahead records: an 'intent' row before each mutating call, an
--                                    'outcome' row (pointing at its intent) after it
--   audit_log.seq/prev_hash/row_hash a SHA-256 hash chain computed on INSERT by a trigger
--   drift_findings.resolution        'gone' (a later check no longer saw it) or 'remediated' (fixed by the run)
-- and the writer role's grants: INSERT and SELECT on audit_log only (see docs/run-for-real.md).

ALTER TABLE runs ADD COLUMN reason text;
COMMENT ON COLUMN runs.status IS
    'running | success | completed_with_failures | failed | aborted | refused';

ALTER TABLE drift_findings ADD COLUMN resolution text;

ALTER TABLE audit_log ADD COLUMN kind text NOT NULL DEFAULT 'event';   -- event | intent | outcome
ALTER TABLE audit_log ADD COLUMN intent_id bigint REFERENCES audit_log(id);
ALTER TABLE audit_log ADD COLUMN seq bigint;
ALTER TABLE audit_log ADD COLUMN prev_hash text;
ALTER TABLE audit_log ADD COLUMN row_hash text;
CREATE INDEX audit_log_intent ON audit_log (intent_id) WHERE intent_id IS NOT NULL;
CREATE INDEX audit_log_open_intents ON audit_log (cluster, endpoint) WHERE kind = 'intent';
CREATE INDEX audit_log_run ON audit_log (run_key);

-- The canonical JSON of a row: PostgreSQL's jsonb text form (keys in a fixed order, fixed spacing) of the
-- columns that carry meaning, with the time in UTC. `kvfleet audit verify` recomputes it with its own SQL
-- (sql/queries/audit_chain.sql), not with this function.
CREATE FUNCTION kvfleet_audit_canonical(r audit_log) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'seq', r.seq, 'run_key', r.run_key, 'event_key', r.event_key, 'actor', r.actor, 'action', r.action,
        'cluster', r.cluster, 'endpoint', r.endpoint, 'detail', r.detail, 'kind', r.kind,
        'intent_id', r.intent_id,
        'at', to_char(r.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))::text
$$;

-- Rows written before this revision are chained first, in id order, from the genesis hash (64 zeros).
DO $$
DECLARE
    r audit_log;
    prev text := repeat('0', 64);
    n bigint := 0;
BEGIN
    ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only;
    FOR r IN SELECT * FROM audit_log ORDER BY id LOOP
        n := n + 1;
        r.seq := n;
        UPDATE audit_log SET seq = n, prev_hash = prev,
               row_hash = encode(sha256(convert_to(prev || kvfleet_audit_canonical(r), 'UTF8')), 'hex')
         WHERE id = r.id
        RETURNING row_hash INTO prev;
    END LOOP;
    ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only;
END $$;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_seq_unique UNIQUE (seq);

-- Every insert is chained to the row before it. The advisory lock (held to the end of the transaction)
-- serialises writers, so seq has no gaps and each row's prev_hash is the hash of seq - 1; whatever a writer
-- puts in seq, prev_hash or row_hash is overwritten.
CREATE FUNCTION kvfleet_audit_log_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_seq bigint;
    last_hash text;
BEGIN
    PERFORM pg_advisory_xact_lock(74657002);
    SELECT seq, row_hash INTO last_seq, last_hash FROM audit_log ORDER BY seq DESC NULLS LAST LIMIT 1;
    NEW.seq := COALESCE(last_seq, 0) + 1;
    NEW.prev_hash := COALESCE(last_hash, repeat('0', 64));
    NEW.at := COALESCE(NEW.at, now());
    NEW.row_hash := encode(sha256(convert_to(NEW.prev_hash || kvfleet_audit_canonical(NEW), 'UTF8')), 'hex');
    RETURN NEW;
END $$;
CREATE TRIGGER audit_log_chain BEFORE INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION kvfleet_audit_log_chain();
-- TRUNCATE is refused too (it fires no row trigger): for the owner, who can still drop this trigger, the
-- hash chain (and the exported chain head) is what shows the change.
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_audit_log_append_only();

-- The writer role, when it exists (the embedded PostgreSQL and docs/run-for-real.md create it): everything
-- it needs on the other tables, INSERT and SELECT on audit_log, no TRUNCATE, no ownership (so no DDL and no
-- trigger control). Tables created by later migrations get the same through the default privileges.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kvfleet_writer') THEN
        GRANT USAGE ON SCHEMA public TO kvfleet_writer;
        GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO kvfleet_writer;
        REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON audit_log FROM kvfleet_writer;
        REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON kvfleet_alembic_version FROM kvfleet_writer;
        GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO kvfleet_writer;
        ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO kvfleet_writer;
        ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO kvfleet_writer;
    END IF;
END $$;
