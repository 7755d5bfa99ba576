"""Drift: the findings of the drift check (opened, touched, resolved as gone or remediated, ``drift_findings``)
and the dated watches on thresholded conditions (``drift_watches``).

Called by the drift check (``kvfleet.stages.drift``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from kvfleet.history.clusters import history_values
from kvfleet.history.db import get_engine
from kvfleet.history.keys import json_param


class DriftFindings:
    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or get_engine()

    def sync(self, cluster: str, findings: Iterable[Mapping[str, Any]], run_key: str,
             scope_kinds: Iterable[str] | None = None) -> dict[str, int]:
        """Open new findings, touch the ones still seen, resolve the ones no longer seen (for this cluster: its key,
        and the bare name older rows of a base-account cluster may carry, ``kvfleet.history.clusters``)."""
        # One order for every writer (endpoint, then fingerprint): two checks of one cluster at once (the schedule
        # and the watch) lock the same rows, and migration 0009's endpoint_state rows, in the same order.
        seen = {f["fingerprint"]: f for f in sorted(findings, key=lambda f: (str(f.get("endpoint") or ""),
                                                                             str(f["fingerprint"])))}
        opened = touched = 0
        with self.engine.begin() as conn:
            for fp, f in seen.items():
                if _touch(conn, fp, f, run_key):
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
                "WHERE cluster = ANY(:c) "
                "AND resolved_at IS NULL AND NOT (fingerprint = ANY(:fps))"
                + (" AND kind = ANY(:kinds)" if scope_kinds is not None else "")
                + " RETURNING id"
            )
            params: dict[str, Any] = {"k": run_key, "c": history_values(cluster), "fps": list(seen)}
            if scope_kinds is not None:
                params["kinds"] = list(scope_kinds)
            resolved = len(conn.execute(stmt, params).fetchall())
        return {"opened": opened, "still_open": touched, "resolved": resolved}

    def record_remediation(self, fingerprint: str, remediation: Mapping[str, Any]) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text("UPDATE drift_findings SET remediation = CAST(:r AS jsonb) WHERE fingerprint = :fp "
                     "AND resolved_at IS NULL"),
                {"r": json_param(dict(remediation)), "fp": fingerprint},
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
                     "WHERE cluster = ANY(:c) AND resolved_at IS NULL AND fingerprint = ANY(:fps) RETURNING id"),
                {"k": run_key, "c": history_values(cluster), "fps": fps},
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


def _touch(conn: Connection, fingerprint: str, finding: Mapping[str, Any], run_key: str) -> bool:
    """Mark an open finding seen again by this run; False when no open finding has this fingerprint."""
    row = conn.execute(
        text("UPDATE drift_findings SET last_seen = now(), last_run_key = :k, actual = :a "
             "WHERE fingerprint = :fp AND resolved_at IS NULL RETURNING id"),
        {"k": run_key, "a": finding.get("actual"), "fp": fingerprint},
    ).first()
    return row is not None
