"""Freezes and emergency stops: who holds kvfleet's mutating runs back, where, why, and since when.

Called by `kvfleet freeze on|off|list` and `kvfleet stop` (``kvfleet.cli``), by the kvfleet page (the Fleet view
lists the active freezes), and by the stages at a run's start and at each safe point, through the one check
``Holds.holding``. The rows live in ``holds`` (migration 0012); each freeze, lift and stop is also a line of the
audit log, written in the same transaction.

- A **freeze** covers the whole fleet, a LOB or a cluster until it is lifted: no mutating run starts in its scope,
  and one in flight stops at its next safe point. There is at most one active freeze per scope, so `freeze on` on a
  frozen scope returns the freeze in force; lifting a scope with no active freeze is refused (``NotFrozen``).
- A **stop** covers the whole fleet, a cluster or one run (a LOB too, for a caller other than the CLI), and holds
  only the runs that were in flight when it was given: requested at or after the run started. A run started later
  is not stopped, so a stop is never lifted.

Where both hold a run, the stop is returned: it asks for the nearer safe point.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY

from kvfleet.history.audit import AuditLog
from kvfleet.history.db import get_engine
from kvfleet.history.queries import run_query

FREEZE, STOP = "freeze", "stop"
ALL, LOB, CLUSTER, RUN = "all", "lob", "cluster", "run"
LEVELS = (ALL, LOB, CLUSTER, RUN)
MAX_REASON = 500  # the table's CHECK holds the same bound
MAX_NAME = 500
MAX_BY = 200


class HoldError(ValueError):
    """A freeze, lift or stop refused before anything was written: the message names the field, the value and
    the fix."""


class NotFrozen(HoldError):
    """``lift`` of a scope that has no active freeze."""


def checked_text(field: str, value: object, limit: int) -> str:
    """``value`` stripped, or HoldError naming ``field``: required, one printable line, at most ``limit``
    characters."""
    if not isinstance(value, str) or not value.strip():
        raise HoldError(f"{field} is required and may not be empty: say it in words")
    value = value.strip()
    if len(value) > limit:
        raise HoldError(f"{field} is {len(value)} characters long: at most {limit}; shorten it")
    if not value.isprintable():
        raise HoldError(f"{field} {value[:60]!r} holds a control character (a newline, a tab...): write it as one "
                        "line of printable text")
    return value


@dataclass(frozen=True)
class Scope:
    """What a hold covers: ``all`` (``name`` empty), ``lob`` (a LOB's name), ``cluster`` (a cluster key
    ``account/region/name``) or ``run`` (a run key ``dag_id/run_id``; a stop only)."""

    level: str
    name: str = ""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise HoldError(f"scope {self.level!r} is not one of {', '.join(LEVELS)}")
        if self.level == ALL:
            if self.name:
                raise HoldError(f"scope all names nothing, not {self.name[:60]!r}")
            return
        object.__setattr__(self, "name", checked_text(f"the {self.level}", self.name, MAX_NAME))

    @property
    def option(self) -> str:
        """The CLI option that names this scope: ``--all``, ``--lob retail``, ``--cluster KEY``, ``--run KEY``."""
        return "--all" if self.level == ALL else f"--{self.level} {self.name}"

    def __str__(self) -> str:
        return "the whole fleet" if self.level == ALL else f"{'LOB' if self.level == LOB else self.level} {self.name}"


@dataclass(frozen=True)
class Hold:
    """One freeze or stop, as recorded. ``at`` is when it was asked for; a lifted freeze has ``lifted_*``."""

    id: int
    kind: str  # FREEZE | STOP
    scope: Scope
    reason: str
    by: str
    at: datetime
    lifted_at: datetime | None = None
    lifted_by: str | None = None
    lift_reason: str | None = None

    @property
    def message(self) -> str:
        """Who, when, why, and how to lift it: what a refused start or a stopped run says."""
        when = _when(self.at)
        if self.kind == STOP:
            return (f"emergency stop of {self.scope} by {self.by} at {when}: {self.reason}. A stop holds only the runs "
                    "that were in flight when it was given, and is not lifted: start a new run when it is safe")
        if self.lifted_at is not None:
            return (f"the freeze of {self.scope} by {self.by} at {when} ({self.reason}) was lifted by {self.lifted_by} "
                    f"at {_when(self.lifted_at)}: {self.lift_reason}")
        return (f"{self.scope} is frozen by {self.by} since {when}: {self.reason}. Lift it with: kvfleet freeze off "
                f'{self.scope.option} --reason "…"')

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "scope": self.scope.level, "target": self.scope.name or None,
                "reason": self.reason, "by": self.by, "at": self.at, "lifted_at": self.lifted_at,
                "lifted_by": self.lifted_by, "lift_reason": self.lift_reason, "message": self.message}


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _hold(row: Mapping[Any, Any]) -> Hold:
    return Hold(id=int(row["id"]), kind=str(row["kind"]), scope=Scope(str(row["scope"]), str(row["target"])),
                reason=str(row["reason"]), by=str(row["requested_by"]), at=row["requested_at"],
                lifted_at=row.get("lifted_at"), lifted_by=row.get("lifted_by"), lift_reason=row.get("lift_reason"))


# A stop first (the nearer safe point), then the oldest. The two branches read the two partial indexes.
_HOLDING = text(
    "SELECT * FROM ("
    " SELECT * FROM holds WHERE kind = 'freeze' AND lifted_at IS NULL"
    " UNION ALL"
    " SELECT * FROM holds WHERE kind = 'stop' AND requested_at >= :started) h "
    "WHERE scope = 'all' OR (scope = 'lob' AND target = ANY(:lobs)) OR (scope = 'cluster' AND target = ANY(:clusters))"
    " OR (scope = 'run' AND target = :run_key) "
    "ORDER BY kind = 'stop' DESC, requested_at, id LIMIT 1"
).bindparams(bindparam("lobs", type_=ARRAY(Text)), bindparam("clusters", type_=ARRAY(Text)))


class Holds:
    """Freezes and stops on one engine. Each write is one short transaction with its audit line."""

    def __init__(self, engine: Engine | None = None, audit: AuditLog | None = None) -> None:
        self.engine = engine or get_engine()
        self.audit = audit or AuditLog(self.engine)

    def freeze(self, scope: Scope, reason: str, by: str) -> Hold:
        """Freeze ``scope`` (all, a LOB or a cluster). On a scope already frozen, the freeze in force is returned
        and nothing is written (one active freeze per scope)."""
        if scope.level == RUN:
            raise HoldError(f"a freeze covers all, a LOB or a cluster, not a run ({scope.name[:80]}): stop the run "
                            f"instead (kvfleet stop --run {scope.name[:80]})")
        reason, by = checked_text("reason", reason, MAX_REASON), checked_text("by", by, MAX_BY)
        binds = {"s": scope.level, "t": scope.name, "r": reason, "by": by}
        while True:  # a lift may pass between the two statements: then the insert is tried again
            with self.engine.begin() as conn:
                row = conn.execute(text(
                    "INSERT INTO holds (kind, scope, target, reason, requested_by) VALUES ('freeze', :s, :t, :r, :by) "
                    "ON CONFLICT (scope, target) WHERE kind = 'freeze' AND lifted_at IS NULL DO NOTHING RETURNING *"),
                    binds).mappings().first()
                if row is not None:
                    hold = _hold(row)
                    self._record(conn, hold, "freeze:on", by, {})
                    return hold
                row = conn.execute(text(
                    "SELECT * FROM holds WHERE kind = 'freeze' AND lifted_at IS NULL AND scope = :s AND target = :t"),
                    binds).mappings().first()
                if row is not None:  # frozen already: the freeze in force
                    return _hold(row)

    def lift(self, scope: Scope, reason: str, by: str) -> Hold:
        """Lift the active freeze of ``scope``; returns it, lifted. ``NotFrozen`` (naming the freezes in force)
        when the scope has none: a freeze of the whole fleet is lifted with ``all``, not LOB by LOB."""
        reason, by = checked_text("reason", reason, MAX_REASON), checked_text("by", by, MAX_BY)
        with self.engine.begin() as conn:
            row = conn.execute(text(
                "UPDATE holds SET lifted_at = now(), lifted_by = :by, lift_reason = :r "
                "WHERE kind = 'freeze' AND lifted_at IS NULL AND scope = :s AND target = :t RETURNING *"),
                {"s": scope.level, "t": scope.name, "r": reason, "by": by}).mappings().first()
            if row is None:
                active = [h.scope.option for h in self._active(conn)]
                raise NotFrozen(f"{scope} has no active freeze to lift; "
                                + (f"the freezes in force: {', '.join(active)}" if active else "nothing is frozen"))
            hold = _hold(row)
            self._record(conn, hold, "freeze:off", by, {"lift_reason": reason})
            return hold

    def stop(self, scope: Scope, reason: str, by: str) -> Hold:
        """An emergency stop of ``scope``: the runs in it that are in flight now stop at their next safe point.
        A run named must be one the history knows and that has not ended."""
        reason, by = checked_text("reason", reason, MAX_REASON), checked_text("by", by, MAX_BY)
        with self.engine.begin() as conn:
            if scope.level == RUN:
                run = conn.execute(text("SELECT status, ended_at FROM runs WHERE run_key = :k"),
                                   {"k": scope.name}).mappings().first()
                if run is None:
                    raise HoldError(f"run {scope.name[:200]!r} is not in the history: name it by its run key "
                                    "dag_id/run_id, as `kvfleet audit runs` lists them")
                if run["ended_at"] is not None:
                    raise HoldError(f"run {scope.name[:200]} has already ended ({run['status']}, at "
                                    f"{_when(run['ended_at'])}): there is nothing to stop")
            row = conn.execute(text(
                "INSERT INTO holds (kind, scope, target, reason, requested_by) VALUES ('stop', :s, :t, :r, :by) "
                "RETURNING *"), {"s": scope.level, "t": scope.name, "r": reason, "by": by}).mappings().one()
            hold = _hold(row)
            self._record(conn, hold, "stop", by, {})
            return hold

    def active_freezes(self) -> list[Hold]:
        """The freezes in force now, oldest first."""
        return [_hold(r) for r in run_query(self.engine, "active_freezes")]

    def holding(self, run_key: str, run_started_at: datetime, cluster_keys: Iterable[str] = (),
                lobs: Iterable[str] = ()) -> Hold | None:
        """The hold that applies to this run now, or None. ``run_started_at`` is when the run started (aware);
        ``cluster_keys`` and ``lobs`` are what it touches. A hold applies when it is an active freeze of all,
        one of ``lobs`` or one of ``cluster_keys``, or a stop requested at or after ``run_started_at`` of all, one
        of them, or ``run_key``. A stop wins over a freeze, then the oldest."""
        if run_started_at.tzinfo is None:
            raise ValueError("run_started_at must carry its time zone (a naive time cannot be compared with the "
                             "database's)")
        with self.engine.connect() as conn:
            row = conn.execute(_HOLDING, {"started": run_started_at, "run_key": run_key,
                                          "lobs": sorted(set(lobs)), "clusters": sorted(set(cluster_keys))}
                               ).mappings().first()
        return None if row is None else _hold(row)

    # ---- inside ------------------------------------------------------------------------------------------------
    def _active(self, conn: Connection) -> list[Hold]:
        rows = conn.execute(text("SELECT * FROM holds WHERE kind = 'freeze' AND lifted_at IS NULL "
                                 "ORDER BY requested_at, id")).mappings()
        return [_hold(r) for r in rows]

    def _record(self, conn: Connection, hold: Hold, action: str, by: str, extra: Mapping[str, Any]) -> None:
        """The hold's audit line, in its transaction: keyed by the hold and the action, so it is written once."""
        self.audit.record(f"hold|{hold.id}|{action}", actor=by, action=action,
                          run_key=hold.scope.name if hold.scope.level == RUN else None,
                          cluster=hold.scope.name if hold.scope.level == CLUSTER else None,
                          detail={"hold_id": hold.id, "kind": hold.kind, "scope": hold.scope.level,
                                  "target": hold.scope.name or None, "reason": hold.reason, **dict(extra)},
                          conn=conn)
