"""What ``/kvfleet/metrics`` exposes, read from the history in one go: the named queries ``sql/queries/metrics_*.sql``
run through ``Queries.rows`` (the same path as the CLI's and the page's named queries).

Called by ``kvfleet.airflow.ui.metrics`` on every scrape. Read-only. The per-endpoint rows are capped
(``ENDPOINT_SERIES_CAP``, the most recently verified first) so that a scrape's series stay bounded however large the
fleet grows; ``endpoints_total`` says how many there are, so the exposition can say how many it left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from kvfleet.history.queries import Queries

ENDPOINT_SERIES_CAP = 500

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class MetricsReading:
    runs: Rows  # dag_id, status, runs
    open_drift: Rows  # cluster, kind, lob, findings, oldest
    endpoints: Rows  # cluster, endpoint, lob, verdict, hit_ratio, speedup, expected_speedup, verified_at
    endpoints_total: int  # every verified endpoint, listed or not
    endpoint_cap: int
    verdicts: Rows  # lob, verdict, latest, recorded
    leases: Rows  # cluster, holder_dag, state, expires_at, live
    operator_pauses: Rows  # cluster, paused, at, since_s, run_key
    gate_answers: Rows  # cluster, decision, answered, waited_s

    @property
    def endpoints_left_out(self) -> int:
        return max(0, self.endpoints_total - len(self.endpoints))


class MetricsReadings:
    """The metrics' named queries, on one engine (or one ``Queries``)."""

    def __init__(self, engine: Engine | None = None, *, queries: Queries | None = None) -> None:
        self.queries = queries or Queries(engine)

    def read(self, endpoint_cap: int = ENDPOINT_SERIES_CAP) -> MetricsReading:
        if endpoint_cap < 1:
            raise ValueError(f"endpoint_cap: {endpoint_cap} is out of range: at least 1 endpoint per scrape")
        q = self.queries.rows
        endpoints = q("metrics_endpoints", limit=endpoint_cap)
        total = int(endpoints[0]["total"]) if endpoints else 0
        return MetricsReading(runs=q("metrics_runs"), open_drift=q("metrics_open_drift"), endpoints=endpoints,
                              endpoints_total=total, endpoint_cap=endpoint_cap, verdicts=q("metrics_verdicts"),
                              leases=q("metrics_leases"), operator_pauses=q("metrics_operator_pauses"),
                              gate_answers=q("metrics_gate_answers"))
