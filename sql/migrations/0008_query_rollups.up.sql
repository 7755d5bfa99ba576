-- kvfleet history schema, revision 0008: summaries maintained at write time, and keyset-paging indexes
-- (bench/audit_scale.py at 1 M rows; see versions/0008_query_rollups.py).

-- The quarter hour and the UTC day a time falls in (the summaries' buckets).
CREATE FUNCTION kvfleet_quarter_hour(ts timestamptz) RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT to_timestamp(CAST(floor(extract(epoch FROM ts) / 900) * 900 AS double precision))
$$;
CREATE FUNCTION kvfleet_utc_day(ts timestamptz) RETURNS date LANGUAGE sql IMMUTABLE AS $$
    SELECT CAST(ts AT TIME ZONE 'UTC' AS date)
$$;

-- ---- write-ahead intents without an outcome ----------------------------------------------------------------
CREATE TABLE audit_open_intents (
    intent_id bigint PRIMARY KEY REFERENCES audit_log (id),
    run_key   text
);
CREATE INDEX audit_open_intents_run ON audit_open_intents (run_key);
COMMENT ON TABLE audit_open_intents IS
    'Intents (audit_log.kind = intent) that no audit_log row names as its intent_id yet; kept by a trigger';

CREATE FUNCTION kvfleet_open_intents_sync() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO audit_open_intents (intent_id, run_key)
    SELECT n.id, n.run_key FROM new_rows n
    WHERE n.kind = 'intent' AND NOT EXISTS (SELECT 1 FROM new_rows o WHERE o.intent_id = n.id)
    ORDER BY n.id
    ON CONFLICT DO NOTHING;
    DELETE FROM audit_open_intents
    WHERE intent_id IN (SELECT o.intent_id FROM new_rows o WHERE o.intent_id IS NOT NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER audit_log_open_intents AFTER INSERT ON audit_log
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_open_intents_sync();

INSERT INTO audit_open_intents (intent_id, run_key)
SELECT i.id, i.run_key FROM audit_log i
WHERE i.kind = 'intent' AND NOT EXISTS (SELECT 1 FROM audit_log o WHERE o.intent_id = i.id);

-- ---- verifications per line of business and quarter hour -------------------------------------------------
CREATE TABLE hit_stats_buckets (
    bucket        timestamptz NOT NULL,
    lob           text,
    verifications integer NOT NULL,
    passed        integer NOT NULL,
    hit_ratio_sum double precision NOT NULL,
    hit_ratio_n   integer NOT NULL,
    speedup_sum   double precision NOT NULL,
    speedup_n     integer NOT NULL,
    expected_sum  double precision NOT NULL,
    expected_n    integer NOT NULL
);
CREATE UNIQUE INDEX hit_stats_buckets_key ON hit_stats_buckets (bucket, (coalesce(lob, '')), ((lob IS NULL)));
COMMENT ON TABLE hit_stats_buckets IS
    'hit_verifications counted and summed per LOB and quarter hour (the sums and non-NULL counts behind AVG)';

CREATE FUNCTION kvfleet_hit_stats_sync() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO hit_stats_buckets AS t (bucket, lob, verifications, passed, hit_ratio_sum, hit_ratio_n,
                                            speedup_sum, speedup_n, expected_sum, expected_n)
        SELECT kvfleet_quarter_hour(o.at), o.lob, -count(*), -count(*) FILTER (WHERE o.verdict = 'pass'),
               -coalesce(sum(o.hit_ratio), 0), -count(o.hit_ratio), -coalesce(sum(o.speedup), 0),
               -count(o.speedup), -coalesce(sum(o.expected_speedup), 0), -count(o.expected_speedup)
        FROM old_rows o GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (bucket, (coalesce(lob, '')), ((lob IS NULL))) DO UPDATE SET
            verifications = t.verifications + EXCLUDED.verifications, passed = t.passed + EXCLUDED.passed,
            hit_ratio_sum = t.hit_ratio_sum + EXCLUDED.hit_ratio_sum, hit_ratio_n = t.hit_ratio_n + EXCLUDED.hit_ratio_n,
            speedup_sum = t.speedup_sum + EXCLUDED.speedup_sum, speedup_n = t.speedup_n + EXCLUDED.speedup_n,
            expected_sum = t.expected_sum + EXCLUDED.expected_sum, expected_n = t.expected_n + EXCLUDED.expected_n;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO hit_stats_buckets AS t (bucket, lob, verifications, passed, hit_ratio_sum, hit_ratio_n,
                                            speedup_sum, speedup_n, expected_sum, expected_n)
        SELECT kvfleet_quarter_hour(n.at), n.lob, count(*), count(*) FILTER (WHERE n.verdict = 'pass'),
               coalesce(sum(n.hit_ratio), 0), count(n.hit_ratio), coalesce(sum(n.speedup), 0), count(n.speedup),
               coalesce(sum(n.expected_speedup), 0), count(n.expected_speedup)
        FROM new_rows n GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (bucket, (coalesce(lob, '')), ((lob IS NULL))) DO UPDATE SET
            verifications = t.verifications + EXCLUDED.verifications, passed = t.passed + EXCLUDED.passed,
            hit_ratio_sum = t.hit_ratio_sum + EXCLUDED.hit_ratio_sum, hit_ratio_n = t.hit_ratio_n + EXCLUDED.hit_ratio_n,
            speedup_sum = t.speedup_sum + EXCLUDED.speedup_sum, speedup_n = t.speedup_n + EXCLUDED.speedup_n,
            expected_sum = t.expected_sum + EXCLUDED.expected_sum, expected_n = t.expected_n + EXCLUDED.expected_n;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER hit_verifications_stats_ins AFTER INSERT ON hit_verifications
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_hit_stats_sync();
CREATE TRIGGER hit_verifications_stats_upd AFTER UPDATE ON hit_verifications
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_hit_stats_sync();
CREATE TRIGGER hit_verifications_stats_del AFTER DELETE ON hit_verifications
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_hit_stats_sync();

INSERT INTO hit_stats_buckets (bucket, lob, verifications, passed, hit_ratio_sum, hit_ratio_n, speedup_sum,
                               speedup_n, expected_sum, expected_n)
SELECT kvfleet_quarter_hour(at), lob, count(*), count(*) FILTER (WHERE verdict = 'pass'),
       coalesce(sum(hit_ratio), 0), count(hit_ratio), coalesce(sum(speedup), 0), count(speedup),
       coalesce(sum(expected_speedup), 0), count(expected_speedup)
FROM hit_verifications GROUP BY 1, 2;

-- ---- drift findings per cluster and UTC day of last_seen ----------------------------------------------------
CREATE TABLE drift_day_counts (
    cluster             text NOT NULL,
    day                 date NOT NULL,
    seen                bigint NOT NULL,
    open                bigint NOT NULL,
    resolved            bigint NOT NULL,
    remediated          bigint NOT NULL,
    remediation_refused bigint NOT NULL,
    remediation_failed  bigint NOT NULL,
    PRIMARY KEY (cluster, day)
);
COMMENT ON TABLE drift_day_counts IS
    'drift_findings counted per cluster and UTC day of last_seen: open/resolved and remediation outcome';

CREATE FUNCTION kvfleet_drift_counts_sync() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO drift_day_counts AS t (cluster, day, seen, open, resolved, remediated, remediation_refused,
                                           remediation_failed)
        SELECT o.cluster, kvfleet_utc_day(o.last_seen), -count(*), -count(*) FILTER (WHERE o.resolved_at IS NULL),
               -count(o.resolved_at), -count(*) FILTER (WHERE o.remediation->>'outcome' = 'changed'),
               -count(*) FILTER (WHERE o.remediation->>'outcome' = 'refused'),
               -count(*) FILTER (WHERE o.remediation->>'outcome' = 'failed')
        FROM old_rows o GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (cluster, day) DO UPDATE SET
            seen = t.seen + EXCLUDED.seen, open = t.open + EXCLUDED.open, resolved = t.resolved + EXCLUDED.resolved,
            remediated = t.remediated + EXCLUDED.remediated,
            remediation_refused = t.remediation_refused + EXCLUDED.remediation_refused,
            remediation_failed = t.remediation_failed + EXCLUDED.remediation_failed;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO drift_day_counts AS t (cluster, day, seen, open, resolved, remediated, remediation_refused,
                                           remediation_failed)
        SELECT n.cluster, kvfleet_utc_day(n.last_seen), count(*), count(*) FILTER (WHERE n.resolved_at IS NULL),
               count(n.resolved_at), count(*) FILTER (WHERE n.remediation->>'outcome' = 'changed'),
               count(*) FILTER (WHERE n.remediation->>'outcome' = 'refused'),
               count(*) FILTER (WHERE n.remediation->>'outcome' = 'failed')
        FROM new_rows n GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (cluster, day) DO UPDATE SET
            seen = t.seen + EXCLUDED.seen, open = t.open + EXCLUDED.open, resolved = t.resolved + EXCLUDED.resolved,
            remediated = t.remediated + EXCLUDED.remediated,
            remediation_refused = t.remediation_refused + EXCLUDED.remediation_refused,
            remediation_failed = t.remediation_failed + EXCLUDED.remediation_failed;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER drift_findings_counts_ins AFTER INSERT ON drift_findings
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_drift_counts_sync();
CREATE TRIGGER drift_findings_counts_upd AFTER UPDATE ON drift_findings
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_drift_counts_sync();
CREATE TRIGGER drift_findings_counts_del AFTER DELETE ON drift_findings
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION kvfleet_drift_counts_sync();

INSERT INTO drift_day_counts (cluster, day, seen, open, resolved, remediated, remediation_refused,
                              remediation_failed)
SELECT cluster, kvfleet_utc_day(last_seen), count(*), count(*) FILTER (WHERE resolved_at IS NULL), count(resolved_at),
       count(*) FILTER (WHERE remediation->>'outcome' = 'changed'),
       count(*) FILTER (WHERE remediation->>'outcome' = 'refused'),
       count(*) FILTER (WHERE remediation->>'outcome' = 'failed')
FROM drift_findings GROUP BY 1, 2;

-- ---- keyset paging and covering indexes --------------------------------------------------------------------
-- verifications_page: newest first, (at, id) as the cursor; one LOB's.
CREATE INDEX hit_verifications_at_id ON hit_verifications (at DESC, id DESC);
CREATE INDEX hit_verifications_lob_at_id ON hit_verifications (lob, at DESC, id DESC);
-- drift_page: newest first_seen first, (first_seen, id) as the cursor; last_seen and cluster filter in the index.
CREATE INDEX drift_findings_first_seen_id ON drift_findings (first_seen DESC, id DESC) INCLUDE (last_seen, cluster);
-- open_drift_page: the open findings in open_drift's order, (first_seen, cluster, kind, id) as the cursor.
CREATE INDEX drift_findings_open_page ON drift_findings (first_seen, cluster, kind, id) WHERE resolved_at IS NULL;
-- drift_recurrence: one kind since a cutoff, counted from the index alone.
CREATE INDEX drift_findings_kind_first_seen_cover ON drift_findings (kind, first_seen)
    INCLUDE (cluster, endpoint, object_ref, first_run_key);

-- The writer role reads the summaries and cannot write them (the triggers write them as the owner).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kvfleet_writer')
       AND current_user <> 'kvfleet_writer' THEN
        REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER
            ON audit_open_intents, hit_stats_buckets, drift_day_counts FROM kvfleet_writer;
        GRANT SELECT ON audit_open_intents, hit_stats_buckets, drift_day_counts TO kvfleet_writer;
    END IF;
END $$;
