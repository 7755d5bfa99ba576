-- kvfleet history schema, revision 0002. A drift watch dates a condition that is only drift once it has lasted
-- longer than a threshold, when the cluster itself does not record since when (an operator controller scaled
-- to 0 by hand carries no kvfleet pause annotation). Opened by the first check that sees the condition,
-- deleted by the first check that no longer does.
CREATE TABLE drift_watches (
    cluster   text NOT NULL,
    watch     text NOT NULL,                 -- e.g. operator_zero_replicas
    since     timestamptz NOT NULL DEFAULT now(),
    run_key   text,
    PRIMARY KEY (cluster, watch)
);
