-- kvfleet history schema, revision 0009: each endpoint's latest state kept at write time, read by ui_fleet
-- (bench/audit_scale.py at 1 M rows; see versions/0009_endpoint_state.py).

CREATE TABLE endpoint_state (
    cluster            text NOT NULL,
    endpoint           text NOT NULL,
    -- the newest endpoint step that is not a plan (stage 'endpoint', step 'endpoint:...'), by id
    ep_id              bigint,
    ep_lob             text,
    ep_outcome         text,
    ep_at              timestamptz,
    -- the newest cross-pod verification, by id
    v_id               bigint,
    v_lob              text,
    v_instance_type    text,
    v_prompt_tokens    integer,
    v_verdict          text,
    v_hit_ratio        double precision,
    v_speedup          double precision,
    v_expected_speedup double precision,
    v_diagnosis        text,
    v_at               timestamptz,
    -- the open drift findings of the endpoint
    open_drift         bigint NOT NULL DEFAULT 0,
    drift_lob          text,
    drift_kinds        text,
    drift_since        timestamptz,
    -- the newest step that changed something or failed (not unchanged, planned or passed), by (at, id)
    change_id          bigint,
    change_at          timestamptz,
    change_stage       text,
    change_outcome     text,
    change_run_key     text,
    PRIMARY KEY (cluster, endpoint)
) WITH (fillfactor = 50);  -- every relevant write updates its endpoint's row: room on the page for HOT updates
COMMENT ON TABLE endpoint_state IS
    'Per endpoint: newest endpoint step, newest verification, open drift and newest change (ui_fleet); kept by triggers';

-- Recount the given endpoints' rows from the history (the subqueries ui_fleet ran before revision 0009). Their
-- rows are made if missing and locked in key order first: a writer of the same endpoint in another transaction
-- holds the lock until it commits, so each recount reads every committed row (READ COMMITTED: each statement
-- below takes a new snapshot).
CREATE FUNCTION kvfleet_endpoint_state_refresh(clusters text[], endpoints text[]) RETURNS void LANGUAGE plpgsql
    SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO endpoint_state (cluster, endpoint)
    SELECT DISTINCT u.cluster, u.endpoint FROM unnest(clusters, endpoints) AS u(cluster, endpoint)
    WHERE u.cluster IS NOT NULL AND u.endpoint IS NOT NULL
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM endpoint_state s
    WHERE (s.cluster, s.endpoint) IN (SELECT u.cluster, u.endpoint FROM unnest(clusters, endpoints) AS u(cluster, endpoint))
    ORDER BY s.cluster, s.endpoint
    FOR UPDATE;
    INSERT INTO endpoint_state AS t (cluster, endpoint, ep_id, ep_lob, ep_outcome, ep_at, v_id, v_lob,
                                     v_instance_type, v_prompt_tokens, v_verdict, v_hit_ratio, v_speedup,
                                     v_expected_speedup, v_diagnosis, v_at, open_drift, drift_lob, drift_kinds,
                                     drift_since, change_id, change_at, change_stage, change_outcome, change_run_key)
    SELECT k.cluster, k.endpoint, ep.id, ep.lob, ep.outcome, ep.at, v.id, v.lob, v.instance_type, v.prompt_tokens,
           v.verdict, v.hit_ratio, v.speedup, v.expected_speedup, v.diagnosis, v.at, d.open_drift, d.lob,
           d.drift_kinds, d.drift_since, c.id, c.at, c.stage, c.outcome, c.run_key
    FROM (SELECT DISTINCT u.cluster, u.endpoint FROM unnest(clusters, endpoints) AS u(cluster, endpoint)
          WHERE u.cluster IS NOT NULL AND u.endpoint IS NOT NULL) k
    LEFT JOIN LATERAL (
        SELECT e.id, e.lob, e.outcome, e.at FROM step_events e
        WHERE e.cluster = k.cluster AND e.endpoint = k.endpoint
          AND e.stage = 'endpoint' AND e.step LIKE 'endpoint:%' AND e.outcome <> 'planned'
        ORDER BY e.id DESC LIMIT 1
    ) ep ON true
    LEFT JOIN LATERAL (
        SELECT h.id, h.lob, h.instance_type, h.prompt_tokens, h.verdict, h.hit_ratio, h.speedup, h.expected_speedup,
               h.diagnosis, h.at
        FROM hit_verifications h
        WHERE h.cluster = k.cluster AND h.endpoint = k.endpoint
        ORDER BY h.id DESC LIMIT 1
    ) v ON true
    LEFT JOIN LATERAL (
        SELECT max(f.lob) AS lob, count(*) AS open_drift, min(f.first_seen) AS drift_since,
               string_agg(DISTINCT f.kind, ', ' ORDER BY f.kind) AS drift_kinds
        FROM drift_findings f
        WHERE f.resolved_at IS NULL AND f.cluster = k.cluster AND f.endpoint = k.endpoint
    ) d ON true
    LEFT JOIN LATERAL (
        SELECT s.id, s.at, s.stage, s.outcome, s.run_key FROM step_events s
        WHERE s.cluster = k.cluster AND s.endpoint = k.endpoint
          AND s.outcome NOT IN ('unchanged', 'planned', 'passed')
        ORDER BY s.at DESC, s.id DESC LIMIT 1
    ) c ON true
    ORDER BY k.cluster, k.endpoint
    ON CONFLICT (cluster, endpoint) DO UPDATE SET
        ep_id = EXCLUDED.ep_id, ep_lob = EXCLUDED.ep_lob, ep_outcome = EXCLUDED.ep_outcome, ep_at = EXCLUDED.ep_at,
        v_id = EXCLUDED.v_id, v_lob = EXCLUDED.v_lob, v_instance_type = EXCLUDED.v_instance_type,
        v_prompt_tokens = EXCLUDED.v_prompt_tokens, v_verdict = EXCLUDED.v_verdict,
        v_hit_ratio = EXCLUDED.v_hit_ratio, v_speedup = EXCLUDED.v_speedup,
        v_expected_speedup = EXCLUDED.v_expected_speedup, v_diagnosis = EXCLUDED.v_diagnosis, v_at = EXCLUDED.v_at,
        open_drift = EXCLUDED.open_drift, drift_lob = EXCLUDED.drift_lob, drift_kinds = EXCLUDED.drift_kinds,
        drift_since = EXCLUDED.drift_since, change_id = EXCLUDED.change_id, change_at = EXCLUDED.change_at,
        change_stage = EXCLUDED.change_stage, change_outcome = EXCLUDED.change_outcome,
        change_run_key = EXCLUDED.change_run_key;
    DELETE FROM endpoint_state s
    WHERE (s.cluster, s.endpoint) IN (SELECT u.cluster, u.endpoint FROM unnest(clusters, endpoints) AS u(cluster, endpoint))
      AND s.ep_id IS NULL AND s.v_id IS NULL AND s.open_drift = 0 AND s.change_id IS NULL;
