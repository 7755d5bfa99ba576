-- kvfleet history schema: undo revision 0011 (clusters named by their key). Each key becomes its bare name
-- again; refused when two keys share a name (the rows would collide in the leases and the Curvine releases).
DO $$
DECLARE
    clash text;
BEGIN
    SELECT string_agg(DISTINCT c.name, ', ') INTO clash FROM (
        SELECT split_part(k, '/', 3) AS name, k FROM (
            SELECT cluster AS k FROM step_events UNION SELECT cluster FROM hit_verifications
            UNION SELECT cluster FROM capacity_snapshots UNION SELECT cluster FROM curvine_releases
            UNION SELECT cluster FROM drift_watches UNION SELECT cluster FROM drift_findings
            UNION SELECT cluster FROM cluster_locks WHERE cluster NOT LIKE 'slot:%') a
        WHERE k ~ '^[^/]+/[^/]+/[^/]+$') c
    GROUP BY c.name HAVING count(DISTINCT c.k) > 1;
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
UPDATE drift_findings
SET cluster = split_part(cluster, '/', 3),
    fingerprint = left(encode(sha256(convert_to(split_part(cluster, '/', 3) || '|' || kind || '|' || object_ref || '|'
                                                || coalesce(field, ''), 'UTF8')), 'hex'), 24)
WHERE cluster ~ '^[^/]+/[^/]+/[^/]+$';
