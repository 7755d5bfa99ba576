"""Curvine releases and capacity: each helm revision of a Curvine release with its format flags
(``curvine_releases``), and the cluster's capacity around an operation (``capacity_snapshots``).

Called by the Curvine stages (``kvfleet.stages.curvine``: the revisions a format-flag gate judges, the capacity
before and after an upgrade or scale-out) and by the drift check (capacity).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, text

from kvfleet.history.db import get_engine
from kvfleet.history.keys import json_param


class CurvineReleases:
    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or get_engine()

    def record(self, *, cluster: str, namespace: str, release: str, revision: int, chart_version: str | None,
               status: str | None, flags: Mapping[str, bool | None], values: Mapping[str, Any],
               run_key: str | None, helm_updated: str | None = None) -> None:
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
                 "fj": flags.get("formatJournal"), "vals": json_param(dict(values)), "k": run_key,
                 "u": helm_updated},
            )

    def revisions(self, cluster: str, namespace: str, release: str) -> dict[int, dict[str, Any]]:
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

    def set_status(self, *, cluster: str, namespace: str, release: str, revision: int, status: str | None) -> None:
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
                 "dirs": overview.get("dir_total"), "d": json_param(dict(overview))},
            )