END $$;
REVOKE EXECUTE ON FUNCTION kvfleet_endpoint_state_refresh(text[], text[]) FROM PUBLIC;

-- step_events: only a row that is an endpoint step (not a plan) or a change can move the summary.
CREATE FUNCTION kvfleet_endpoint_state_steps() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = public, pg_temp AS $$
DECLARE
    cs text[];
    es text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(k.cluster), array_agg(k.endpoint) INTO cs, es
        FROM (SELECT DISTINCT n.cluster, n.endpoint FROM new_rows n
              WHERE n.cluster IS NOT NULL AND n.endpoint IS NOT NULL
                AND ((n.stage = 'endpoint' AND n.step LIKE 'endpoint:%' AND n.outcome <> 'planned')
                     OR n.outcome NOT IN ('unchanged', 'planned', 'passed'))) k;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT array_agg(k.cluster), array_agg(k.endpoint) INTO cs, es
        FROM (SELECT n.cluster, n.endpoint, n.stage, n.step, n.outcome FROM new_rows n
              UNION SELECT o.cluster, o.endpoint, o.stage, o.step, o.outcome FROM old_rows o) k
        WHERE k.cluster IS NOT NULL AND k.endpoint IS NOT NULL
          AND ((k.stage = 'endpoint' AND k.step LIKE 'endpoint:%' AND k.outcome <> 'planned')
               OR k.outcome NOT IN ('unchanged', 'planned', 'passed'));
    ELSE
        SELECT array_agg(k.cluster), array_agg(k.endpoint) INTO cs, es
        FROM (SELECT DISTINCT o.cluster, o.endpoint FROM old_rows o
              WHERE o.cluster IS NOT NULL AND o.endpoint IS NOT NULL
                AND ((o.stage = 'endpoint' AND o.step LIKE 'endpoint:%' AND o.outcome <> 'planned')
                     OR o.outcome NOT IN ('unchanged', 'planned', 'passed'))) k;
    END IF;
    IF cs IS NOT NULL THEN
        PERFORM kvfleet_endpoint_state_refresh(cs, es);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER step_events_endpoint_state_ins AFTER INSERT ON step_events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_endpoint_state_steps();
CREATE TRIGGER step_events_endpoint_state_upd AFTER UPDATE ON step_events
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_endpoint_state_steps();
CREATE TRIGGER step_events_endpoint_state_del AFTER DELETE ON step_events
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_endpoint_state_steps();

