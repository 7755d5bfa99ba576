-- kvfleet history schema, revision 0004 (lease liveness). A cluster lease is either held by a running
-- task ('active': heartbeat every ttl/3, short ttl) or parked on purpose between two tasks of one run, while a
-- human gate waits ('parked': the gate's own, longer ttl). Who may take it over: see kvfleet.history.leases.
ALTER TABLE cluster_locks ADD COLUMN state text NOT NULL DEFAULT 'active'
    CHECK (state IN ('active', 'parked'));
