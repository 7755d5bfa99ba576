"""The history's repositories, one per aggregate, on one engine: what a stage context or a DAG task carries
when it touches several of them. Each repository stays usable on its own (``Runs()``, ``Leases()``...).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from kvfleet.history.audit import AuditLog
from kvfleet.history.curvine import CurvineReleases
from kvfleet.history.db import get_engine
from kvfleet.history.drift import DriftFindings
from kvfleet.history.holds import Holds
from kvfleet.history.leases import Leases
from kvfleet.history.metrics import MetricsReadings
from kvfleet.history.queries import Queries
from kvfleet.history.runs import Runs
from kvfleet.history.verifications import Verifications


@dataclass(frozen=True)
class HistoryRepos:
    engine: Engine
    runs: Runs
    audit: AuditLog
    verifications: Verifications
    curvine: CurvineReleases
    drift: DriftFindings
    leases: Leases
    queries: Queries
    metrics: MetricsReadings
    holds: Holds

    @classmethod
    def on(cls, engine: Engine | None = None) -> HistoryRepos:
        """Every repository on ``engine`` (default: the configured history, ``kvfleet.history.db``)."""
        engine = engine or get_engine()
        audit, queries = AuditLog(engine), Queries(engine)
        return cls(engine=engine, runs=Runs(engine, audit), audit=audit, verifications=Verifications(engine),
                   curvine=CurvineReleases(engine), drift=DriftFindings(engine), leases=Leases(engine),
                   queries=queries, metrics=MetricsReadings(queries=queries),
                   holds=Holds(engine, audit))
