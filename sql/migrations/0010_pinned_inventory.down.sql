-- kvfleet history schema: undo revision 0010 (the inventory each run applies).
ALTER TABLE runs DROP COLUMN IF EXISTS inventory_sha256, DROP COLUMN IF EXISTS inventory_commit,
    DROP COLUMN IF EXISTS inventory_dirty;
DROP TABLE IF EXISTS inventory_snapshots;
