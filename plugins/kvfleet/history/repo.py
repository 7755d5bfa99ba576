"""Typed writes and named queries over the history database.

Called by the stage reconcilers (writes, in the same transaction as the step's outcome), by the DAG tasks
(runs, summaries) and by `kvfleet audit` (named queries, whose SQL lives in ``sql/queries/*.sql``).

Every write is idempotent on its natural key, usually (run, task, map index, step): a retried Airflow task
re-issues the same insert and ``ON CONFLICT DO NOTHING`` keeps exactly one row. JSON is always bound as a
parameter (SQLAlchemy 2.1's ``text()`` would read ``:2`` inside a JSON literal as a bind).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from kvfleet.history.db import get_engine, sql_dir


def _json(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


# ---- terminal status of a run -------------------------------------------------------------------------------
TERMINAL_STATUSES = ("success", "completed_with_failures", "failed", "aborted", "refused")
FAILURE_OUTCOMES = frozenset({"failed", "fail", "refused"})
SKIP_OUTCOMES = frozenset({"skipped", "skipped_by_gate", "paused_for_review"})
# A refusal of the whole run (not of one endpoint): the plan (unknown LOB, missing fleet file, bad scope) or a
# Curvine upgrade / scale-out refused by its safety gates.
REFUSAL_STAGES = frozenset({"plan", "curvine-upgrade", "curvine-scale-out"})
UNKNOWN_OUTCOME = "unknown — check live state"
GENESIS_HASH = "0" * 64


def _is_abort(step: Mapping[str, Any]) -> bool:
    return bool(step["outcome"] == "aborted" or (step["stage"] == "gate" and step["outcome"] == "abort"))


def _is_refusal(step: Mapping[str, Any]) -> bool:
    return bool(step["outcome"] == "refused" and step.get("endpoint") is None and step["stage"] in REFUSAL_STAGES)


def _step_reason(step: Mapping[str, Any]) -> str | None:
    detail = step.get("detail") or {}
    for k in ("error", "reason"):
        if detail.get(k):
            return str(detail[k])
    return None


def derive_status(airflow_state: str, steps: Iterable[Mapping[str, Any]],
                  open_intents: int = 0) -> tuple[str, dict[str, Any]]:
    """The terminal status of a run from Airflow's final state and the steps it recorded, with the counts
    behind it. Airflow ``success``: aborted > refused > completed_with_failures > success. Airflow ``failed``:
    aborted > refused > failed (never ``success``). A write-ahead intent left without an outcome counts as a
    failure: nobody knows whether that change happened."""
    if airflow_state not in ("success", "failed"):
        raise ValueError(f"airflow_state: {airflow_state!r} is not success or failed (a DAG run's end state)")
    steps = list(steps)
    counts: dict[str, int] = {}
    for st in steps:
        counts[st["outcome"]] = counts.get(st["outcome"], 0) + 1
    aborts = [st for st in steps if _is_abort(st)]
    refusals = [st for st in steps if _is_refusal(st)]
    failures = sum(n for o, n in counts.items() if o in FAILURE_OUTCOMES)
    skipped = sum(n for o, n in counts.items() if o in SKIP_OUTCOMES)
    facts: dict[str, Any] = {"outcomes": dict(sorted(counts.items())), "failures": failures, "skipped": skipped,
                             "open_intents": open_intents, "airflow_state": airflow_state}
    if aborts:
        status = "aborted"
        facts["reason"] = next((r for r in map(_step_reason, aborts) if r), "aborted at a gate")
    elif refusals:
        status = "refused"
        facts["reason"] = next((r for r in map(_step_reason, refusals) if r), "refused")
    elif airflow_state == "failed":
        status = "failed"
        errors = [st for st in steps if st["outcome"] in FAILURE_OUTCOMES and _step_reason(st)]
        if errors:
            facts["reason"] = _step_reason(errors[-1])
    elif failures or skipped or open_intents:
        status = "completed_with_failures"
    else:
        status = "success"
    return status, facts


@dataclass(frozen=True)
class StepKey:
    """Identifies one step of one task try-independent: the idempotency key of every write."""

    run_key: str
    task_id: str
    map_index: int = -1

    def event_key(self, step: str) -> str:
        return f"{self.run_key}|{self.task_id}|{self.map_index}|{step}"


@dataclass(frozen=True)
class StepEvent:
    step: str
    stage: str
    outcome: str
    cluster: str | None = None
    endpoint: str | None = None
    lob: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class WriteAhead:
    """The handle ``History.write_ahead`` yields: set ``result`` / ``detail`` to record a precise outcome."""

    intent_id: int
    result: str = "changed"
    detail: dict[str, Any] = field(default_factory=dict)


class History:
    """The repository. One instance per engine; methods open short transactions, or join ``conn``."""

    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or get_engine()

    # ---- runs -------------------------------------------------------------------------------------------
    def start_run(self, run_key: str, *, dag_id: str, run_id: str, trigger: str, triggered_by: str | None,
                  params: Mapping[str, Any], plan: Mapping[str, Any] | None = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO runs (run_key, dag_id, run_id, trigger, triggered_by, params, plan) "
                    "VALUES (:k, :d, :r, :t, :u, CAST(:p AS jsonb), CAST(:plan AS jsonb)) "
                    "ON CONFLICT (run_key) DO UPDATE SET plan = COALESCE(EXCLUDED.plan, runs.plan)"
                ),
                {"k": run_key, "d": dag_id, "r": run_id, "t": trigger, "u": triggered_by,
                 "p": _json(dict(params)), "plan": _json(plan) if plan is not None else None},
            )

    def cluster_plan(self, run_key: str, cluster: str) -> dict[str, Any] | None:
        """One cluster's part of the run's plan (``runs.plan``, as ``start_run`` stored it), cut in the database:
        the plan with ``clusters`` holding only that cluster's entry. A rollout's per-cluster tasks read this
        instead of the whole plan, so what each pulls grows with its own cluster's endpoints, not with the fleet's.
        None when the run has no plan or the plan has no such cluster."""
        with self.engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT r.plan - 'clusters' AS rest, c.entry FROM runs r "
                    "CROSS JOIN LATERAL (SELECT e AS entry FROM jsonb_array_elements("
                    "CASE WHEN jsonb_typeof(r.plan -> 'clusters') = 'array' THEN r.plan -> 'clusters' "
                    "ELSE '[]'::jsonb END) e WHERE e ->> 'cluster' = :c LIMIT 1) c "
                    "WHERE r.run_key = :k AND jsonb_typeof(r.plan) = 'object'"
                ),
                {"k": run_key, "c": cluster},
            ).one_or_none()
        if row is None:
            return None
        return {**dict(row.rest), "clusters": [dict(row.entry)]}

    def end_run(self, run_key: str, status: str, summary: Mapping[str, Any] | None = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text("UPDATE runs SET status = :s, summary = CAST(:m AS jsonb), ended_at = now() WHERE run_key = :k"),
                {"k": run_key, "s": status, "m": _json(summary or {})},
            )

    def ensure_run(self, run_key: str, *, dag_id: str | None = None, run_id: str | None = None,
                   trigger: str = "unknown", triggered_by: str | None = None,
                   params: Mapping[str, Any] | None = None, conn: Connection | None = None) -> bool:
        """Open the run's row if no task did (a run that failed before ``start_run``). True if it was created."""
        if conn is None:
            with self.engine.begin() as own:
                return self.ensure_run(run_key, dag_id=dag_id, run_id=run_id, trigger=trigger,
                                       triggered_by=triggered_by, params=params, conn=own)
        dag, _, rid = run_key.partition("/")
        row = conn.execute(
            text("INSERT INTO runs (run_key, dag_id, run_id, trigger, triggered_by, params) "
                 "VALUES (:k, :d, :r, :t, :u, CAST(:p AS jsonb)) ON CONFLICT (run_key) DO NOTHING RETURNING run_key"),
            {"k": run_key, "d": dag_id or dag, "r": run_id or rid, "t": trigger, "u": triggered_by,
             "p": _json(dict(params or {}))},
        ).first()
        return row is not None

    def close_run(self, run_key: str, airflow_state: str, reason: str | None = None, *,
                  dag_id: str | None = None, run_id: str | None = None, trigger: str = "unknown",
                  triggered_by: str | None = None, params: Mapping[str, Any] | None = None,
                  failed_task: str | None = None) -> str:
        """Write the run's terminal status (``derive_status``) from Airflow's final state, creating the run's row
        if the run died before opening it. Called by the DAG-level callbacks (``kvfleet.airflow.run_status``);
        authoritative over whatever a task wrote with ``end_run``. Returns the status."""
        with self.engine.begin() as conn:
            created = self.ensure_run(run_key, dag_id=dag_id, run_id=run_id, trigger=trigger,
                                      triggered_by=triggered_by, params=params, conn=conn)
            conn.execute(text("SELECT 1 FROM runs WHERE run_key = :k FOR UPDATE"), {"k": run_key})
            steps = [dict(r) for r in conn.execute(
                text("SELECT stage, outcome, endpoint, detail FROM step_events WHERE run_key = :k ORDER BY id"),
                {"k": run_key}).mappings()]
            open_intents = int(conn.execute(text(
                "SELECT count(*) FROM audit_log i WHERE i.run_key = :k AND i.kind = 'intent' AND NOT EXISTS "
                "(SELECT 1 FROM audit_log o WHERE o.intent_id = i.id)"), {"k": run_key}).scalar_one())
            status, facts = derive_status(airflow_state, steps, open_intents)
            why = facts.pop("reason", None) or reason
            if failed_task:
                facts["failed_task"] = failed_task
            facts["created_by_callback"] = created
            conn.execute(
                text("UPDATE runs SET status = :s, reason = :why, ended_at = COALESCE(ended_at, now()), "
                     "summary = COALESCE(summary, '{}'::jsonb) || jsonb_build_object('close', CAST(:f AS jsonb)) "
                     "WHERE run_key = :k"),
                {"k": run_key, "s": status, "why": why, "f": _json(facts)},
            )
        return status

    def run(self, run_key: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(text("SELECT * FROM runs WHERE run_key = :k"), {"k": run_key}).mappings().first()
            return dict(row) if row else None

    # ---- steps and audit ---------------------------------------------------------------------------------
    def record_step(self, key: StepKey, event: StepEvent, *, actor: str = "kvfleet",
                    conn: Connection | None = None) -> bool:
        """Insert a step event and its audit-log line in one transaction. False if it was already there."""
        if conn is None:
            with self.engine.begin() as own:
                return self.record_step(key, event, actor=actor, conn=own)
        inserted = conn.execute(
            text(
                "INSERT INTO step_events (run_key, task_id, map_index, step, cluster, endpoint, lob, stage, "
                "outcome, detail) VALUES (:k, :t, :m, :s, :c, :e, :l, :stage, :o, CAST(:d AS jsonb)) "
                "ON CONFLICT (run_key, task_id, map_index, step) DO NOTHING RETURNING id"
            ),
            {"k": key.run_key, "t": key.task_id, "m": key.map_index, "s": event.step, "c": event.cluster,
             "e": event.endpoint, "l": event.lob, "stage": event.stage, "o": event.outcome,
             "d": _json(dict(event.detail))},
        ).first()
        if inserted and event.outcome not in ("unchanged", "planned", "passed"):
            self.audit(key.event_key(event.step), actor=actor, action=f"{event.stage}:{event.outcome}",
                       run_key=key.run_key, cluster=event.cluster, endpoint=event.endpoint,
                       detail={"step": event.step, **dict(event.detail)}, conn=conn)
        return inserted is not None

    def audit(self, event_key: str, *, actor: str, action: str, run_key: str | None = None,
              cluster: str | None = None, endpoint: str | None = None,
              detail: Mapping[str, Any] | None = None, conn: Connection | None = None,
              kind: str = "event", intent_id: int | None = None) -> int | None:
        """One audit-log line (hash-chained by the database on insert). Returns its id, or None if a line with
        this ``event_key`` was already there."""
        if conn is None:
            with self.engine.begin() as own:
                return self.audit(event_key, actor=actor, action=action, run_key=run_key, cluster=cluster,
                                  endpoint=endpoint, detail=detail, conn=own, kind=kind, intent_id=intent_id)
        row = conn.execute(
            text(
                "INSERT INTO audit_log (run_key, event_key, actor, action, cluster, endpoint, detail, kind, "
                "intent_id) VALUES (:k, :ek, :a, :act, :c, :e, CAST(:d AS jsonb), :kind, :iid) "
                "ON CONFLICT (event_key) DO NOTHING RETURNING id"
            ),
            {"k": run_key, "ek": event_key, "a": actor, "act": action, "c": cluster, "e": endpoint,
             "d": _json(dict(detail or {})), "kind": kind, "iid": intent_id},
        ).first()
        return None if row is None else int(row[0])

    # ---- write-ahead records ----------------------------------------------------------------------------------
    def intent(self, key: StepKey, action: str, target: str, detail: Mapping[str, Any] | None = None, *,
               cluster: str | None = None, endpoint: str | None = None, actor: str = "kvfleet") -> int:
        """Record, before a mutating call, that it is about to be made; returns the intent's id for ``outcome``.
        A retried task re-issues the same intent and gets the same id back."""
        event_key = key.event_key(f"intent:{action}:{target}")
        with self.engine.begin() as conn:
            new = self.audit(event_key, actor=actor, action=f"intent:{action}", run_key=key.run_key, cluster=cluster,
                             endpoint=endpoint, detail={"target": target, **dict(detail or {})}, conn=conn,
                             kind="intent")
            if new is not None:
                return new
            return int(conn.execute(text("SELECT id FROM audit_log WHERE event_key = :ek"),
                                    {"ek": event_key}).scalar_one())

    def outcome(self, intent_id: int, result: str, detail: Mapping[str, Any] | None = None, *,
                actor: str | None = None) -> int:
        """Record what became of an intent (``changed``, ``unchanged``, ``failed``, ``refused``, ``observed``...).
        Several outcomes may follow one intent (a retried task); the newest is its state."""
        with self.engine.begin() as conn:
            intent = conn.execute(text("SELECT run_key, actor, action, cluster, endpoint FROM audit_log "
                                       "WHERE id = :i AND kind = 'intent'"), {"i": intent_id}).mappings().first()
            if intent is None:
                raise ValueError(f"intent {intent_id} does not exist")
            n = int(conn.execute(text("SELECT count(*) FROM audit_log WHERE intent_id = :i"),
                                 {"i": intent_id}).scalar_one())
            new = self.audit(f"outcome|{intent_id}|{n + 1}", actor=actor or intent["actor"],
                             action=f"outcome:{result}", run_key=intent["run_key"], cluster=intent["cluster"],
                             endpoint=intent["endpoint"], detail={"result": result, **dict(detail or {})},
                             conn=conn, kind="outcome", intent_id=intent_id)
            assert new is not None
            return new

    @contextlib.contextmanager
    def write_ahead(self, key: StepKey, action: str, target: str, detail: Mapping[str, Any] | None = None, *,
                    cluster: str | None = None, endpoint: str | None = None,
                    actor: str = "kvfleet") -> Iterator[WriteAhead]:
        """Wrap one mutating call: the intent is written before the block, the outcome after it (``changed``
        unless the block sets ``wa.result``; ``refused`` for a PermanentError, ``failed`` for any other
        exception, which is re-raised). A process killed inside the block leaves only the intent, which
        `kvfleet audit` shows as ``unknown — check live state``."""
        from kvfleet.errors import PermanentError

        wa = WriteAhead(self.intent(key, action, target, detail, cluster=cluster, endpoint=endpoint, actor=actor))
        try:
            yield wa
        except PermanentError as exc:
            self.outcome(wa.intent_id, "refused", {"error": f"{type(exc).__name__}: {str(exc)[:500]}"})
            raise
        except Exception as exc:  # a KeyboardInterrupt or SIGTERM leaves the intent open: nobody knows
            self.outcome(wa.intent_id, "failed", {"error": f"{type(exc).__name__}: {str(exc)[:500]}"})
            raise
        self.outcome(wa.intent_id, wa.result, wa.detail)

    def open_intents(self, *, cluster: str | None = None, endpoint: str | None = None,
                     run_key: str | None = None) -> list[dict[str, Any]]:
        """Intents with no outcome: changes that may or may not have happened."""
        return self.query("open_intents", cluster=cluster, endpoint=endpoint, run_key=run_key)

    def resolve_intent(self, intent_id: int, observed: Mapping[str, Any], *, run_key: str) -> int:
        """The next run or the drift check looked at the live state an open intent was about: record what it
        saw as the intent's outcome (``observed``)."""
        return self.outcome(intent_id, "observed", {"observed": dict(observed), "by_run": run_key})

    # ---- tamper evidence ------------------------------------------------------------------------------------
    def verify_chain(self) -> dict[str, Any]:
        """Walk the audit log's hash chain in ``seq`` order, recomputing each hash here (SHA-256 over the previous
        hash and the row's canonical JSON). Returns {ok, rows, head, broken: None | {id, seq, problem}}."""
        sql = (sql_dir() / "queries" / "audit_chain.sql").read_text()
        expected_prev, expected_seq, rows = GENESIS_HASH, 1, 0
        with self.engine.connect() as conn:
            result = conn.execution_options(stream_results=True, yield_per=1000).execute(text(sql))
            for r in result.mappings():
                rows += 1
                problem = None
                if r["seq"] is None or r["seq"] != expected_seq:
                    problem = (f"sequence {r['seq']} where {expected_seq} was expected: a row was deleted, or "
                               "inserted outside the chain")
                elif r["prev_hash"] != expected_prev:
                    problem = "its prev_hash is not the hash of the row before it: the chain was rewritten"
                else:
                    digest = hashlib.sha256((r["prev_hash"] + r["canonical"]).encode()).hexdigest()
                    if digest != r["row_hash"]:
                        problem = "its content does not match its hash: the row was changed after it was written"
                if problem:
                    return {"ok": False, "rows": rows, "head": None,
                            "broken": {"id": r["id"], "seq": r["seq"], "event_key": r["event_key"],
                                       "problem": problem}}
                expected_prev, expected_seq = r["row_hash"], expected_seq + 1
        return {"ok": True, "rows": rows, "head": {"seq": expected_seq - 1, "hash": expected_prev}, "broken": None}

    def cluster_of_task(self, key: StepKey) -> str | None:
        """The cluster a task instance worked on, from what it recorded (its steps, then its write-ahead
        records); None when it recorded nothing with a cluster."""
        with self.engine.connect() as conn:
            row = conn.execute(text(
                "SELECT cluster FROM step_events WHERE run_key = :k AND task_id = :t AND map_index = :m "
                "AND cluster IS NOT NULL ORDER BY id LIMIT 1"), {"k": key.run_key, "t": key.task_id,
                                                               "m": key.map_index}).first()
            if row is None:
                row = conn.execute(text(
                    "SELECT cluster FROM audit_log WHERE run_key = :k AND event_key LIKE :prefix "
                    "AND cluster IS NOT NULL ORDER BY id LIMIT 1"),
                    {"k": key.run_key, "prefix": key.event_key("").replace("%", r"\%").replace("_", r"\_") + "%"}
                ).first()
        return None if row is None else str(row[0])

    def steps(self, run_key: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT * FROM step_events WHERE run_key = :k ORDER BY id"), {"k": run_key}
            ).mappings()
            return [dict(r) for r in rows]

    # ---- verifications, Curvine, capacity --------------------------------------------------------------
    def record_verification(self, key: StepKey, step: str, result: Mapping[str, Any]) -> bool:
        cols = ("cluster", "endpoint", "lob", "instance_type", "prompt_tokens", "stored_tokens", "hit_tokens",
                "hit_ratio", "l2_read_ms", "ttft_cold_ms", "ttft_warm_ms", "speedup", "expected_speedup",
                "verdict", "diagnosis")
        values = {c: result.get(c) for c in cols}
        with self.engine.begin() as conn:
            row = conn.execute(
                text(
                    f"INSERT INTO hit_verifications (run_key, task_id, map_index, step, {', '.join(cols)}, detail) "
                    f"VALUES (:run_key, :task_id, :map_index, :step, {', '.join(':' + c for c in cols)}, "
                    "CAST(:detail AS jsonb)) ON CONFLICT (run_key, task_id, map_index, step) DO NOTHING RETURNING id"
                ),
                {"run_key": key.run_key, "task_id": key.task_id, "map_index": key.map_index, "step": step,
                 **values, "detail": _json(dict(result.get("detail") or {}))},
            ).first()
            return row is not None

    def record_curvine_release(self, *, cluster: str, namespace: str, release: str, revision: int,
                               chart_version: str | None, status: str | None, flags: Mapping[str, bool | None],
                               values: Mapping[str, Any], run_key: str | None,
                               helm_updated: str | None = None) -> None:
        """One helm revision of a Curvine release. A row for the same revision number with another ``updated``
        time is a release installed anew (after an uninstall): it is replaced, not kept."""
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO curvine_releases (cluster, namespace, release, revision, chart_version, status, "
                    "format_master, format_worker, format_journal, values, run_key, helm_updated) VALUES (:c, :n, "
                    ":r, :rev, :v, :s, :fm, :fw, :fj, CAST(:vals AS jsonb), :k, :u) ON CONFLICT (cluster, "
                    "namespace, release, revision) DO UPDATE SET status = EXCLUDED.status, chart_version = "
                    "EXCLUDED.chart_version, format_master = EXCLUDED.format_master, format_worker = "
                    "EXCLUDED.format_worker, format_journal = EXCLUDED.format_journal, values = EXCLUDED.values, "
                    "helm_updated = EXCLUDED.helm_updated, "
                    # another "updated" time: a new release under a reused number, recorded by this run, now
                    "run_key = CASE WHEN curvine_releases.helm_updated IS DISTINCT FROM EXCLUDED.helm_updated "
                    "THEN EXCLUDED.run_key ELSE COALESCE(EXCLUDED.run_key, curvine_releases.run_key) END, "
                    "recorded_at = CASE WHEN curvine_releases.helm_updated IS DISTINCT FROM EXCLUDED.helm_updated "
                    "THEN now() ELSE curvine_releases.recorded_at END"
                ),
                {"c": cluster, "n": namespace, "r": release, "rev": revision, "v": chart_version, "s": status,
                 "fm": flags.get("formatMaster"), "fw": flags.get("formatWorker"),
                 "fj": flags.get("formatJournal"), "vals": _json(dict(values)), "k": run_key, "u": helm_updated},
            )

    def curvine_revisions(self, cluster: str, namespace: str, release: str) -> dict[int, dict[str, Any]]:
        """Recorded revisions of a release: revision -> {status, helm_updated, flags}."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT revision, status, helm_updated, format_master, format_worker, format_journal "
                     "FROM curvine_releases WHERE cluster = :c AND namespace = :n AND release = :r"),
                {"c": cluster, "n": namespace, "r": release},
            ).mappings()
            return {int(r["revision"]): {"status": r["status"], "helm_updated": r["helm_updated"],
                                         "flags": {"formatMaster": r["format_master"],
                                                   "formatWorker": r["format_worker"],
                                                   "formatJournal": r["format_journal"]}} for r in rows}

    def set_curvine_release_status(self, *, cluster: str, namespace: str, release: str, revision: int,
                                   status: str | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text("UPDATE curvine_releases SET status = :s WHERE cluster = :c AND namespace = :n "
                     "AND release = :r AND revision = :rev"),
                {"s": status, "c": cluster, "n": namespace, "r": release, "rev": revision},
            )

    def record_capacity(self, *, run_key: str | None, step: str, cluster: str, phase: str,
                        overview: Mapping[str, Any]) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO capacity_snapshots (run_key, step, cluster, phase, capacity_bytes, fs_used_bytes, "
                    "live_workers, lost_workers, files_total, dirs_total, detail) VALUES (:k, :s, :c, :p, :cap, "
                    ":used, :live, :lost, :files, :dirs, CAST(:d AS jsonb)) "
                    "ON CONFLICT (run_key, step, cluster, phase) DO NOTHING"
                ),
                {"k": run_key, "s": step, "c": cluster, "p": phase, "cap": overview.get("capacity"),
                 "used": overview.get("fs_used"), "live": overview.get("live_workers"),
                 "lost": overview.get("lost_workers"), "files": overview.get("files_total"),
                 "dirs": overview.get("dir_total"), "d": _json(dict(overview))},
            )

    # ---- drift -------------------------------------------------------------------------------------------
    def sync_findings(self, cluster: str, findings: Iterable[Mapping[str, Any]], run_key: str,
                      scope_kinds: Iterable[str] | None = None) -> dict[str, int]:
        """Open new findings, touch the ones still seen, resolve the ones no longer seen (for this cluster)."""
        # One order for every writer (endpoint, then fingerprint): two checks of one cluster at once (the schedule
        # and the watch) lock the same rows, and migration 0009's endpoint_state rows, in the same order.
        seen = {f["fingerprint"]: f for f in sorted(findings, key=lambda f: (str(f.get("endpoint") or ""),
                                                                             str(f["fingerprint"])))}
        opened = touched = 0
        with self.engine.begin() as conn:
            for fp, f in seen.items():
                row = conn.execute(
                    text("UPDATE drift_findings SET last_seen = now(), last_run_key = :k, actual = :a "
                         "WHERE fingerprint = :fp AND resolved_at IS NULL RETURNING id"),
                    {"k": run_key, "a": f.get("actual"), "fp": fp},
                ).first()
                if row:
                    touched += 1
                    continue
                conn.execute(
                    text(
                        "INSERT INTO drift_findings (fingerprint, cluster, lob, endpoint, kind, severity, object_ref, "
                        "field, expected, actual, first_run_key, last_run_key) VALUES (:fp, :c, :lob, :e, :kind, "
                        ":sev, :obj, :field, :exp, :act, :k, :k)"
                    ),
                    {"fp": fp, "c": cluster, "lob": f.get("lob"), "e": f.get("endpoint"), "kind": f["kind"],
                     "sev": f["severity"], "obj": f["object_ref"], "field": f.get("field"),
                     "exp": f.get("expected"), "act": f.get("actual"), "k": run_key},
                )
                opened += 1
            stmt = text(
                "UPDATE drift_findings SET resolved_at = now(), last_run_key = :k, resolution = 'gone' "
                "WHERE cluster = :c "
                "AND resolved_at IS NULL AND NOT (fingerprint = ANY(:fps))"
                + (" AND kind = ANY(:kinds)" if scope_kinds is not None else "")
                + " RETURNING id"
            )
            params: dict[str, Any] = {"k": run_key, "c": cluster, "fps": list(seen)}
            if scope_kinds is not None:
                params["kinds"] = list(scope_kinds)
            resolved = len(conn.execute(stmt, params).fetchall())
        return {"opened": opened, "still_open": touched, "resolved": resolved}

    def record_remediation(self, fingerprint: str, remediation: Mapping[str, Any]) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text("UPDATE drift_findings SET remediation = CAST(:r AS jsonb) WHERE fingerprint = :fp "
                     "AND resolved_at IS NULL"),
                {"r": _json(dict(remediation)), "fp": fingerprint},
            )

    def resolve_remediated(self, cluster: str, fingerprints: Iterable[str], run_key: str) -> int:
        """Resolve the open findings this run remediated and then no longer observed (resolution
        ``remediated``), so they do not stay open until the next check. Returns how many were resolved."""
        fps = list(fingerprints)
        if not fps:
            return 0
        with self.engine.begin() as conn:
            rows = conn.execute(
                text("UPDATE drift_findings SET resolved_at = now(), last_run_key = :k, resolution = 'remediated' "
                     "WHERE cluster = :c AND resolved_at IS NULL AND fingerprint = ANY(:fps) RETURNING id"),
                {"k": run_key, "c": cluster, "fps": fps},
            ).fetchall()
        return len(rows)

    def watch(self, cluster: str, watch: str, present: bool, run_key: str | None = None) -> datetime | None:
        """Since when a thresholded condition has been seen (opened now if new); None, and forgotten, when the
        condition is gone. Used by the drift check to date an operator scaled to 0 by hand."""
        with self.engine.begin() as conn:
            if not present:
                conn.execute(text("DELETE FROM drift_watches WHERE cluster = :c AND watch = :w"),
                             {"c": cluster, "w": watch})
                return None
            conn.execute(text("INSERT INTO drift_watches (cluster, watch, run_key) VALUES (:c, :w, :k) "
                              "ON CONFLICT (cluster, watch) DO NOTHING"), {"c": cluster, "w": watch, "k": run_key})
            since = conn.execute(text("SELECT since FROM drift_watches WHERE cluster = :c AND watch = :w"),
                                 {"c": cluster, "w": watch}).scalar_one()
            return since  # type: ignore[no-any-return]

    # ---- cluster leases ----------------------------------------------------------------------------------------
    def try_lock(self, cluster: str, holder: str, purpose: str, ttl_s: float) -> dict[str, Any]:
        """Take the cluster's lease if it is free, expired, or already ours; return the row now in place."""
        with self.engine.begin() as conn:
            row = conn.execute(
                text(
                    "INSERT INTO cluster_locks (cluster, holder, purpose, expires_at) "
                    "VALUES (:c, :h, :p, now() + make_interval(secs => :ttl)) "
                    "ON CONFLICT (cluster) DO UPDATE SET holder = EXCLUDED.holder, purpose = EXCLUDED.purpose, "
                    "acquired_at = CASE WHEN cluster_locks.holder = EXCLUDED.holder THEN cluster_locks.acquired_at "
                    "ELSE now() END, heartbeat_at = now(), expires_at = EXCLUDED.expires_at "
                    "WHERE cluster_locks.holder = EXCLUDED.holder OR cluster_locks.expires_at < now() "
                    "RETURNING *"
                ),
                {"c": cluster, "h": holder, "p": purpose, "ttl": ttl_s},
            ).mappings().first()
            if row is None:
                row = conn.execute(text("SELECT * FROM cluster_locks WHERE cluster = :c"),
                                   {"c": cluster}).mappings().first()
            return dict(row) if row else {}

    def heartbeat_lock(self, cluster: str, holder: str, ttl_s: float) -> bool:
        with self.engine.begin() as conn:
            row = conn.execute(
                text("UPDATE cluster_locks SET heartbeat_at = now(), expires_at = now() + make_interval(secs => :ttl) "
                     "WHERE cluster = :c AND holder = :h RETURNING cluster"),
                {"c": cluster, "h": holder, "ttl": ttl_s},
            ).first()
            return row is not None

    def release_lock(self, cluster: str, holder: str) -> bool:
        with self.engine.begin() as conn:
            row = conn.execute(text("DELETE FROM cluster_locks WHERE cluster = :c AND holder = :h RETURNING cluster"),
                               {"c": cluster, "h": holder}).first()
            return row is not None

    def lock_of(self, cluster: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(text("SELECT *, expires_at < now() AS expired FROM cluster_locks WHERE cluster = :c"),
                               {"c": cluster}).mappings().first()
            return dict(row) if row else None

    # ---- named queries -------------------------------------------------------------------------------------
    def query(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """Run ``sql/queries/<name>.sql`` with bound parameters; returns rows as dicts."""
        sql = (sql_dir() / "queries" / f"{name}.sql").read_text()
        stmt = text(sql)
        for key, value in params.items():
            if isinstance(value, dict | list):
                stmt = stmt.bindparams(bindparam(key, type_=JSONB))
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(stmt, params).mappings()]

    def page(self, name: str, *, limit: int, after: str | None = None,
             **params: Any) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a keyset-paged named query (``PAGED``): at most ``limit`` rows after the cursor ``after``
        (None: the first page), and the cursor of the next page (None when this page is the last). A cursor
        names its query, so one from another query is refused (ValueError)."""
        keys = PAGED[name]
        values = decode_cursor(name, after) if after else [None] * len(keys)
        binds = {**params, **{f"after_{k}": v for k, v in zip(keys, values, strict=True)}, "limit": limit + 1}
        rows = self.query(name, **binds)
        if len(rows) <= limit:
            return rows, None
        rows = rows[:limit]
        return rows, encode_cursor(name, [rows[-1][k] for k in keys])


# Keyset-paged named queries and the columns of their cursor (their ORDER BY).
PAGED: dict[str, tuple[str, ...]] = {
    "verifications_page": ("at", "id"),
    "drift_page": ("first_seen", "id"),
    "open_drift_page": ("first_seen", "cluster", "kind", "id"),
}


def encode_cursor(name: str, values: Iterable[Any]) -> str:
    """An opaque page cursor: the query's name and the last row's sort key, as URL-safe base64 of JSON."""
    raw = json.dumps([name, [v.isoformat() if isinstance(v, datetime) else v for v in values]],
                     separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(name: str, cursor: str) -> list[Any]:
    """The sort key a cursor of ``name`` carries; ValueError naming the problem for anything else."""
    keys = PAGED[name]
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        got_name, values = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--after: {cursor[:80]!r} is not a page cursor; pass the 'next' value a previous page "
                         "printed") from exc
    if got_name != name or not isinstance(values, list) or len(values) != len(keys):
        raise ValueError(f"--after: the cursor is for another listing ({str(got_name)[:40]!r}), not {name!r}; pass "
                         "the 'next' value this listing printed")
    out: list[Any] = []
    for key, value in zip(keys, values, strict=True):
        if key in ("cluster", "kind") and not isinstance(value, str):
            raise ValueError(f"--after: the cursor's {key} {value!r} is not text; pass the 'next' value a previous "
                             "page printed")
        if key == "id" and (type(value) is not int or not 0 <= value < 2**63):  # bool is an int; ids are bigint
            raise ValueError(f"--after: the cursor's {key} {value!r} is not a row id (a whole number from 0 to "
                             "2^63-1); pass the 'next' value a previous page printed")
        if key in ("at", "first_seen"):
            try:
                value = datetime.fromisoformat(str(value))
            except ValueError:
                raise ValueError(f"--after: the cursor's {key} {value!r} is not a time; pass the 'next' value a "
                                 "previous page printed") from None
        out.append(value)
    return out


MAX_SINCE_DAYS = 36_500  # a hundred years: older than any history


def since_to_timedelta(since: str) -> timedelta:
    """'7d', '12h', '30m' -> timedelta. A clear error for anything else."""
    units = {"d": ("days", 1), "h": ("hours", 24), "m": ("minutes", 24 * 60)}
    if len(since) >= 2 and since[:-1].isascii() and since[:-1].isdigit() and since[-1] in units:
        name, per_day = units[since[-1]]
        if int(since[:-1]) > MAX_SINCE_DAYS * per_day:
            raise ValueError(f"--since: {since} is out of range: at most {MAX_SINCE_DAYS}d "
                             f"({MAX_SINCE_DAYS * per_day}{since[-1]}); use a smaller duration")
        return timedelta(**{name: int(since[:-1])})
    raise ValueError(f"--since: {since!r} is not a duration like 7d, 12h or 30m")


def since_cutoff(since: str, now: datetime) -> datetime:
    return now - since_to_timedelta(since)
