"""The audit log: hash-chained lines, and the write-ahead records (an intent before a mutating call, its
outcome after it).

Called by the stage reconcilers (``StageContext.write_ahead``), by ``Runs.record_step`` (a step's audit line,
in the step's transaction), by the drift check (closing open intents it observed) and by `kvfleet audit
verify` (the chain walk). The database chains each line on insert (migration 0005); ``verify_chain`` recomputes
the chain here.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, text

from kvfleet.history.clusters import filter_values
from kvfleet.history.db import get_engine
from kvfleet.history.keys import StepKey, json_param
from kvfleet.history.queries import run_query
from kvfleet.outcomes import Status
from kvfleet.paths import sql_dir

GENESIS_HASH = "0" * 64


@dataclass
class WriteAhead:
    """The handle ``AuditLog.write_ahead`` yields: set ``result`` / ``detail`` to record a precise outcome."""

    intent_id: int
    result: str = Status.CHANGED
    detail: dict[str, Any] = field(default_factory=dict)


class AuditLog:
    """Audit lines and write-ahead records. Methods open short transactions, or join ``conn``."""

    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or get_engine()

    def record(self, event_key: str, *, actor: str, action: str, run_key: str | None = None,
               cluster: str | None = None, endpoint: str | None = None,
               detail: Mapping[str, Any] | None = None, conn: Connection | None = None,
               kind: str = "event", intent_id: int | None = None) -> int | None:
        """One audit-log line (hash-chained by the database on insert). Returns its id, or None if a line with
        this ``event_key`` was already there."""
        if conn is None:
            with self.engine.begin() as own:
                return self.record(event_key, actor=actor, action=action, run_key=run_key, cluster=cluster,
                                   endpoint=endpoint, detail=detail, conn=own, kind=kind, intent_id=intent_id)
        row = conn.execute(
            text(
                "INSERT INTO audit_log (run_key, event_key, actor, action, cluster, endpoint, detail, kind, "
                "intent_id) VALUES (:k, :ek, :a, :act, :c, :e, CAST(:d AS jsonb), :kind, :iid) "
                "ON CONFLICT (event_key) DO NOTHING RETURNING id"
            ),
            {"k": run_key, "ek": event_key, "a": actor, "act": action, "c": cluster, "e": endpoint,
             "d": json_param(dict(detail or {})), "kind": kind, "iid": intent_id},
        ).first()
        return None if row is None else int(row[0])

    # ---- write-ahead records ----------------------------------------------------------------------------------
    def intent(self, key: StepKey, action: str, target: str, detail: Mapping[str, Any] | None = None, *,
               cluster: str | None = None, endpoint: str | None = None, actor: str = "kvfleet") -> int:
        """Record, before a mutating call, that it is about to be made; returns the intent's id for ``outcome``.
        A retried task re-issues the same intent and gets the same id back."""
        event_key = key.event_key(f"intent:{action}:{target}")
        with self.engine.begin() as conn:
            new = self.record(event_key, actor=actor, action=f"intent:{action}", run_key=key.run_key,
                              cluster=cluster, endpoint=endpoint, detail={"target": target, **dict(detail or {})},
                              conn=conn, kind="intent")
            if new is not None:
                return new
            return int(conn.execute(text("SELECT id FROM audit_log WHERE event_key = :ek"),
                                    {"ek": event_key}).scalar_one())

    def outcome(self, intent_id: int, result: str, detail: Mapping[str, Any] | None = None, *,
                actor: str | None = None) -> int:
        """Record what became of an intent (a ``Status``: changed, unchanged, failed, refused, observed...).
        Several outcomes may follow one intent (a retried task); the newest is its state."""
        result = str(result)
        with self.engine.begin() as conn:
            intent = conn.execute(text("SELECT run_key, actor, action, cluster, endpoint FROM audit_log "
                                       "WHERE id = :i AND kind = 'intent'"), {"i": intent_id}).mappings().first()
            if intent is None:
                raise ValueError(f"intent {intent_id} does not exist")
            n = int(conn.execute(text("SELECT count(*) FROM audit_log WHERE intent_id = :i"),
                                 {"i": intent_id}).scalar_one())
            new = self.record(f"outcome|{intent_id}|{n + 1}", actor=actor or intent["actor"],
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
            self.outcome(wa.intent_id, Status.REFUSED, {"error": f"{type(exc).__name__}: {str(exc)[:500]}"})
            raise
        except Exception as exc:  # a KeyboardInterrupt or SIGTERM leaves the intent open: nobody knows
            self.outcome(wa.intent_id, Status.FAILED, {"error": f"{type(exc).__name__}: {str(exc)[:500]}"})
            raise
        self.outcome(wa.intent_id, wa.result, wa.detail)

    def open_intents(self, *, cluster: str | None = None, endpoint: str | None = None,
                     run_key: str | None = None) -> list[dict[str, Any]]:
        """Intents with no outcome: changes that may or may not have happened. ``cluster``: a key or a bare name
        (``kvfleet.history.clusters``: older rows name a cluster by its name)."""
        return run_query(self.engine, "open_intents", clusters=filter_values(self.engine, cluster),
                         endpoint=endpoint, run_key=run_key)

    def resolve_intent(self, intent_id: int, observed: Mapping[str, Any], *, run_key: str) -> int:
        """The next run or the drift check looked at the live state an open intent was about: record what it
        saw as the intent's outcome (``observed``)."""
        return self.outcome(intent_id, Status.OBSERVED, {"observed": dict(observed), "by_run": run_key})

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
                problem = _chain_problem(r, expected_seq, expected_prev)
                if problem:
                    return {"ok": False, "rows": rows, "head": None,
                            "broken": {"id": r["id"], "seq": r["seq"], "event_key": r["event_key"],
                                       "problem": problem}}
                expected_prev, expected_seq = r["row_hash"], expected_seq + 1
        return {"ok": True, "rows": rows, "head": {"seq": expected_seq - 1, "hash": expected_prev}, "broken": None}


def _chain_problem(r: Mapping[Any, Any], expected_seq: int, expected_prev: str) -> str | None:
    if r["seq"] is None or r["seq"] != expected_seq:
        return (f"sequence {r['seq']} where {expected_seq} was expected: a row was deleted, or inserted outside "
                "the chain")
    if r["prev_hash"] != expected_prev:
        return "its prev_hash is not the hash of the row before it: the chain was rewritten"
    digest = hashlib.sha256((r["prev_hash"] + r["canonical"]).encode()).hexdigest()
    if digest != r["row_hash"]:
        return "its content does not match its hash: the row was changed after it was written"
    return None
