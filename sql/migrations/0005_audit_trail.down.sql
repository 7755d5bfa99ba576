DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log;
DROP TRIGGER IF EXISTS audit_log_chain ON audit_log;
DROP FUNCTION IF EXISTS kvfleet_audit_log_chain();
ALTER TABLE audit_log DROP CONSTRAINT IF EXISTS audit_log_seq_unique;
DROP FUNCTION IF EXISTS kvfleet_audit_canonical(audit_log);
DROP INDEX IF EXISTS audit_log_run;
DROP INDEX IF EXISTS audit_log_open_intents;
DROP INDEX IF EXISTS audit_log_intent;
-- write-ahead rows only exist from this revision on; the earlier schema has no place for them
ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only;
DELETE FROM audit_log WHERE kind <> 'event';
ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only;
ALTER TABLE audit_log DROP COLUMN row_hash;
ALTER TABLE audit_log DROP COLUMN prev_hash;
ALTER TABLE audit_log DROP COLUMN seq;
ALTER TABLE audit_log DROP COLUMN intent_id;
ALTER TABLE audit_log DROP COLUMN kind;
ALTER TABLE drift_findings DROP COLUMN resolution;
ALTER TABLE runs DROP COLUMN reason;
