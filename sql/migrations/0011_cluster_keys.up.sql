-- kvfleet history schema, revision 0011: a cluster is named by its key, account/region/name (see
-- versions/0011_cluster_keys.py).
--
-- Each row that names a cluster by its bare name gets the key of the cluster it meant:
--   1. the key its own run's pinned inventory (revision 0010) gives the name, when it gives one; when it gives
--      several (one name in several accounts), the one of them the run's `clusters` Param named by its key;
--   2. else the one key that every pinned inventory gives the name, when they all agree;
--   3. else the row keeps its name, and the queries read it as the cluster of that name in the base identity's
--      own account (kvfleet.history.clusters).
-- audit_log rows are not rewritten (each row's hash covers its cluster, and the chain must still verify).
-- endpoint_state and drift_day_counts follow by their triggers (revisions 0008 and 0009).

CREATE TEMP TABLE kvfleet_snapshot_keys ON COMMIT DROP AS
SELECT DISTINCT s.sha256, c ->> 'name' AS name,
       coalesce((SELECT a ->> 'id' FROM jsonb_array_elements(coalesce(s.doc -> 'accounts', '[]'::jsonb)) a
                 WHERE a ->> 'name' = c ->> 'account' LIMIT 1), 'default')
       || '/' || (c ->> 'region') || '/' || (c ->> 'name') AS key
FROM (SELECT sha256, CAST(body AS jsonb) AS doc FROM inventory_snapshots) s,
     jsonb_array_elements(coalesce(s.doc -> 'clusters', '[]'::jsonb)) c;
CREATE INDEX ON kvfleet_snapshot_keys (sha256, name);

CREATE TEMP TABLE kvfleet_name_keys ON COMMIT DROP AS
SELECT name, min(key) AS key FROM kvfleet_snapshot_keys GROUP BY name HAVING count(DISTINCT key) = 1;

-- The key a row of run `holder` (a run key, or a lease holder `<run key>#...`) meant by `cluster`.
CREATE FUNCTION pg_temp.kvfleet_key_of(holder text, cluster text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT CASE WHEN count(*) = 1 THEN min(k.key)
                     ELSE min(k.key) FILTER (WHERE jsonb_typeof(r.params -> 'clusters') = 'array'
                                              AND r.params -> 'clusters' ? k.key) END
         FROM runs r JOIN kvfleet_snapshot_keys k ON k.sha256 = r.inventory_sha256
         WHERE r.run_key = split_part(holder, '#', 1) AND k.name = cluster
         GROUP BY r.run_key),
        (SELECT n.key FROM kvfleet_name_keys n WHERE n.name = cluster),
        cluster)
$$;

UPDATE step_events SET cluster = pg_temp.kvfleet_key_of(run_key, cluster)
WHERE cluster IS NOT NULL AND strpos(cluster, '/') = 0;
UPDATE hit_verifications SET cluster = pg_temp.kvfleet_key_of(run_key, cluster) WHERE strpos(cluster, '/') = 0;
UPDATE capacity_snapshots SET cluster = pg_temp.kvfleet_key_of(run_key, cluster) WHERE strpos(cluster, '/') = 0;
UPDATE curvine_releases SET cluster = pg_temp.kvfleet_key_of(run_key, cluster) WHERE strpos(cluster, '/') = 0;
UPDATE drift_watches SET cluster = pg_temp.kvfleet_key_of(run_key, cluster) WHERE strpos(cluster, '/') = 0;
-- A lease held across this revision keeps protecting its cluster: its row is keyed as its holder's run will ask.
-- A rollout's parallelism slot (`slot:<run key>:<i>`) names its cluster in its holder (`<run key>#<cluster>`),
-- which its resumed task asks for by the key.
UPDATE cluster_locks SET cluster = pg_temp.kvfleet_key_of(holder, cluster)
WHERE strpos(cluster, '/') = 0 AND cluster NOT LIKE 'slot:%';
UPDATE cluster_locks
SET holder = split_part(holder, '#', 1) || '#' || pg_temp.kvfleet_key_of(holder, split_part(holder, '#', 2))
WHERE cluster LIKE 'slot:%' AND strpos(holder, '#') > 0 AND strpos(split_part(holder, '#', 2), '/') = 0;
-- A live lease no pinned inventory keys would stop protecting its cluster (its next holder asks by the key): the
-- upgrade is refused until it is freed. A dead one (expired) is dropped.
DELETE FROM cluster_locks WHERE strpos(cluster, '/') = 0 AND cluster NOT LIKE 'slot:%' AND expires_at <= now();
DO $$
DECLARE
    held text;
BEGIN
    SELECT string_agg(cluster || ' (held by ' || holder || ' until ' || expires_at || ')', ', ' ORDER BY cluster)
    INTO held FROM cluster_locks WHERE strpos(cluster, '/') = 0 AND cluster NOT LIKE 'slot:%';
    IF held IS NOT NULL THEN
        RAISE EXCEPTION 'kvfleet history revision 0011: no pinned inventory says which account and region these held leases are in: %. Let those runs finish (or their leases expire), then upgrade again', held;
    END IF;
END $$;
-- A finding's fingerprint is cluster|kind|object|field (kvfleet.fleet.drift.Finding.fingerprint): computed again
-- with the key, so the next check still recognises the findings it opened before. An open finding whose new
-- fingerprint an open finding has already (one the previous revision wrote under the key, from an endpoint that
-- named its cluster by key) is the same finding: it is resolved as merged, and the other one stays open.
CREATE TEMP TABLE kvfleet_finding_keys ON COMMIT DROP AS
SELECT id, key, resolved_at IS NULL AS open,
       left(encode(sha256(convert_to(key || '|' || kind || '|' || object_ref || '|' || coalesce(field, ''), 'UTF8')),
                   'hex'), 24) AS fingerprint
FROM (SELECT f.*, pg_temp.kvfleet_key_of(coalesce(f.first_run_key, ''), f.cluster) AS key FROM drift_findings f
      WHERE strpos(f.cluster, '/') = 0) f
WHERE key <> cluster;
UPDATE drift_findings d SET resolved_at = now(), resolution = 'merged'
FROM kvfleet_finding_keys k
WHERE d.id = k.id AND k.open
  AND (EXISTS (SELECT 1 FROM drift_findings o WHERE o.resolved_at IS NULL AND o.fingerprint = k.fingerprint)
       OR EXISTS (SELECT 1 FROM kvfleet_finding_keys o WHERE o.open AND o.fingerprint = k.fingerprint
                  AND o.id < k.id));
UPDATE drift_findings d SET cluster = k.key, fingerprint = k.fingerprint
FROM kvfleet_finding_keys k WHERE d.id = k.id;

DROP FUNCTION pg_temp.kvfleet_key_of(text, text);
