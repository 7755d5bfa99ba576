-- kvfleet history schema, revision 0012: freezes and emergency stops (see versions/0012_holds.py).
CREATE TABLE holds (
    id            bigserial PRIMARY KEY,
    kind          text NOT NULL CONSTRAINT holds_kind CHECK (kind IN ('freeze', 'stop')),
    scope         text NOT NULL CONSTRAINT holds_scope CHECK (scope IN ('all', 'lob', 'cluster', 'run')),
    target        text NOT NULL DEFAULT '',      -- the LOB, the cluster key or the run key; '' for all
    reason        text NOT NULL,
    requested_by  text NOT NULL,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    lifted_at     timestamptz,
    lifted_by     text,
    lift_reason   text,
    CONSTRAINT holds_target CHECK ((scope = 'all') = (target = '') AND length(target) <= 500),
    CONSTRAINT holds_freeze_names_no_run CHECK (kind = 'stop' OR scope <> 'run'),
    CONSTRAINT holds_reason CHECK (length(btrim(reason)) > 0 AND length(reason) <= 500),
    CONSTRAINT holds_requested_by CHECK (length(btrim(requested_by)) > 0 AND length(requested_by) <= 200),
    -- a stop is never lifted (it holds only the runs in flight when it was given); a lift says who and why
    CONSTRAINT holds_lift CHECK (
        (lifted_at IS NULL AND lifted_by IS NULL AND lift_reason IS NULL)
        OR (kind = 'freeze' AND lifted_at IS NOT NULL AND length(btrim(lifted_by)) > 0
            AND length(btrim(lift_reason)) > 0 AND length(lift_reason) <= 500))
);
-- One active freeze per scope (what makes `freeze on` idempotent), and the index the check reads them by.
CREATE UNIQUE INDEX holds_active_freeze ON holds (scope, target) WHERE kind = 'freeze' AND lifted_at IS NULL;
-- The check reads the stops given since its run started.
CREATE INDEX holds_stops_at ON holds (requested_at) WHERE kind = 'stop';

-- The writer role records and lifts holds; it never deletes one (a hold's history is what `audit` shows).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kvfleet_writer') AND current_user <> 'kvfleet_writer' THEN
        REVOKE ALL ON holds FROM kvfleet_writer;
        GRANT SELECT, INSERT, UPDATE ON holds TO kvfleet_writer;
        GRANT USAGE, SELECT ON SEQUENCE holds_id_seq TO kvfleet_writer;
    END IF;
END
$$;
