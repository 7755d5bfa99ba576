"""``/kvfleet/metrics``: kvfleet's own metrics in Prometheus' text exposition format, built per scrape from the
history (``kvfleet.history.metrics``) and the gates waiting for a human (Airflow's HITL records, as ``/gates``).

Called by ``kvfleet.airflow.ui.app`` (the route, behind the same Airflow auth as every other route). The metric
names, their labels and the series bound are listed in ``docs/metrics.md``; the Grafana dashboard
``deploy/grafana/kvfleet.json`` queries only these names (a test checks it). There is no ``account`` label:
kvfleet manages one AWS account today.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from kvfleet.history.metrics import MetricsReading

TERMINAL = ("success", "failed", "aborted")  # a run's status that never changes again: its count only grows
ENDPOINT_LABELS = ["cluster", "endpoint", "lob"]


@dataclass(frozen=True)
class PendingReading:
    """The gates waiting for a human, per DAG (None: Airflow's records could not be read)."""

    by_dag: dict[str, list[Any]] | None
    now: datetime


def _s(value: Any) -> str:
    return "" if value is None else str(value)


def _ts(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


def _runs(r: MetricsReading) -> Iterator[Metric]:
    total = CounterMetricFamily("kvfleet_runs", "Runs the history records that have ended, by DAG and status "
                                "(success, failed, aborted).", labels=["dag", "status"])
    running = GaugeMetricFamily("kvfleet_runs_running", "Runs the history records as running now, by DAG.",
                                labels=["dag"])
    for row in r.runs:
        if row["status"] in TERMINAL:
            total.add_metric([row["dag_id"], row["status"]], float(row["runs"]))
        elif row["status"] == "running":
            running.add_metric([row["dag_id"]], float(row["runs"]))
    yield total
    yield running


def _gates(r: MetricsReading, pending: PendingReading, gate_dags: Sequence[str]) -> Iterator[Metric]:
    waits = SummaryMetricFamily("kvfleet_gate_wait_seconds", "Human gates answered and how long they waited "
                                "(from the wave's gate step to the answer), by cluster and decision.",
                                labels=["cluster", "decision"])
    for row in r.gate_answers:
        waits.add_metric([row["cluster"], row["decision"]], count_value=int(row["answered"]),
                         sum_value=float(row["waited_s"]))
    yield waits
    readable = GaugeMetricFamily("kvfleet_gates_readable", "1 when the gates waiting for a human could be read "
                                 "from Airflow's HITL records on this scrape, 0 when not (the two metrics below "
                                 "are then absent).")
    readable.add_metric([], 0.0 if pending.by_dag is None else 1.0)
    yield readable
    if pending.by_dag is None:
        return
    waiting = GaugeMetricFamily("kvfleet_gates_waiting", "Gates waiting for a human now, by DAG.", labels=["dag"])
    oldest = GaugeMetricFamily("kvfleet_gate_oldest_waiting_seconds", "Age of the oldest gate waiting for a human, "
                               "by DAG (0 when none waits).", labels=["dag"])
    for dag in gate_dags:
        gates = pending.by_dag.get(dag, [])
        asked = [g.asked_at for g in gates if g.asked_at is not None]
        waiting.add_metric([dag], float(len(gates)))
        oldest.add_metric([dag], max(0.0, (pending.now - min(asked)).total_seconds()) if asked else 0.0)
    yield waiting
    yield oldest


def _drift(r: MetricsReading) -> Iterator[Metric]:
    count = GaugeMetricFamily("kvfleet_drift_open_findings", "Open drift findings, by cluster, kind and LOB ('' for "
                              "a finding of no LOB).", labels=["cluster", "kind", "lob"])
    oldest = GaugeMetricFamily("kvfleet_drift_oldest_open_timestamp_seconds", "When the oldest of those open "
                               "findings was first seen (Unix time).", labels=["cluster", "kind", "lob"])
    for row in r.open_drift:
        labels = [row["cluster"], row["kind"], row["lob"]]
        count.add_metric(labels, float(row["findings"]))
        oldest.add_metric(labels, _ts(row["oldest"]))
    yield count
    yield oldest


def _endpoints(r: MetricsReading) -> Iterator[Metric]:
    verdict = GaugeMetricFamily("kvfleet_verification_latest_verdict", "1 for the verdict of each endpoint's newest "
                                "verification (pass, degraded, fail, unverifiable).",
                                labels=[*ENDPOINT_LABELS, "verdict"])
    gauges = {name: GaugeMetricFamily(f"kvfleet_{name}", text, labels=ENDPOINT_LABELS) for name, text in (
        ("hit_ratio", "Hit ratio (hit tokens / prompt tokens) of the endpoint's newest verification."),
        ("ttft_speedup", "TTFT speedup (cold / warm) of the endpoint's newest verification."),
        ("ttft_expected_speedup", "The speedup the endpoint's newest verification expected."),
        ("verification_timestamp_seconds", "When the endpoint was last verified (Unix time)."))}
    for row in r.endpoints:
        labels = [row["cluster"], row["endpoint"], row["lob"]]
        verdict.add_metric([*labels, _s(row["verdict"])], 1.0)
        gauges["verification_timestamp_seconds"].add_metric(labels, _ts(row["verified_at"]))
        for name, column in (("hit_ratio", "hit_ratio"), ("ttft_speedup", "speedup"),
                             ("ttft_expected_speedup", "expected_speedup")):
            if row[column] is not None:
                gauges[name].add_metric(labels, float(row[column]))
    yield verdict
    yield from gauges.values()
    truncated = GaugeMetricFamily("kvfleet_metrics_truncated", "Verified endpoints left out of this scrape's "
                                  "per-endpoint series (the least recently verified beyond the cap).",
                                  labels=["series"])
    truncated.add_metric(["endpoint"], float(r.endpoints_left_out))
    yield truncated
    cap = GaugeMetricFamily("kvfleet_metrics_endpoint_series_cap", "At most this many endpoints get per-endpoint "
                            "series in one scrape.")
    cap.add_metric([], float(r.endpoint_cap))
    yield cap


def _verdicts(r: MetricsReading) -> Iterator[Metric]:
    latest = GaugeMetricFamily("kvfleet_endpoints_by_verdict", "Endpoints whose newest verification has this verdict "
                               "(every verified endpoint, not capped), by LOB.", labels=["lob", "verdict"])
    recorded = CounterMetricFamily("kvfleet_verifications", "Verifications the history records, by LOB and verdict.",
                                   labels=["lob", "verdict"])
    for row in r.verdicts:
        labels = [row["lob"], _s(row["verdict"])]
        latest.add_metric(labels, float(row["latest"]))
        recorded.add_metric(labels, float(row["recorded"]))
    yield latest
    yield recorded


def _leases(r: MetricsReading) -> Iterator[Metric]:
    held = GaugeMetricFamily("kvfleet_lease_held", "1 while the cluster's lease is held (its ttl not past), 0 for a "
                             "lease row whose ttl is past, by cluster and the holder's DAG.",
                             labels=["cluster", "holder_dag"])
    parked = GaugeMetricFamily("kvfleet_lease_parked", "1 when the lease is parked between two tasks of its run "
                               "(a gate or a bake waits), 0 when a task holds it.", labels=["cluster", "holder_dag"])
    expiry = GaugeMetricFamily("kvfleet_lease_expiry_timestamp_seconds", "When the lease's ttl ends (Unix time).",
                               labels=["cluster", "holder_dag"])
    for row in r.leases:
        labels = [row["cluster"], row["holder_dag"]]
        held.add_metric(labels, 1.0 if row["live"] else 0.0)
        parked.add_metric(labels, 1.0 if row["state"] == "parked" else 0.0)
        expiry.add_metric(labels, _ts(row["expires_at"]))
    yield held
    yield parked
    yield expiry


def _pauses(r: MetricsReading) -> Iterator[Metric]:
    paused = GaugeMetricFamily("kvfleet_operator_paused", "1 while kvfleet has the cluster's inference operator "
                               "paused (its newest pause has no restore after it), by cluster.", labels=["cluster"])
    seconds = GaugeMetricFamily("kvfleet_operator_paused_seconds", "How long the inference operator has been "
                                "paused (0 when it is not), by cluster.", labels=["cluster"])
    for row in r.operator_pauses:
        paused.add_metric([row["cluster"]], 1.0 if row["paused"] else 0.0)
        seconds.add_metric([row["cluster"]], max(0.0, float(row["since_s"])) if row["paused"] else 0.0)
    yield paused
    yield seconds


class HistoryCollector(Collector):
    """A collector of one scrape's readings (a registry holds it for that scrape only)."""

    def __init__(self, reading: MetricsReading, pending: PendingReading, gate_dags: Sequence[str]) -> None:
        self.reading, self.pending, self.gate_dags = reading, pending, gate_dags

    def collect(self) -> Iterable[Metric]:
        r = self.reading
        for part in (_runs(r), _gates(r, self.pending, self.gate_dags), _drift(r), _endpoints(r), _verdicts(r),
                     _leases(r), _pauses(r)):
            yield from part


def pending_by_dag(gates: Iterable[Any] | None) -> PendingReading:
    now = datetime.now(UTC)
    if gates is None:
        return PendingReading(None, now)
    by_dag: dict[str, list[Any]] = {}
    for g in gates:
        by_dag.setdefault(g.dag_id, []).append(g)
    return PendingReading(by_dag, now)


def exposition(reading: MetricsReading, pending: PendingReading, gate_dags: Sequence[str]) -> bytes:
    """The text exposition of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HistoryCollector(reading, pending, gate_dags))
    return generate_latest(registry)
