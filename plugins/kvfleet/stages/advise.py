"""The L2 economics and capacity advisor's observation side: per endpoint, read every Ready vLLM pod's
``/metrics`` through the API-server pod proxy; per cluster, read Curvine's master API; then judge with the pure
model in ``kvfleet.fleet.economics``.

Called by `kvfleet advise` and the ``advise`` task of ``kvfleet_hit_verification``; the scale-out DAG's scheduled
detection reads the capacity recommendation. Read-only: it changes nothing.

Metric names (vLLM ``vllm/v1/metrics/loggers.py``, 0.11.x): the histogram ``vllm:request_prompt_tokens``
("Number of prefill tokens processed.", buckets 1-2-5 up to max_model_len) gives the prompt-length distribution
and its ``_count`` the requests; LMCache's ``lmcache:num_hit_tokens`` / ``lmcache:num_requested_tokens``
(``lmcache/observability.py``) give the prefix reuse. Counters run from the pod's start, so the window is each
pod's age (``status.startTime``), combined into one effective window across the endpoint's pods.

Bytes per token come from the LMCache ``Stored`` lines of the last ``STORED_LOG_WINDOW`` of one Ready pod's log
(``fleet.lmcache_log``; LMCache prints GiB as "gb", ``v1/cache_engine.py`` divides by ``1024**3``), else from
the model's config (``economics.MODEL_KV_SHAPES``). Prices come from the inventory's ``prices`` (USD per
instance-hour, never fetched). The JSON shape is documented in docs/advise.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kvfleet.clients.curvine import CurvineMaster
from kvfleet.clients.inference import pod_log_since, pod_metrics_text
from kvfleet.clients.kube import call
from kvfleet.errors import KvfleetError
from kvfleet.fleet import economics as E
from kvfleet.fleet import lmcache_log, prom
from kvfleet.fleet.inventory import Endpoint
from kvfleet.stages.base import StageContext

PROMPT_HISTOGRAM = "vllm:request_prompt_tokens"
STORED_LOG_WINDOW = timedelta(hours=1)
STORED_LOG_PODS = 3  # pods whose log is read for Stored lines, at most (each log read is bounded to the window)


@dataclass
class ClusterReport:
    cluster: str
    endpoints: list[E.EndpointAdvice] = field(default_factory=list)
    capacity: E.ClusterAdvice | None = None
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "endpoints": [e.as_dict() for e in self.endpoints],
                "capacity": self.capacity.as_dict() if self.capacity else None, "errors": self.errors}


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def prices_of(ctx: StageContext) -> Mapping[str, float]:
    """The inventory's ``prices`` (USD per instance-hour by instance type); empty when none are configured."""
    prices = getattr(ctx.inventory, "prices", None)
    return prices if isinstance(prices, Mapping) else {}


def stored_sizes(ctx: StageContext, ep: Endpoint, pods: list[Any]) -> list[tuple[float, int]]:
    """``(GiB, tokens)`` of the sized ``Stored`` lines in the last hour of the first of ``pods`` (at most
    ``STORED_LOG_PODS``) whose log has a chunk's worth; empty when none has (or no log is readable): the advisor
    then falls back to the model's config, and says so. The window is on the wall clock, as the kubelet stamps
    the log lines ``sinceTime`` filters."""
    since = datetime.now(UTC) - STORED_LOG_WINDOW
    for pod in pods[:STORED_LOG_PODS]:
        try:
            text = pod_log_since(ctx.kube, ep.namespace, pod.metadata.name, ep.name, since)
        except KvfleetError:
            continue
        sizes = [(s.gb, s.stored) for s in lmcache_log.parse(text).stores if s.gb is not None and s.stored > 0]
        if sum(n for _, n in sizes) >= E.MIN_STORED_TOKENS:
            return sizes
    return []


