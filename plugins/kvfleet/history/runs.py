"""Runs and their steps: a DAG run's row (opened, given its plan, closed with its terminal status) and the step
events its tasks record.

Called by the DAG tasks (open, plan, summary), by the run-level callbacks (``kvfleet.airflow.run_status``:
the terminal status, a failed task's error step) and by the stage reconcilers (``StageContext.record``, in the
same transaction as the step's audit line).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, text

from kvfleet.history.audit import AuditLog
from kvfleet.history.db import get_engine
from kvfleet.history.keys import StepEvent, StepKey, json_param
from kvfleet.outcomes import QUIET, derive_status

if TYPE_CHECKING:
    from kvfleet.fleet.pinning import Pinned


class Runs:
    """Runs and step events. One instance per engine; methods open short transactions, or join ``conn``."""

    def __init__(self, engine: Engine | None = None, audit: AuditLog | None = None) -> None:
        self.engine = engine or get_engine()
        self.audit = audit or AuditLog(self.engine)

    def start(self, run_key: str, *, dag_id: str, run_id: str, trigger: str, triggered_by: str | None,
              params: Mapping[str, Any], plan: Mapping[str, Any] | None = None,
              inventory: Pinned | None = None) -> None:
        """Open the run's row, with its plan and the inventory it applies (stored once per digest). Called again by a
        cleared first task, it keeps the row and takes the new plan and inventory."""
        row: dict[str, Any] = {"k": run_key, "d": dag_id, "r": run_id, "t": trigger, "u": triggered_by,
                               "p": json_param(dict(params)), "plan": json_param(plan) if plan is not None else None}
        columns, values, kept = "", "", ""
        if inventory is not None:
            row.update(h=inventory.sha256, c=inventory.commit, dirty=inventory.dirty)
            columns, values = ", inventory_sha256, inventory_commit, inventory_dirty", ", :h, :c, :dirty"
            kept = (", inventory_sha256 = EXCLUDED.inventory_sha256, inventory_commit = EXCLUDED.inventory_commit, "
                    "inventory_dirty = EXCLUDED.inventory_dirty")
        with self.engine.begin() as conn:
            if inventory is not None:
                conn.execute(text("INSERT INTO inventory_snapshots (sha256, body, source) VALUES (:h, :b, :s) "
                                  "ON CONFLICT (sha256) DO NOTHING"),
                             {"h": inventory.sha256, "b": inventory.body, "s": inventory.source})
            conn.execute(text(
                f"INSERT INTO runs (run_key, dag_id, run_id, trigger, triggered_by, params, plan{columns}) "
                f"VALUES (:k, :d, :r, :t, :u, CAST(:p AS jsonb), CAST(:plan AS jsonb){values}) "
                f"ON CONFLICT (run_key) DO UPDATE SET plan = COALESCE(EXCLUDED.plan, runs.plan){kept}"), row)

    def pinned(self, run_key: str) -> dict[str, Any] | None:
        """The inventory the run applies, as its first task pinned it (the fields of
        ``kvfleet.fleet.pinning.Pinned``); None when the run has none (no such run, a run recorded before revision
        0010, or one whose first task has not run)."""
        with self.engine.connect() as conn:
            row = conn.execute(text(
                "SELECT s.body, s.sha256, s.source, r.inventory_commit AS commit, r.inventory_dirty AS dirty "
                "FROM runs r JOIN inventory_snapshots s ON s.sha256 = r.inventory_sha256 WHERE r.run_key = :k"),
                {"k": run_key}).mappings().first()
        return None if row is None else dict(row)

    def cluster_plan(self, run_key: str, cluster: str) -> dict[str, Any] | None:
        """One cluster's part of the run's plan (``runs.plan``, as ``start`` stored it), cut in the database:
        the plan with ``clusters`` holding only that cluster's entry. A rollout's per-cluster tasks read this
        instead of the whole plan, so what each pulls grows with its own cluster's endpoints, not with the fleet's.
        None when the run has no plan or the plan has no such cluster."""
        with self.engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT r.plan - 'clusters' AS rest, c.entry FROM runs r "
                    "CROSS JOIN LATERAL (SELECT e AS entry FROM jsonb_array_elements("
                    "CASE WHEN jsonb_typeof(r.plan -> 'clusters') = 'array' THEN r.plan -> 'clusters' "
                    "ELSE '[]'::jsonb END) e WHERE :c IN (e ->> 'key', e ->> 'cluster') LIMIT 1) c "
                    "WHERE r.run_key = :k AND jsonb_typeof(r.plan) = 'object'"
                ),
                {"k": run_key, "c": cluster},
            ).one_or_none()
        if row is None:
            return None
        return {**dict(row.rest), "clusters": [dict(row.entry)]}

    def end(self, run_key: str, status: str, summary: Mapping[str, Any] | None = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text("UPDATE runs SET status = :s, summary = CAST(:m AS jsonb), ended_at = now() WHERE run_key = :k"),
                {"k": run_key, "s": str(status), "m": json_param(summary or {})},
            )

    def ensure(self, run_key: str, *, dag_id: str | None = None, run_id: str | None = None,
               trigger: str = "unknown", triggered_by: str | None = None,
               params: Mapping[str, Any] | None = None, conn: Connection | None = None) -> bool:
        """Open the run's row if no task did (a run that failed before ``start``). True if it was created."""
        if conn is None:
            with self.engine.begin() as own:
                return self.ensure(run_key, dag_id=dag_id, run_id=run_id, trigger=trigger,
                                   triggered_by=triggered_by, params=params, conn=own)
        dag, _, rid = run_key.partition("/")
        row = conn.execute(
            text("INSERT INTO runs (run_key, dag_id, run_id, trigger, triggered_by, params) "
                 "VALUES (:k, :d, :r, :t, :u, CAST(:p AS jsonb)) ON CONFLICT (run_key) DO NOTHING RETURNING run_key"),
            {"k": run_key, "d": dag_id or dag, "r": run_id or rid, "t": trigger, "u": triggered_by,
             "p": json_param(dict(params or {}))},
        ).first()
        return row is not None

    def close(self, run_key: str, airflow_state: str, reason: str | None = None, *,
              dag_id: str | None = None, run_id: str | None = None, trigger: str = "unknown",
              triggered_by: str | None = None, params: Mapping[str, Any] | None = None,
              failed_task: str | None = None) -> str:
        """Write the run's terminal status (``derive_status``) from Airflow's final state, creating the run's row
        if the run died before opening it. Called by the DAG-level callbacks (``kvfleet.airflow.run_status``);
        authoritative over whatever a task wrote with ``end``. Returns the status."""
        with self.engine.begin() as conn:
            created = self.ensure(run_key, dag_id=dag_id, run_id=run_id, trigger=trigger,
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
                {"k": run_key, "s": status.value, "why": why, "f": json_param(facts)},
            )
        return status.value

    def get(self, run_key: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(text("SELECT * FROM runs WHERE run_key = :k"), {"k": run_key}).mappings().first()
            return dict(row) if row else None

    # ---- steps ----------------------------------------------------------------------------------------------
    def record_step(self, key: StepKey, event: StepEvent, *, actor: str = "kvfleet",
                    conn: Connection | None = None) -> bool:
        """Insert a step event and its audit-log line in one transaction. False if it was already there."""
        if conn is None:
            with self.engine.begin() as own:
                return self.record_step(key, event, actor=actor, conn=own)
        outcome = str(event.outcome)
        inserted = conn.execute(
            text(
                "INSERT INTO step_events (run_key, task_id, map_index, step, cluster, endpoint, lob, stage, "
                "outcome, detail) VALUES (:k, :t, :m, :s, :c, :e, :l, :stage, :o, CAST(:d AS jsonb)) "
                "ON CONFLICT (run_key, task_id, map_index, step) DO NOTHING RETURNING id"
            ),
            {"k": key.run_key, "t": key.task_id, "m": key.map_index, "s": event.step, "c": event.cluster,
             "e": event.endpoint, "l": event.lob, "stage": event.stage, "o": outcome,
             "d": json_param(dict(event.detail))},
        ).first()
        if inserted and outcome not in QUIET:
            self.audit.record(key.event_key(event.step), actor=actor, action=f"{event.stage}:{outcome}",
                              run_key=key.run_key, cluster=event.cluster, endpoint=event.endpoint,
                              detail={"step": event.step, **dict(event.detail)}, conn=conn)
        return inserted is not None

    def steps(self, run_key: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT * FROM step_events WHERE run_key = :k ORDER BY id"), {"k": run_key}
            ).mappings()
            return [dict(r) for r in rows]

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
