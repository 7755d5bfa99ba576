ALTER TABLE cluster_locks DROP COLUMN state;
