"""Cluster leases with liveness: who holds a cluster, and whether that holder is still alive.

Called by ``kvfleet.stages.locks.ClusterLock`` (take, heartbeat, park, release) and by the drift check (is the
run that paused the operator still alive?). The rows live in ``cluster_locks`` (migration 0004 adds ``state``),
one per cluster key ``account/region/name`` (migration 0011), beside a rollout's parallelism slots.

Liveness, explicitly:
- **active** — a task is running and holds the lease. It heartbeats every ``ttl/3`` with a short ttl
  (``ACTIVE_TTL_S``, 60 s). A task killed with SIGKILL stops heartbeating, so its lease is free at most 60 s
  later.
- **parked** — the run keeps the lease on purpose between two of its tasks (a wave finished, a human gate is
  deferred, the next wave or the teardown follows). Nobody heartbeats a parked lease: its ttl is the gate's own
  (``PARKED_TTL_S``: the gate's 2 h response timeout plus a margin), renewed each time a task of the run takes
  it again and parks it again.
- **the run's own state** wins over both ttls: when the holder's Airflow run is no longer running (failed,
  success, marked failed by hand), its lease is dead at once, whatever ``expires_at`` says. The check is an
  injected ``holder_alive(holder) -> True | False | None`` (``None``: cannot tell, so the ttl decides), because
  this module never imports Airflow.

Every function takes ``now`` (default: the wall clock) so that tests and the drift check can judge "three
minutes later" without sleeping. A holder is a run key (``dag_id/run_id``); a helper that acts for a run may
suffix it after ``#`` (``<run key>#drift``, ``<run key>#<cluster>``) and counts as that run. (Not ``:``: Airflow
run ids contain colons.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, text

from kvfleet.history.db import get_engine

ACTIVE = "active"
PARKED = "parked"
ACTIVE_TTL_S = 60.0
PARKED_TTL_S = 2 * 3600 + 15 * 60  # the gate's response timeout (2 h) and a margin for the next task to start

HolderAlive = Callable[[str], bool | None]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Liveness:
    alive: bool
    reason: str


SUFFIX = "#"


def run_key_of(holder: str) -> str:
    """The run a holder acts for: ``dag/run`` of ``dag/run`` or ``dag/run#suffix``."""
    return holder.split(SUFFIX, 1)[0]


def judge(row: Mapping[str, Any] | None, now: datetime, holder_alive: HolderAlive | None = None) -> Liveness:
    """Whether the lease in ``row`` still protects its holder at ``now``."""
    if row is None:
        return Liveness(False, "no lease")
    state = row.get("state") or ACTIVE
    expires = row["expires_at"]
    if expires <= now:
        return Liveness(False, f"its {state} lease expired at {expires:%Y-%m-%dT%H:%M:%SZ} (last heartbeat "
                               f"{row['heartbeat_at']:%Y-%m-%dT%H:%M:%SZ})")
    if holder_alive is not None and holder_alive(str(row["holder"])) is False:
        return Liveness(False, f"its run {run_key_of(str(row['holder']))} is no longer running")
    return Liveness(True, f"{state} lease held until {expires:%Y-%m-%dT%H:%M:%SZ}")


