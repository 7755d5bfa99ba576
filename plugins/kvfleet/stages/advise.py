"""The L2 economics and capacity advisor's observation side: per endpoint, read every Ready vLLM pod's
``/metrics`` through the API-server pod proxy; per cluster, read Curvine's master API; then judge with the pure
model in ``kvfleet.fleet.economics``.

Called by `kvfleet advise` and the ``advise`` task of ``kvfleet_hit_verification``; the scale-out DAG's scheduled
detection reads the capacity recommendation. Read-only: it changes nothing.

Metric names (vLLM ``vllm/v1/metrics/loggers.py``, 0.11.x): the histogram ``vllm:request_prompt_tokens``
("Number of prefill tokens processed.", buckets 1-2-5 up to max_model_len) gives the prompt-length distribution
and its ``_count`` the requests; LMCache's ``lmcache:num_hit_tokens`` / ``lmcache:num_requested_tokens``
(``lmcache/observability.py``) give the prefix reuse. The request rate is read the way Prometheus' ``rate()``
reads a counter: each pod's ``_count`` increase since the previous observation of the same pod (by uid), over the
wall seconds between the two observations (``economics.request_rate``: counter resets, new pods). The previous
observation is the one the hourly ``advise:<cluster>`` step recorded (``previous_observations``, named query
``advise_previous``): the newest at least ``MIN_INTERVAL_S`` (5 minutes) old. One closer than that is not a base:
a few seconds of counter increase would extrapolate a burst into an hourly rate (say, an hourly observation
recorded just before the scale-out detection), so it is ignored and the report's rate arithmetic says so.
Without a usable one, a pod's counter counts over its age only when its ``status.startTime`` is at least
``economics.MIN_POD_AGE_S`` in the past; otherwise the rate is unknown until the next observation, and no
per-hour total, working set or worker recommendation is derived (the verdict, from the lengths and the curve,
stands). kvfleet measures on the wall clock.

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


PREVIOUS_WITHIN = timedelta(days=1)  # an older observation is not a base for the rate (the pod age is, then)
# A closer observation is not a base for the rate either: a few seconds of counter increase would extrapolate a
# burst into an hourly rate. The same 5 minutes as the pod-age fallback (``economics.MIN_POD_AGE_S``).
MIN_INTERVAL_S = E.MIN_POD_AGE_S


def previous_observations(history: Any, cluster: str, now: datetime | None = None,
                          within: timedelta = PREVIOUS_WITHIN,
                          min_interval_s: float = MIN_INTERVAL_S) -> dict[str, dict[str, Any]]:
    """Each endpoint's recorded observation (``{"at", "pods": {uid: requests}}``) from the cluster's
    ``advise:<cluster>`` steps since ``within`` ago: the newest recorded at least ``min_interval_s`` before
    ``now``, else the newest (which the rate then refuses, saying why); empty without a history store.
    ``cluster``: its key, or a bare name (``kvfleet.history.clusters``)."""
    if history is None:
        return {}
    now = now or datetime.now(UTC)
    rows = history.queries.rows("advise_previous", cluster=cluster, cutoff=now - within,
                         latest=now - timedelta(seconds=max(min_interval_s, 0.0)))
    return {r["endpoint"]: r["observation"] for r in rows if isinstance(r.get("observation"), Mapping)}


@dataclass(frozen=True)
class PreviousCounts:
    """The base of an endpoint's request rate: the previous observation's counters by pod uid and the wall
    seconds since it (both None when there is no usable one), and why a previous observation was not used."""

    pods: dict[str, float] | None = None
    elapsed_s: float | None = None
    ignored: str | None = None


def _previous_counts(previous: Mapping[str, Any] | None, now: datetime,
                     min_interval_s: float = MIN_INTERVAL_S) -> PreviousCounts:
    """The previous observation's counters and the wall seconds since it; none when there is none, it is
    unreadable, or it is less than ``min_interval_s`` old (then the rate falls back to the pods' age)."""
    if not previous:
        return PreviousCounts()
    try:
        at = datetime.fromisoformat(str(previous["at"]))
        pods = {str(uid): float(n) for uid, n in dict(previous.get("pods") or {}).items()}
    except (KeyError, TypeError, ValueError, OverflowError):
        return PreviousCounts(ignored="the previous observation is unreadable and was not used")
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    elapsed = (now - at).total_seconds()
    if elapsed < min_interval_s:
        return PreviousCounts(ignored=(
            f"the previous observation, {elapsed:.1f} s before this one, is under the {min_interval_s:.0f} s "
            "minimum interval between observations and was not used (a rate over so short an interval would "
            "extrapolate a burst)"))
    return PreviousCounts(pods, elapsed)


def observe_endpoint(ctx: StageContext, ep: Endpoint, now: datetime,
                     previous: Mapping[str, Any] | None = None,
                     min_interval_s: float = MIN_INTERVAL_S) -> E.EndpointTraffic:
    """One endpoint's traffic at ``now`` (wall time). ``previous``: its last recorded observation (``{"at",
    "pods"}``), the base of the request rate when it is at least ``min_interval_s`` old."""
    pods = call(ctx.kube.core.list_namespaced_pod, ep.namespace, label_selector=f"app={ep.name}",
                what=f"pods of {ep.key}").items
    cumulative: dict[float, float] = {}
    sums = 0.0
    counts: list[E.PodCount] = []
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
        age = (now - started).total_seconds() if started else None
        counts.append(E.PodCount(uid=str(pod.metadata.uid or pod.metadata.name), requests=float(count or 0.0),
                                 age_s=age if age is not None and age > 0 else None))
        hits += prom.total(samples, "lmcache:num_hit_tokens") or 0.0
        requested += prom.total(samples, "lmcache:num_requested_tokens") or 0.0
    lengths = E.histogram_buckets(sorted(cumulative.items()), sums or None)
    n = sum(b.requests for b in lengths)
    base = _previous_counts(previous, now, min_interval_s)
    rate = E.request_rate(counts, base.pods, base.elapsed_s)
    if base.ignored:
        rate = replace(rate, arithmetic=f"{rate.arithmetic} ({base.ignored})")
    window = n * 3600 / rate.per_hour if rate.per_hour else 3600.0
    bpt, bpt_source = E.bytes_per_token_for(stored, ep.model_id)
    return E.EndpointTraffic(endpoint=ep.key, instance_type=ep.instance_type, lengths=lengths, window_s=window,
                             reuse_ratio=(hits / requested) if requested > 0 else None, bytes_per_token=bpt,
                             bytes_per_token_source=bpt_source, replicas=ep.replicas,
                             hourly_price_usd=prices_of(ctx).get(ep.instance_type), rate=rate,
                             observation={"at": now.isoformat(), "pods": {c.uid: c.requests for c in counts}})


def advise_cluster(ctx: StageContext, *, threshold: float = E.CAPACITY_THRESHOLD, retention_h: float = 24.0,
                   now: datetime | None = None,
                   sweeps: Mapping[str, Sequence[tuple[int, float]]] | None = None,
                   previous: Mapping[str, Mapping[str, Any]] | None = None,
                   min_interval_s: float = MIN_INTERVAL_S) -> ClusterReport:
    """``sweeps``: measured (tokens, speedup) curves by endpoint key (the hourly DAG passes each endpoint's
    recorded sweep); an endpoint without one is judged on the published curve. ``previous``: each endpoint's
    last observation (a report's ``observation``), by endpoint key; by default the ones the context's history
    recorded (none without a history store). ``now``: the observation time (wall clock); by default each
    endpoint's own, taken as it is read. ``min_interval_s``: a previous observation closer than that is not a
    base for the rate (``MIN_INTERVAL_S``, 5 minutes)."""
    report = ClusterReport(ctx.cluster.key)
    if previous is None:
        previous = previous_observations(ctx.history, ctx.cluster.key, now, min_interval_s=min_interval_s)
    for ep in ctx.inventory.endpoints_of(ctx.cluster.key):
        try:
            traffic = observe_endpoint(ctx, ep, now or datetime.now(UTC), previous.get(ep.key), min_interval_s)
            measured = (sweeps or {}).get(ep.key)
            if measured:
                traffic = replace(traffic, sweep=tuple((int(n), float(x)) for n, x in measured))
            report.endpoints.append(E.advise_endpoint(traffic, retention_h=retention_h))
        except KvfleetError as exc:
            report.errors.append(f"{ep.ref}: {exc}")
    l2_keys = {ep.key for ep in ctx.inventory.endpoints_of(ctx.cluster.key) if ep.l2}
    l2 = [a for a in report.endpoints if a.endpoint in l2_keys]
    try:
        ov = CurvineMaster(ctx.kube, ctx.cluster.curvine.namespace).overview()
        report.capacity = E.advise_cluster(ctx.cluster.name, l2, capacity_bytes=ov.capacity,
                                           workers=ov.live_workers, threshold=threshold,
                                           node_price_usd=prices_of(ctx).get(ctx.cluster.gpu_nodes.instance_type))
    except KvfleetError as exc:
        report.errors.append(f"Curvine master: {exc}")
    return report


def with_advised_workers(ctx: StageContext, decision: Mapping[str, Any], *, replicas: int, eligible: int,
                         worker_bytes: float, threshold: float = E.CAPACITY_THRESHOLD,
                         now: datetime | None = None,
                         previous: Mapping[str, Mapping[str, Any]] | None = None,
                         min_interval_s: float = MIN_INTERVAL_S) -> dict[str, Any]:
    """The scale-out DAG's scheduled detection with the advisor's capacity recommendation: observe the cluster's
    L2 endpoints, then ``economics.scale_decision_with_working_set``. When the advisor cannot observe (no
    endpoint readable, or no rate known yet), the decision is returned unchanged with the reason recorded.
    ``previous``, ``min_interval_s``: as for ``advise_cluster`` (by default the observations the context's history
    recorded, at least 5 minutes old)."""
    report = advise_cluster(ctx, threshold=threshold, now=now, previous=previous, min_interval_s=min_interval_s)
    l2_keys = {ep.key for ep in ctx.inventory.endpoints_of(ctx.cluster.key) if ep.l2}
    judged = [a for a in report.endpoints if a.endpoint in l2_keys and a.verdict != "insufficient_data"]
    # an endpoint whose request rate is unknown has no working set yet: the others' sum is a lower bound, which
    # can only raise the target (never lowers it)
    unknown = [a.endpoint for a in judged if a.working_set_bytes is None]
    known = [a for a in judged if a.working_set_bytes is not None]
    if not known:
        why = ("request rate unknown until the next observation" if unknown
               else "no L2 endpoint with enough observed traffic")
        return {**decision, "advisor": f"{why}: capacity not advised", "advisor_errors": report.errors,
                "advisor_rate_unknown": unknown}
    working_set = sum(a.working_set_bytes or 0.0 for a in known)
    out = E.scale_decision_with_working_set(decision, replicas=replicas, eligible=eligible,
                                            working_set_bytes=working_set, worker_bytes=worker_bytes,
                                            threshold=threshold)
    return {**out, "advisor_errors": report.errors, "advisor_rate_unknown": unknown}
