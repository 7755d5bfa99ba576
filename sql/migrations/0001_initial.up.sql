-- kvfleet history schema, revision 0001. Designed around the questions platform teams ask:
--   what changed on endpoint X in the last N days, in which run, triggered by whom  -> step_events(endpoint, at)
--   which drift is open now, and since when                                          -> drift_findings(open)
--   hit ratio and TTFT speedup per LOB per week                                      -> hit_verifications(lob, at)
--   Curvine release history per cluster                                              -> curvine_releases(cluster, revision)

CREATE TABLE runs (
    run_key       text PRIMARY KEY,              -- "<dag_id>/<run_id>" or "cli/<uuid>"
    dag_id        text NOT NULL,
    run_id        text NOT NULL,
    trigger       text NOT NULL,                 -- schedule | manual | cli | test
    triggered_by  text,                          -- Airflow user for manual runs
    params        jsonb NOT NULL DEFAULT '{}'::jsonb,
    plan          jsonb,
    status        text NOT NULL DEFAULT 'running', -- running | success | failed | aborted
    summary       jsonb,
    started_at    timestamptz NOT NULL DEFAULT now(),
    ended_at      timestamptz
);
CREATE INDEX runs_started_at ON runs (started_at DESC);
CREATE INDEX runs_dag_started ON runs (dag_id, started_at DESC);

-- One row per reconciler step. (run_key, task_id, map_index, step) is the idempotency key: a retried task
-- re-writes the same key and the second insert is ignored.
CREATE TABLE step_events (
    id          bigserial PRIMARY KEY,
    run_key     text NOT NULL REFERENCES runs(run_key) ON DELETE CASCADE,
    task_id     text NOT NULL,
    map_index   integer NOT NULL DEFAULT -1,
    step        text NOT NULL,
    cluster     text,
    endpoint    text,                            -- namespace/name
    lob         text,
    stage       text NOT NULL,                   -- tiered_storage | operator_addons | curvine | endpoint | verify | plan | gate | ...
    outcome     text NOT NULL,                   -- changed | unchanged | planned | refused | failed | skipped | passed
    detail      jsonb NOT NULL DEFAULT '{}'::jsonb,
    at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_key, task_id, map_index, step)
);
CREATE INDEX step_events_endpoint_at ON step_events (cluster, endpoint, at DESC) WHERE endpoint IS NOT NULL;
CREATE INDEX step_events_cluster_at ON step_events (cluster, at DESC);
CREATE INDEX step_events_run ON step_events (run_key, at);

CREATE TABLE curvine_releases (
    id              bigserial PRIMARY KEY,
    cluster         text NOT NULL,
    namespace       text NOT NULL,
    release         text NOT NULL,
    revision        integer NOT NULL,
    chart_version   text,
    status          text,
    format_master   boolean,
    format_worker   boolean,
    format_journal  boolean,
    values          jsonb NOT NULL DEFAULT '{}'::jsonb,
    run_key         text REFERENCES runs(run_key) ON DELETE SET NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (cluster, namespace, release, revision)
);
CREATE INDEX curvine_releases_cluster ON curvine_releases (cluster, revision DESC);

-- A finding is opened the first time it is seen, touched on every check that still sees it, and resolved
-- by the first check that no longer does. fingerprint = kind + object + field.
CREATE TABLE drift_findings (
    id             bigserial PRIMARY KEY,
    fingerprint    text NOT NULL,
    cluster        text NOT NULL,
    lob            text,
    endpoint       text,
    kind           text NOT NULL,
    severity       text NOT NULL,
    object_ref     text NOT NULL,
    field          text,
    expected       text,
    actual         text,
    first_seen     timestamptz NOT NULL DEFAULT now(),
    last_seen      timestamptz NOT NULL DEFAULT now(),
    resolved_at    timestamptz,
    first_run_key  text,
    last_run_key   text,
    remediation    jsonb
);
CREATE UNIQUE INDEX drift_findings_open_fp ON drift_findings (fingerprint) WHERE resolved_at IS NULL;
CREATE INDEX drift_findings_open ON drift_findings (cluster, first_seen) WHERE resolved_at IS NULL;
CREATE INDEX drift_findings_kind_seen ON drift_findings (cluster, kind, first_seen DESC);

CREATE TABLE hit_verifications (
    id                bigserial PRIMARY KEY,
    run_key           text NOT NULL REFERENCES runs(run_key) ON DELETE CASCADE,
    task_id           text NOT NULL,
    map_index         integer NOT NULL DEFAULT -1,
    step              text NOT NULL,
    cluster           text NOT NULL,
    endpoint          text NOT NULL,
    lob               text,
    instance_type     text,
    prompt_tokens     integer,
    stored_tokens     integer,
    hit_tokens        integer,
    hit_ratio         double precision,
    l2_read_ms        double precision,
    ttft_cold_ms      double precision,
    ttft_warm_ms      double precision,
    speedup           double precision,
    expected_speedup  double precision,
    verdict           text NOT NULL,           -- pass | degraded | fail | unverifiable
    diagnosis         text,
    detail            jsonb NOT NULL DEFAULT '{}'::jsonb,
    at                timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_key, task_id, map_index, step)
);
CREATE INDEX hit_verifications_lob_at ON hit_verifications (lob, at DESC);
CREATE INDEX hit_verifications_endpoint_at ON hit_verifications (cluster, endpoint, at DESC);

CREATE TABLE capacity_snapshots (
    id              bigserial PRIMARY KEY,
    run_key         text REFERENCES runs(run_key) ON DELETE SET NULL,
    step            text NOT NULL,
    cluster         text NOT NULL,
    phase           text NOT NULL,             -- install | verify | before | after
    capacity_bytes  bigint,
    fs_used_bytes   bigint,
    live_workers    integer,
    lost_workers    integer,
    files_total     bigint,
    dirs_total      bigint,
    detail          jsonb NOT NULL DEFAULT '{}'::jsonb,
    at              timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_key, step, cluster, phase)
);
CREATE INDEX capacity_snapshots_cluster_at ON capacity_snapshots (cluster, at DESC);

-- Append-only audit log: who did what, where. UPDATE and DELETE are refused by a trigger.
CREATE TABLE audit_log (
    id         bigserial PRIMARY KEY,
    run_key    text,
    event_key  text NOT NULL UNIQUE,           -- idempotency key of the writer
    actor      text NOT NULL,
    action     text NOT NULL,
    cluster    text,
    endpoint   text,
    detail     jsonb NOT NULL DEFAULT '{}'::jsonb,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_log_at ON audit_log (at DESC);
CREATE INDEX audit_log_cluster_at ON audit_log (cluster, at DESC);

CREATE FUNCTION kvfleet_audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP;
END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION kvfleet_audit_log_append_only();

-- Cluster leases: a rollout, a drift remediation or a Curvine upgrade holds one per cluster. A lease whose
-- heartbeat stopped (the worker died) expires and can be taken over.
CREATE TABLE cluster_locks (
    cluster       text PRIMARY KEY,
    holder        text NOT NULL,               -- run_key of the holder
    purpose       text NOT NULL,
    acquired_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
