-- kvfleet history schema: undo revision 0011 (clusters named by their key). Each key becomes its bare name
-- again; refused when two keys, or a key and a bare name, share a name (the rows would collide in the leases,
-- the Curvine releases and the open findings).
DO $$
DECLARE
    clash text;
BEGIN
    -- every value a name would become: a key's name, or a bare name (left by revision 0011) as it is
    SELECT string_agg(n.name, ', ' ORDER BY n.name) INTO clash FROM (
        SELECT CASE WHEN k ~ '^[^/]+/[^/]+/[^/]+$' THEN split_part(k, '/', 3) ELSE k END AS name FROM (
            SELECT cluster AS k FROM step_events WHERE cluster IS NOT NULL UNION SELECT cluster FROM hit_verifications
            UNION SELECT cluster FROM capacity_snapshots UNION SELECT cluster FROM curvine_releases
            UNION SELECT cluster FROM drift_watches UNION SELECT cluster FROM drift_findings
            UNION SELECT cluster FROM cluster_locks WHERE cluster NOT LIKE 'slot:%') a
        GROUP BY 1 HAVING count(DISTINCT k) > 1) n;
    IF clash IS NOT NULL THEN
        RAISE EXCEPTION 'cannot undo revision 0011: clusters in several accounts or regions share a name (%)', clash;
    END IF;
END $$;

UPDATE step_events SET cluster = split_part(cluster, '/', 3) WHERE cluster ~ '^[^/]+/[^/]+/[^/]+$';
UPDATE hit_verifications SET cluster = split_part(cluster, '/', 3) WHERE cluster ~ '^[^/]+/[^/]+/[^/]+$';
UPDATE capacity_snapshots SET cluster = split_part(cluster, '/', 3) WHERE cluster ~ '^[^/]+/[^/]+/[^/]+$';
UPDATE curvine_releases SET cluster = split_part(cluster, '/', 3) WHERE cluster ~ '^[^/]+/[^/]+/[^/]+$';
UPDATE drift_watches SET cluster = split_part(cluster, '/', 3) WHERE cluster ~ '^[^/]+/[^/]+/[^/]+$';
UPDATE cluster_locks SET cluster = split_part(cluster, '/', 3)
WHERE cluster ~ '^[^/]+/[^/]+/[^/]+$' AND cluster NOT LIKE 'slot:%';
UPDATE cluster_locks SET holder = split_part(holder, '#', 1) || '#' || split_part(split_part(holder, '#', 2), '/', 3)
WHERE cluster LIKE 'slot:%' AND split_part(holder, '#', 2) ~ '^[^/]+/[^/]+/[^/]+$';
UPDATE drift_findings
SET cluster = split_part(cluster, '/', 3),
    fingerprint = left(encode(sha256(convert_to(split_part(cluster, '/', 3) || '|' || kind || '|' || object_ref || '|'
                                                || coalesce(field, ''), 'UTF8')), 'hex'), 24)
WHERE cluster ~ '^[^/]+/[^/]+/[^/]+$';
