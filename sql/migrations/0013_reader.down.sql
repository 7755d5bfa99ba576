-- kvfleet history schema: undo revision 0013 (the reader role's grants; the role itself is the cluster's).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kvfleet_reader') AND current_user <> 'kvfleet_reader' THEN
        ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES FROM kvfleet_reader;
        REVOKE ALL ON ALL TABLES IN SCHEMA public FROM kvfleet_reader;
        REVOKE USAGE ON SCHEMA public FROM kvfleet_reader;
    END IF;
END
$$;
