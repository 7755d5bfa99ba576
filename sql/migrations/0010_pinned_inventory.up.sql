-- kvfleet history schema, revision 0010: the inventory each run applies (see versions/0010_pinned_inventory.py).
CREATE TABLE inventory_snapshots (
    sha256      text PRIMARY KEY,
    body        text NOT NULL,
    source      text NOT NULL,                 -- the file's name when it was first pinned
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inventory_snapshots_digest CHECK (sha256 = encode(sha256(convert_to(body, 'UTF8')), 'hex'))
);

ALTER TABLE runs
    ADD COLUMN inventory_sha256 text REFERENCES inventory_snapshots (sha256),
    ADD COLUMN inventory_commit text CONSTRAINT runs_inventory_commit CHECK (inventory_commit ~ '^[0-9a-f]{40}([0-9a-f]{24})?$'),
    ADD COLUMN inventory_dirty  boolean;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kvfleet_writer') THEN
        REVOKE ALL ON inventory_snapshots FROM kvfleet_writer;
        GRANT SELECT, INSERT ON inventory_snapshots TO kvfleet_writer;
    END IF;
END
$$;