def observe_endpoint(ctx: StageContext, ep: Endpoint, now: datetime) -> E.EndpointTraffic:
    pods = call(ctx.kube.core.list_namespaced_pod, ep.namespace, label_selector=f"app={ep.name}",
                what=f"pods of {ep.key}").items
    cumulative: dict[float, float] = {}
    sums = 0.0
    rate_per_s = 0.0
    hits = requested = 0.0
    ready = [p for p in pods if _ready(p)]
    stored = stored_sizes(ctx, ep, ready) if ep.l2 else []
    for pod in ready:
        samples = prom.parse(pod_metrics_text(ctx.kube, ep.namespace, pod.metadata.name))
        buckets, hsum, count = prom.histogram(samples, PROMPT_HISTOGRAM)
        for le, n in buckets:
            cumulative[le] = cumulative.get(le, 0.0) + n
        sums += hsum or 0.0
        started = pod.status.start_time
        age = max(1.0, (now - started).total_seconds()) if started else None
        if count and age:
            rate_per_s += count / age
        hits += prom.total(samples, "lmcache:num_hit_tokens") or 0.0
        requested += prom.total(samples, "lmcache:num_requested_tokens") or 0.0
    lengths = E.histogram_buckets(sorted(cumulative.items()), sums or None)
    n = sum(b.requests for b in lengths)
    window = n / rate_per_s if rate_per_s > 0 else 3600.0
    bpt, bpt_source = E.bytes_per_token_for(stored, ep.model_id)
    return E.EndpointTraffic(endpoint=ep.key, instance_type=ep.instance_type, lengths=lengths, window_s=window,
                             reuse_ratio=(hits / requested) if requested > 0 else None, bytes_per_token=bpt,
                             bytes_per_token_source=bpt_source, replicas=ep.replicas,
                             hourly_price_usd=prices_of(ctx).get(ep.instance_type))


def advise_cluster(ctx: StageContext, *, threshold: float = E.CAPACITY_THRESHOLD, retention_h: float = 24.0,
                   now: datetime | None = None,
                   sweeps: Mapping[str, Sequence[tuple[int, float]]] | None = None) -> ClusterReport:
    """``sweeps``: measured (tokens, speedup) curves by endpoint key (the hourly DAG passes each endpoint's
    recorded sweep); an endpoint without one is judged on the published curve."""
    now = now or datetime.now(UTC)
    report = ClusterReport(ctx.cluster.name)
    for ep in ctx.inventory.endpoints_of(ctx.cluster.name):
        try:
            traffic = observe_endpoint(ctx, ep, now)
            measured = (sweeps or {}).get(ep.key)
            if measured:
                traffic = replace(traffic, sweep=tuple((int(n), float(x)) for n, x in measured))
            report.endpoints.append(E.advise_endpoint(traffic, retention_h=retention_h))
        except KvfleetError as exc:
            report.errors.append(f"{ep.ref}: {exc}")
    l2_keys = {ep.key for ep in ctx.inventory.endpoints_of(ctx.cluster.name) if ep.l2}
    l2 = [a for a in report.endpoints if a.endpoint in l2_keys]
    try:
        ov = CurvineMaster(ctx.kube, ctx.cluster.curvine.namespace).overview()
        report.capacity = E.advise_cluster(ctx.cluster.name, l2, capacity_bytes=ov.capacity,
                                           workers=ov.live_workers, threshold=threshold,
                                           node_price_usd=prices_of(ctx).get(ctx.cluster.gpu_instance_type))
    except KvfleetError as exc:
        report.errors.append(f"Curvine master: {exc}")
    return report


def with_advised_workers(ctx: StageContext, decision: Mapping[str, Any], *, replicas: int, eligible: int,
                         worker_bytes: float, threshold: float = E.CAPACITY_THRESHOLD,
                         now: datetime | None = None) -> dict[str, Any]:
    """The scale-out DAG's scheduled detection with the advisor's capacity recommendation: observe the cluster's
    L2 endpoints, then ``economics.scale_decision_with_working_set``. When the advisor cannot observe (no
    endpoint readable), the decision is returned unchanged with the reason recorded."""
    report = advise_cluster(ctx, threshold=threshold, now=now)
    l2_keys = {ep.key for ep in ctx.inventory.endpoints_of(ctx.cluster.name) if ep.l2}
    judged = [a for a in report.endpoints if a.endpoint in l2_keys and a.verdict != "insufficient_data"]
    if not judged:
        return {**decision, "advisor": "no L2 endpoint with enough observed traffic: capacity not advised",
                "advisor_errors": report.errors}
    working_set = sum(a.working_set_bytes for a in judged)
    out = E.scale_decision_with_working_set(decision, replicas=replicas, eligible=eligible,
                                            working_set_bytes=working_set, worker_bytes=worker_bytes,
                                            threshold=threshold)
    return {**out, "advisor_errors": report.errors}