class Leases:
    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or get_engine()

    def get(self, cluster: str) -> dict[str, Any] | None:
        """The cluster's lease row, with ``expired`` (its ttl is past by the database's clock), or None."""
        with self.engine.connect() as conn:
            row = conn.execute(text("SELECT *, expires_at < now() AS expired FROM cluster_locks WHERE cluster = :c"),
                               {"c": cluster}).mappings().first()
            return dict(row) if row else None

    def try_take(self, cluster: str, holder: str, purpose: str, ttl_s: float = ACTIVE_TTL_S, *,
                 now: datetime | None = None, holder_alive: HolderAlive | None = None) -> dict[str, Any]:
        """Take the lease (state ``active``) if it is free, ours, or its holder is dead (``judge``). Returns the
        row now in place; when it was taken from a dead holder, ``taken_over_from`` and ``why`` say so."""
        now = now or utcnow()
        expires = now + timedelta(seconds=ttl_s)
        with self.engine.begin() as conn:
            row = conn.execute(text("SELECT * FROM cluster_locks WHERE cluster = :c FOR UPDATE"),
                               {"c": cluster}).mappings().first()
            if row is None:
                new = conn.execute(text(
                    "INSERT INTO cluster_locks (cluster, holder, purpose, acquired_at, heartbeat_at, expires_at, "
                    "state) VALUES (:c, :h, :p, :now, :now, :exp, 'active') "
                    "ON CONFLICT (cluster) DO NOTHING RETURNING *"),
                    {"c": cluster, "h": holder, "p": purpose, "now": now, "exp": expires}).mappings().first()
                if new is None:  # another process inserted it between our SELECT and INSERT
                    new = conn.execute(text("SELECT * FROM cluster_locks WHERE cluster = :c"),
                                       {"c": cluster}).mappings().first()
                return dict(new) if new else {}
            ours = row["holder"] == holder
            verdict = Liveness(True, "ours") if ours else judge(dict(row), now, holder_alive)
            if not ours and verdict.alive:
                return dict(row)
            new = conn.execute(text(
                "UPDATE cluster_locks SET holder = :h, purpose = :p, state = 'active', heartbeat_at = :now, "
                "expires_at = :exp, acquired_at = CASE WHEN holder = :h THEN acquired_at ELSE :now END "
                "WHERE cluster = :c RETURNING *"),
                {"c": cluster, "h": holder, "p": purpose, "now": now, "exp": expires}).mappings().one()
            out = dict(new)
            if not ours:
                out["taken_over_from"] = row["holder"]
                out["why"] = verdict.reason
            return out

    def heartbeat(self, cluster: str, holder: str, ttl_s: float = ACTIVE_TTL_S, *,
                  now: datetime | None = None) -> bool:
        return self._set(cluster, holder, ACTIVE, ttl_s, now)

    def park(self, cluster: str, holder: str, ttl_s: float = PARKED_TTL_S, *, now: datetime | None = None) -> bool:
        """Keep the lease for this run between two of its tasks (no heartbeat): ``parked`` for ``ttl_s``."""
        return self._set(cluster, holder, PARKED, ttl_s, now)

    def _set(self, cluster: str, holder: str, state: str, ttl_s: float, now: datetime | None) -> bool:
        now = now or utcnow()
        with self.engine.begin() as conn:
            row = conn.execute(text(
                "UPDATE cluster_locks SET state = :s, heartbeat_at = :now, expires_at = :exp "
                "WHERE cluster = :c AND holder = :h RETURNING cluster"),
                {"s": state, "now": now, "exp": now + timedelta(seconds=ttl_s), "c": cluster, "h": holder}).first()
            return row is not None

    def release(self, cluster: str, holder: str) -> bool:
        with self.engine.begin() as conn:
            row = conn.execute(text("DELETE FROM cluster_locks WHERE cluster = :c AND holder = :h RETURNING cluster"),
                               {"c": cluster, "h": holder}).first()
            return row is not None

    def release_named(self, name: str, holder: str) -> int:
        """Release the leases ``holder`` holds on clusters of this bare name, whatever their account and region
        (a teardown that cannot read its run's inventory to know the key, with the bare name its task was mapped
        over: a run planned before revision 0011, which never held two clusters of one name). Given a key, only
        that cluster's lease."""
        with self.engine.begin() as conn:
            rows = conn.execute(text(
                "DELETE FROM cluster_locks WHERE holder = :h AND (cluster = :n OR (cluster ~ '^[^/]+/[^/]+/[^/]+$' "
                "AND split_part(cluster, '/', 3) = :n)) RETURNING cluster"), {"n": name, "h": holder}).fetchall()
            return len(rows)

    def release_all(self, prefix: str, holder: str) -> int:
        """Release every lease named ``<prefix>*`` held by ``holder`` (a run's parallelism slots)."""
        with self.engine.begin() as conn:
            rows = conn.execute(text("DELETE FROM cluster_locks WHERE starts_with(cluster, :p) AND holder = :h "
                                     "RETURNING cluster"), {"p": prefix, "h": holder}).fetchall()
            return len(rows)

    def holder_liveness(self, cluster: str, holder: str, *, now: datetime | None = None,
                        holder_alive: HolderAlive | None = None) -> Liveness:
        """Is ``holder`` (e.g. the run named in the operator's pause annotation) alive on ``cluster``? Alive only
        while it holds a live lease there: kvfleet pauses the operator only under the cluster's lease."""
        row = self.get(cluster)
        if row is None:
            return Liveness(False, f"{holder} holds no lease on {cluster}")
        if run_key_of(str(row["holder"])) != run_key_of(holder):
            return Liveness(False, f"{holder} holds no lease on {cluster} (it is held by {row['holder']})")
        return judge(row, now or utcnow(), holder_alive)
