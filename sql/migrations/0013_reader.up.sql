-- kvfleet history schema, revision 0013: the reader role. `kvfleet audit` and the kvfleet page read the history as
-- kvfleet_reader (KVFLEET_HISTORY_READER_URL or the Airflow connection kvfleet_history_reader): SELECT on every
-- table and view, and nothing else (no INSERT, UPDATE, DELETE, TRUNCATE, no sequence, no DDL). Objects a later
-- revision creates (as the owner running it) are readable too, through the owner's default privileges.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kvfleet_reader') AND current_user <> 'kvfleet_reader' THEN
        GRANT USAGE ON SCHEMA public TO kvfleet_reader;
        REVOKE ALL ON ALL TABLES IN SCHEMA public FROM kvfleet_reader;
        GRANT SELECT ON ALL TABLES IN SCHEMA public TO kvfleet_reader;
        ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO kvfleet_reader;
    END IF;
END
$$;