-- hit_verifications: every row is some endpoint's verification.
CREATE FUNCTION kvfleet_endpoint_state_verifications() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = public, pg_temp AS $$
DECLARE
    cs text[];
    es text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(k.cluster), array_agg(k.endpoint) INTO cs, es
        FROM (SELECT DISTINCT n.cluster, n.endpoint FROM new_rows n) k;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT array_agg(k.cluster), array_agg(k.endpoint) INTO cs, es
        FROM (SELECT n.cluster, n.endpoint FROM new_rows n UNION SELECT o.cluster, o.endpoint FROM old_rows o) k;
    ELSE
        SELECT array_agg(k.cluster), array_agg(k.endpoint) INTO cs, es
        FROM (SELECT DISTINCT o.cluster, o.endpoint FROM old_rows o) k;
    END IF;
    IF cs IS NOT NULL THEN
        PERFORM kvfleet_endpoint_state_refresh(cs, es);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER hit_verifications_endpoint_state_ins AFTER INSERT ON hit_verifications
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_endpoint_state_verifications();
CREATE TRIGGER hit_verifications_endpoint_state_upd AFTER UPDATE ON hit_verifications
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_endpoint_state_verifications();
CREATE TRIGGER hit_verifications_endpoint_state_del AFTER DELETE ON hit_verifications
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_endpoint_state_verifications();

-- drift_findings: only open findings of an endpoint count; an update counts when it opens or resolves a finding or
-- changes a column the summary reads (each drift check's last_seen refresh does not).
CREATE FUNCTION kvfleet_endpoint_state_drift() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = public, pg_temp AS $$
DECLARE
    cs text[];
    es text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(k.cluster), array_agg(k.endpoint) INTO cs, es
        FROM (SELECT DISTINCT n.cluster, n.endpoint FROM new_rows n
              WHERE n.resolved_at IS NULL AND n.endpoint IS NOT NULL) k;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT array_agg(k.cluster), array_agg(k.endpoint) INTO cs, es
        FROM (SELECT DISTINCT x.cluster, x.endpoint
              FROM old_rows o FULL JOIN new_rows n ON n.id = o.id
              CROSS JOIN LATERAL (VALUES (o.cluster, o.endpoint), (n.cluster, n.endpoint)) AS x(cluster, endpoint)
              WHERE ((o.id IS NOT NULL AND o.resolved_at IS NULL) OR (n.id IS NOT NULL AND n.resolved_at IS NULL))
                AND (o.id IS NULL OR n.id IS NULL
                     OR (o.cluster, o.endpoint, o.lob, o.kind, o.first_seen, o.resolved_at IS NULL)
                        IS DISTINCT FROM (n.cluster, n.endpoint, n.lob, n.kind, n.first_seen, n.resolved_at IS NULL))
                AND x.cluster IS NOT NULL AND x.endpoint IS NOT NULL) k;
    ELSE
        SELECT array_agg(k.cluster), array_agg(k.endpoint) INTO cs, es
        FROM (SELECT DISTINCT o.cluster, o.endpoint FROM old_rows o
              WHERE o.resolved_at IS NULL AND o.endpoint IS NOT NULL) k;
    END IF;
    IF cs IS NOT NULL THEN
        PERFORM kvfleet_endpoint_state_refresh(cs, es);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER drift_findings_endpoint_state_ins AFTER INSERT ON drift_findings
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_endpoint_state_drift();
CREATE TRIGGER drift_findings_endpoint_state_upd AFTER UPDATE ON drift_findings
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_endpoint_state_drift();
CREATE TRIGGER drift_findings_endpoint_state_del AFTER DELETE ON drift_findings
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_endpoint_state_drift();

-- ui_fleet reads the endpoint steps recorded without a cluster or an endpoint from the history (they cannot be
-- keyed); this index holds only them.
CREATE INDEX step_events_endpoint_keyless ON step_events (cluster, endpoint)
    WHERE stage = 'endpoint' AND step LIKE 'endpoint:%' AND outcome <> 'planned' AND (cluster IS NULL OR endpoint IS NULL);

-- Fill the summary from the rows already recorded.
SELECT kvfleet_endpoint_state_refresh(array_agg(k.cluster), array_agg(k.endpoint))
FROM (
    SELECT cluster, endpoint FROM step_events
    WHERE cluster IS NOT NULL AND endpoint IS NOT NULL
      AND ((stage = 'endpoint' AND step LIKE 'endpoint:%' AND outcome <> 'planned')
           OR outcome NOT IN ('unchanged', 'planned', 'passed'))
    UNION
    SELECT cluster, endpoint FROM hit_verifications
    UNION
    SELECT cluster, endpoint FROM drift_findings WHERE resolved_at IS NULL AND endpoint IS NOT NULL
) k
HAVING count(*) > 0;

-- The writer role reads the summary and cannot write it (the triggers write it as the owner).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kvfleet_writer')
       AND current_user <> 'kvfleet_writer' THEN
        REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON endpoint_state FROM kvfleet_writer;
        GRANT SELECT ON endpoint_state TO kvfleet_writer;
    END IF;
END $$;
