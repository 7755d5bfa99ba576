"""L2 economics: the expected TTFT speedup for a prompt length, from the published curve
(docs/reference/vllm.md#published-figures).

Pure. Stage 5 compares a measured speedup with ``expected_speedup``; a cross-pod hit that is full but slower
than the curve minus a tolerance is ``degraded``. Profiles per instance type are configurable; the default is
the blog's ml.g5.4xlarge table (Qwen2-7B, fp16, TP=1, two nodes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

# (prompt tokens, speedup) — 0.99x at 500, 1.7x at 1,000, 2.7x at 2,500 (774 ms -> 287 ms), flat after.
PUBLISHED_G5: tuple[tuple[int, float], ...] = ((500, 0.99), (1000, 1.7), (2500, 2.7), (3000, 2.7))
# ml.g6e.4xlarge multi-turn: 1.22x at 530 tokens -> 1.34x at 2,114 tokens.
PUBLISHED_G6E: tuple[tuple[int, float], ...] = ((530, 1.22), (2114, 1.34), (3000, 1.34))
PROFILES: dict[str, tuple[tuple[int, float], ...]] = {
    "ml.g5.4xlarge": PUBLISHED_G5,
    "ml.g6e.4xlarge": PUBLISHED_G6E,
    "ml.g6.16xlarge": PUBLISHED_G6E,
}
MIN_USEFUL_TOKENS = 1000  # below ~1,000 tokens L2 does not pay off; prefer L0/L1 (prefix-aware routing)


def interpolate(curve: Sequence[tuple[int, float]], tokens: int) -> float:
    if tokens <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in pairwise(curve):
        if tokens <= x1:
            return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
    return curve[-1][1]


def expected_speedup(tokens: int, instance_type: str,
                     profiles: Mapping[str, Sequence[tuple[int, float]]] | None = None) -> float:
    table = (profiles or PROFILES).get(instance_type) or PUBLISHED_G5
    return round(interpolate(table, tokens), 3)


# ---------------------------------------------------------------------------------------------------------------
# The L2 advisor: does L2 pay off for an endpoint, how much NVMe does its working set need, how many workers.
#
# Inputs are observations (vLLM's prompt-length histogram, LMCache hit counters, the request rate) and published
# figures; every verdict carries the arithmetic that produced it, so a platform team can check it by hand.
# ---------------------------------------------------------------------------------------------------------------

# Cold TTFT anchor: the only published cold figure is 774 ms at 2,500 tokens (ml.g5.4xlarge, Qwen2-7B, fp16).
# Between 0 and that anchor the advisor scales cold TTFT linearly with the prompt length; this is an assumption
# (no other cold figure is published) and it is printed with every estimate that uses it.
COLD_TTFT_ANCHOR: dict[str, tuple[int, float]] = {"ml.g5.4xlarge": (2500, 774.0)}
DEFAULT_COLD_ANCHOR = (2500, 774.0)
# LMCache logs Stored sizes in GiB although it prints "GB" (0.1028 "GB" for 1,925 tokens of Qwen2-7B fp16 is
# 57,343 bytes a token = 2 x 28 layers x 4 KV heads x 128 head dim x 2 bytes).
GIB = 1024 ** 3
CURVINE_WORKER_BYTES = 100 * GIB  # the sources' 100 Gi of NVMe per worker; the live figure comes from the master API
PAYS_OFF_SAVED_FRACTION = 0.25  # the cache removes at least a quarter of the endpoint's TTFT
MARGINAL_SAVED_FRACTION = 0.10
MIN_REQUESTS = 20  # fewer observed requests than this: insufficient_data
CAPACITY_THRESHOLD = 0.80  # recommend more workers when the working set exceeds this share of the capacity
OVERPROVISIONED_BELOW = 0.20


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token takes: K and V for every layer and KV head."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


# KV shape of the models the sources name, from each model's Hugging Face ``config.json`` (num_hidden_layers,
# num_key_value_heads, hidden_size / num_attention_heads), at 2 bytes (fp16/bf16): Qwen/Qwen2-7B-Instruct
# (28, 4, 3584/28 = 128), meta-llama/Meta-Llama-3-8B-Instruct (32, 8, 4096/32 = 128), Qwen/Qwen2.5-32B-Instruct
# (64, 8, 5120/40 = 128). The first agrees with the blog's Stored line (0.1028 GiB for 1,925 tokens).
MODEL_KV_SHAPES: dict[str, tuple[int, int, int]] = {
    "qwen/qwen2-7b-instruct": (28, 4, 128),
    "qwen/qwen2-7b": (28, 4, 128),
    "meta-llama/meta-llama-3-8b-instruct": (32, 8, 128),
    "meta-llama/meta-llama-3-8b": (32, 8, 128),
    "qwen/qwen2.5-32b-instruct": (64, 8, 128),
}
DEFAULT_BYTES_PER_TOKEN = kv_bytes_per_token(28, 4, 128, 2)  # Qwen2-7B fp16, the sources' model
MIN_STORED_TOKENS = 256  # one LMCache chunk: fewer stored tokens say too little about the size per token


def bytes_per_token_for(stored: Sequence[tuple[float, int]] = (), model_id: str | None = None) -> tuple[float, str]:
    """Bytes of KV one token takes, and where the figure comes from: the measured ``Stored`` lines
    ``(size GiB, tokens)`` when they cover at least one chunk, else the model's config, else Qwen2-7B fp16."""
    sized = [(g, n) for g, n in stored if g is not None and g > 0 and n > 0]
    tokens = sum(n for _, n in sized)
    if tokens >= MIN_STORED_TOKENS:
        gib = sum(g for g, _ in sized)
        return gib * GIB / tokens, f"measured: {len(sized)} LMCache Stored line(s), {gib:.4f} GiB for {tokens} tokens"
    shape = MODEL_KV_SHAPES.get((model_id or "").lower())
    if shape is not None:
        layers, heads, dim = shape
        return float(kv_bytes_per_token(layers, heads, dim)), (
            f"model config of {model_id}: 2 x {layers} layers x {heads} KV heads x {dim} head dim x 2 bytes")
    return float(DEFAULT_BYTES_PER_TOKEN), (
        f"no Stored line and no known config for {str(model_id)[:60]!r}: Qwen2-7B fp16 ({DEFAULT_BYTES_PER_TOKEN} B)")


def workers_needed(working_set_bytes: float, capacity_per_worker: float, threshold: float = CAPACITY_THRESHOLD) -> int:
    """Curvine workers that hold ``working_set_bytes`` at no more than ``threshold`` of their capacity: the
    scale-out detection's target count (0 for an empty working set)."""
    if capacity_per_worker <= 0 or not math.isfinite(capacity_per_worker):
        raise ValueError(f"capacity per worker {capacity_per_worker} must be a positive number of bytes")
    if not 0 < threshold <= 1:
        raise ValueError(f"capacity threshold {threshold} is outside (0, 1]")
    if working_set_bytes <= 0:
        return 0
    return math.ceil(working_set_bytes / (threshold * capacity_per_worker))


def bytes_per_token_from_stored(size_gib: float, tokens: int) -> float:
    """Bytes a token takes, from an LMCache ``Stored N out of total M tokens. size: X GB`` line (X is GiB)."""
    if tokens <= 0:
        raise ValueError("tokens must be positive")
    return size_gib * GIB / tokens


MIN_POD_AGE_S = 300.0  # no previous observation: count / pod age only for pods started at least this long ago
RATE_SOURCES = ("delta", "pod_age", "unknown")


@dataclass(frozen=True)
class PodCount:
    """One pod's request counter (vLLM's ``vllm:request_prompt_tokens_count``) at an observation."""

    uid: str
    requests: float
    age_s: float | None  # wall seconds since the pod's startTime; None when unknown or not in the past


@dataclass(frozen=True)
class RateEstimate:
    per_hour: float | None  # None: unknown (no per-hour figure may be derived from it)
    source: str  # delta | pod_age | unknown
    arithmetic: str


def request_rate(pods: Sequence[PodCount], previous: Mapping[str, float] | None = None,
                 elapsed_s: float | None = None, *, min_age_s: float = MIN_POD_AGE_S) -> RateEstimate:
    """An endpoint's request rate, the way Prometheus' ``rate()`` reads counters: the increase of each pod's
    counter since the ``previous`` observation (counters by pod uid) over the wall seconds between the two.

    A counter lower than before was reset (the container restarted): the new value accumulated since the reset,
    inside the interval, so it counts over the interval (``rate()``'s rule), or over the pod's age if shorter. A pod
    absent from the previous observation that started since then counts over its age. Without a previous
    observation, a pod's counter counts over its age only when its start time is at least ``min_age_s`` in the
    past; otherwise the rate is unknown until the next observation. The endpoint's source is its weakest pod's:
    unknown, then pod_age, then delta."""
    if not pods:
        return RateEstimate(None, "unknown", "rate unknown: no Ready pod was read")
    usable = previous is not None and elapsed_s is not None and elapsed_s > 0
    delta = by_age = 0.0
    n_delta = n_age = resets = 0
    unknown: list[str] = []
    for p in pods:
        age = p.age_s if p.age_s is not None and p.age_s > 0 else None
        if usable and previous is not None and elapsed_s is not None and p.uid in previous:
            before = float(previous[p.uid])
            if p.requests >= before:
                delta += (p.requests - before) / elapsed_s
            else:  # a reset: the counter started again from zero within the interval
                resets += 1
                delta += p.requests / min(elapsed_s, age or elapsed_s)
            n_delta += 1
        elif usable and elapsed_s is not None and age is not None and age <= elapsed_s:
            delta += p.requests / age  # started since the previous observation: its whole counter is new
            n_delta += 1
        elif age is not None and age >= min_age_s:
            by_age += p.requests / age
            n_age += 1
        else:
            unknown.append(p.uid)
    if unknown:
        why = ("no previous observation" if not usable else "absent from the previous observation") + (
            f" and no start time at least {min_age_s:.0f} s in the past")
        return RateEstimate(None, "unknown", f"rate unknown until the next observation: {len(unknown)} of "
                                             f"{len(pods)} pod(s) with {why}")
    per_hour = (delta + by_age) * 3600
    parts = []
    if n_delta:
        parts.append(f"{n_delta} pod(s) by counter increase over {elapsed_s:.0f} s between observations "
                     f"= {delta * 3600:.1f}/h" + (f" ({resets} counter reset(s))" if resets else ""))
    if n_age:
        parts.append(f"{n_age} pod(s) by counter over pod age (>= {min_age_s:.0f} s) = {by_age * 3600:.1f}/h")
    return RateEstimate(per_hour, "pod_age" if n_age else "delta", f"rate {per_hour:.1f}/h: " + "; ".join(parts))


@dataclass(frozen=True)
class LengthBucket:
    tokens: float  # the bucket's representative prompt length
    requests: float


def histogram_buckets(cumulative: list[tuple[float, float]], total_sum: float | None = None) -> list[LengthBucket]:
    """Prometheus cumulative buckets ``(le, count)`` (``le`` may be ``inf``) -> per-bucket requests at a
    representative length. vLLM's 1-2-5 buckets are coarse (2,000..5,000), so when ``_sum`` is known the
    midpoints are scaled to reproduce the observed mean, each kept inside its own bucket; the ``+Inf`` bucket
    starts at the last finite bound."""
    spans: list[tuple[float, float, float]] = []  # (lower, upper, requests)
    prev_le, prev_count = 0.0, 0.0
    for le, count in sorted(cumulative, key=lambda b: b[0]):
        n = max(0.0, count - prev_count)
        if n > 0:
            spans.append((prev_le, le, n))
        prev_count = max(prev_count, count)
        if not math.isinf(le):
            prev_le = le
    mids = [(lo + hi) / 2 if not math.isinf(hi) else lo for lo, hi, _ in spans]
    if total_sum is not None and spans:
        finite = sum(m * n for m, (_, hi, n) in zip(mids, spans, strict=True) if not math.isinf(hi))
        if math.isinf(spans[-1][1]):  # the +Inf bucket takes the mean the sum leaves for it
            lo, _, n = spans[-1]
            mids[-1] = max(lo, (total_sum - finite) / n)
        elif finite > 0:  # no open bucket: scale the midpoints to the observed mean, each inside its bucket
            factor = total_sum / finite
            mids = [min(max(m * factor, lo), hi) for m, (lo, hi, _) in zip(mids, spans, strict=True)]
    return [LengthBucket(tokens=m, requests=n) for m, (_, _, n) in zip(mids, spans, strict=True)]


def cold_ttft_ms(tokens: float, instance_type: str) -> float:
    at, ms = COLD_TTFT_ANCHOR.get(instance_type, DEFAULT_COLD_ANCHOR)
    return ms * tokens / at


@dataclass(frozen=True)
class EndpointTraffic:
    """What was observed of one endpoint over ``window_s`` seconds."""

    endpoint: str
    instance_type: str
    lengths: list[LengthBucket]
    window_s: float
    reuse_ratio: float | None = None  # LMCache hit tokens / requested tokens, when LMCache metrics are readable
    bytes_per_token: float | None = None
    sweep: tuple[tuple[int, float], ...] | None = None  # measured (tokens, speedup) points, when a sweep ran
    hourly_price_usd: float | None = None  # the instance's hourly price, from the inventory (never fetched)
    bytes_per_token_source: str | None = None  # where bytes_per_token comes from (bytes_per_token_for)
    replicas: int = 0  # the endpoint's replicas (one GPU node share each): the GPU cost side when priced
    # the request rate, when estimated from observations (request_rate); None: requests over window_s
    rate: RateEstimate | None = None
    observation: dict[str, Any] | None = None  # {"at": ISO wall time, "pods": {uid: requests}}: the next delta's base


@dataclass(frozen=True)
class EndpointAdvice:
    endpoint: str
    verdict: str  # pays_off | marginal | does_not_pay_off | insufficient_data
    requests: float
    requests_per_hour: float | None
    mean_prompt_tokens: float
    share_below_payoff: float
    saved_ms_per_request: float
    saved_s_per_hour: float | None
    saved_fraction: float
    working_set_bytes: float | None
    curve: str
    arithmetic: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    prefer_prefix_routing: bool = False
    value_usd_per_hour: float | None = None
    instance_type: str = ""
    replicas: int = 0
    bytes_per_token: float = 0.0
    bytes_per_token_source: str = ""
    hourly_price_usd: float | None = None
    gpu_cost_usd_per_hour: float | None = None
    # the observed prompt-length distribution the verdict integrates (what the kvfleet page plots)
    lengths: list[dict[str, float]] = field(default_factory=list)
    rate_source: str = "pod_age"  # delta | pod_age | unknown (requests_per_hour, saved_s_per_hour and
    # working_set_bytes are None when unknown)
    observation: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _curve_of(t: EndpointTraffic, profiles: Mapping[str, Sequence[tuple[int, float]]] | None,
              ) -> tuple[tuple[tuple[int, float], ...], str, list[str]]:
    """The speedup curve an endpoint is judged on (its measured sweep, else the published one for its instance
    type, else the g5 one), its name, and the assumptions that choice makes."""
    assumptions: list[str] = []
    known = t.instance_type in (profiles or PROFILES)
    if t.sweep:
        curve, curve_name = tuple(sorted(t.sweep)), "measured sweep"
    else:
        curve = tuple((profiles or PROFILES).get(t.instance_type) or PUBLISHED_G5)
        curve_name = f"published curve for {t.instance_type}" if known else "published ml.g5.4xlarge curve"
        if not known:
            assumptions.append(f"no published curve for {t.instance_type!s:.40}: the ml.g5.4xlarge curve is used")
    if t.instance_type not in COLD_TTFT_ANCHOR:
        assumptions.append("cold TTFT scaled linearly from the published 774 ms at 2,500 tokens (ml.g5.4xlarge)")
    else:
        assumptions.append("cold TTFT scaled linearly from the published anchor; no other cold figure is published")
    return curve, curve_name, assumptions


def advise_endpoint(t: EndpointTraffic, *, retention_h: float = 24.0, payoff_tokens: int = MIN_USEFUL_TOKENS,
                    min_requests: int = MIN_REQUESTS,
                    profiles: Mapping[str, Sequence[tuple[int, float]]] | None = None) -> EndpointAdvice:
    """Integrate the speedup curve over the observed length distribution. The saving of a request of ``n`` tokens
    is ``cold(n) x (1 - 1/speedup(n)) x reuse``; the verdict compares the saved share of the endpoint's TTFT
    with ``PAYS_OFF_SAVED_FRACTION`` and ``MARGINAL_SAVED_FRACTION``."""
    requests = sum(b.requests for b in t.lengths)
    if t.rate is not None:
        per_hour, rate_source, rate_line = t.rate.per_hour, t.rate.source, t.rate.arithmetic
    else:  # the counters over the time they accumulated in (the window given)
        per_hour = requests * 3600 / t.window_s if t.window_s > 0 else 0.0
        rate_source, rate_line = "pod_age", f"{requests:.0f} requests in {t.window_s:.0f} s = {per_hour:.1f}/h"
    curve, curve_name, assumptions = _curve_of(t, profiles)
    reuse = t.reuse_ratio
    if reuse is None:
        reuse = 1.0
        assumptions.append("prefix reuse unknown (no LMCache hit metrics): upper bound, every prefix reused")
    if t.bytes_per_token:
        bpt, bpt_source = float(t.bytes_per_token), t.bytes_per_token_source or "given"
    else:
        bpt, bpt_source = bytes_per_token_for()
        assumptions.append(f"bytes per token: {bpt_source}")
    gpu_cost = (round(t.replicas * t.hourly_price_usd, 4)
                if t.hourly_price_usd is not None and t.replicas > 0 else None)
    if t.hourly_price_usd is None:
        assumptions.append(f"no price for {t.instance_type!s:.40} in the inventory's prices: the cost side is omitted")
    common: dict[str, Any] = {
        "instance_type": t.instance_type, "replicas": t.replicas, "bytes_per_token": round(bpt, 1),
        "bytes_per_token_source": bpt_source, "hourly_price_usd": t.hourly_price_usd,
        "gpu_cost_usd_per_hour": gpu_cost,
        "lengths": [{"tokens": round(b.tokens, 1), "requests": round(b.requests, 3)} for b in t.lengths],
        "rate_source": rate_source, "observation": t.observation}
    hourly = round(per_hour, 1) if per_hour is not None else None
    if requests < min_requests:
        return EndpointAdvice(
            endpoint=t.endpoint, verdict="insufficient_data", requests=requests, requests_per_hour=hourly,
            # so few requests in all hold a negligible working set, whatever their rate
            mean_prompt_tokens=0.0, share_below_payoff=0.0, saved_ms_per_request=0.0, saved_s_per_hour=0.0,
            saved_fraction=0.0, working_set_bytes=0.0, curve=curve_name, assumptions=assumptions,
            arithmetic=[f"{requests:.0f} request(s) observed < {min_requests} needed for a verdict", rate_line],
            **common)
    mean_tokens = sum(b.tokens * b.requests for b in t.lengths) / requests
    below = sum(b.requests for b in t.lengths if b.tokens < payoff_tokens) / requests
    cold_total = saved_total = 0.0
    for b in t.lengths:
        cold = cold_ttft_ms(b.tokens, t.instance_type)
        speed = interpolate(curve, round(b.tokens))
        cold_total += cold * b.requests
        saved_total += cold * (1 - 1 / speed) * reuse * b.requests
    saved_ms = saved_total / requests
    fraction = saved_total / cold_total if cold_total else 0.0
    verdict = ("pays_off" if fraction >= PAYS_OFF_SAVED_FRACTION else
               "marginal" if fraction >= MARGINAL_SAVED_FRACTION else "does_not_pay_off")
    new_share = 1 - min(reuse, 1.0) if t.reuse_ratio is not None else 1.0
    head = (rate_line if t.rate is None else f"{requests:.0f} requests observed; {rate_line}") + (
        f"; mean prompt {mean_tokens:.0f} tokens; {below:.0%} below the {payoff_tokens}-token payoff threshold")
    if per_hour is None:  # the verdict stands on the lengths and the curve; nothing per hour is derived
        unique_tokens_per_h = working_set = saved_s_h = None
        value = None
        ws_line = ("working set unknown: the request rate is unknown until the next observation (no per-hour "
                   "total, working set or worker recommendation from it)")
    else:
        unique_tokens_per_h = per_hour * mean_tokens * new_share
        working_set = unique_tokens_per_h * retention_h * bpt
        saved_s_h = saved_ms * per_hour / 1000
        value = round(saved_s_h / 3600 * t.hourly_price_usd, 4) if t.hourly_price_usd is not None else None
        ws_line = (f"working set = {unique_tokens_per_h:.0f} new prefix tokens/h x {retention_h:g} h x {bpt:.0f} "
                   f"B/token = {working_set / GIB:.2f} GiB")
    arithmetic = [
        head,
        f"saving per request = sum over lengths of cold(n) x (1 - 1/speedup(n)) x reuse {reuse:.2f} "
        f"= {saved_ms:.1f} ms of a mean cold TTFT {cold_total / requests:.1f} ms ({fraction:.1%} saved, "
        f"{curve_name})",
        f"verdict {verdict}: pays_off at >= {PAYS_OFF_SAVED_FRACTION:.0%} saved, marginal at >= "
        f"{MARGINAL_SAVED_FRACTION:.0%}",
        ws_line,
    ]
    if value is not None and saved_s_h is not None:
        arithmetic.append(f"value = {saved_s_h:.1f} s of TTFT saved/h x ${t.hourly_price_usd}/h / 3600 = ${value}/h")
    if gpu_cost is not None:
        arithmetic.append(f"GPU cost = {t.replicas} replica(s) x ${t.hourly_price_usd}/h = ${gpu_cost}/h")
    return EndpointAdvice(
        endpoint=t.endpoint, verdict=verdict, requests=requests, requests_per_hour=hourly,
        mean_prompt_tokens=round(mean_tokens, 1), share_below_payoff=round(below, 3),
        saved_ms_per_request=round(saved_ms, 1),
        saved_s_per_hour=round(saved_s_h, 2) if saved_s_h is not None else None, saved_fraction=round(fraction, 3),
        working_set_bytes=round(working_set) if working_set is not None else None, curve=curve_name,
        arithmetic=arithmetic, assumptions=assumptions, prefer_prefix_routing=below >= 0.5,
        value_usd_per_hour=value, **common)


@dataclass(frozen=True)
class ClusterAdvice:
    cluster: str
    recommendation: str  # add_workers | fine | over_provisioned | unknown (an endpoint's rate is unknown)
    add_workers: int
    working_set_bytes: float
    capacity_bytes: float
    workers: int
    usage: float
    arithmetic: list[str]
    threshold: float = CAPACITY_THRESHOLD
    workers_needed: int = 0
    cost: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def advise_cluster(cluster: str, endpoints: Sequence[EndpointAdvice], *, capacity_bytes: float, workers: int,
                   threshold: float = CAPACITY_THRESHOLD, min_workers: int = 1,
                   node_price_usd: float | None = None) -> ClusterAdvice:
    """The cluster's total working set against Curvine's capacity: add N workers above ``threshold`` x capacity,
    over-provisioned below ``OVERPROVISIONED_BELOW`` (never below ``min_workers``), fine otherwise.
    ``node_price_usd``: the hourly price of the cluster's GPU node type, when the inventory prices it."""
    if not 0 < threshold <= 1:
        raise ValueError(f"capacity threshold {threshold} is outside (0, 1]")
    unknown = [e.endpoint for e in endpoints if e.working_set_bytes is None]
    total = sum(e.working_set_bytes or 0.0 for e in endpoints)
    per_worker = capacity_bytes / workers if workers > 0 else CURVINE_WORKER_BYTES
    needed = workers_needed(total, per_worker, threshold)
    usage = total / capacity_bytes if capacity_bytes > 0 else math.inf
    arithmetic = [f"working set {total / GIB:.2f} GiB over {len(endpoints) - len(unknown)} endpoint(s); capacity "
                  f"{capacity_bytes / GIB:.1f} GiB on {workers} worker(s) ({per_worker / GIB:.1f} GiB each); "
                  f"usage {usage:.1%} (threshold {threshold:.0%})"]
    if unknown:
        arithmetic.append(f"working set unknown for {len(unknown)} endpoint(s) (request rate unknown until the next "
                          f"observation): {', '.join(unknown)[:200]}; the figures above are a lower bound")
    add = 0
    if usage > threshold:
        add = max(1, needed - workers)
        recommendation = "add_workers"
        arithmetic.append(f"ceil({total / GIB:.2f} GiB / ({threshold:.0%} x {per_worker / GIB:.1f} GiB)) = {needed} "
                          f"worker(s) needed -> add {add}" + (" at least" if unknown else ""))
    elif unknown:
        recommendation = "unknown"
        arithmetic.append("no worker recommendation until every endpoint's request rate is known")
    elif usage < OVERPROVISIONED_BELOW and workers > min_workers:
        recommendation = "over_provisioned"
        arithmetic.append(f"usage below {OVERPROVISIONED_BELOW:.0%}; the pool could shrink, but workers also keep "
                          "writes node-local, so shrink only below one worker per GPU node deliberately")
    else:
        recommendation = "fine"
    cost = cluster_cost(endpoints, add, node_price_usd)
    if cost is not None:
        arithmetic.extend(cost["arithmetic"])
    return ClusterAdvice(cluster=cluster, recommendation=recommendation, add_workers=add, working_set_bytes=total,
                         capacity_bytes=capacity_bytes, workers=workers,
                         usage=round(usage, 4) if math.isfinite(usage) else -1.0, arithmetic=arithmetic,
                         threshold=threshold, workers_needed=needed, cost=cost)


def cluster_cost(endpoints: Sequence[EndpointAdvice], add_workers: int,
                 node_price_usd: float | None) -> dict[str, Any] | None:
    """The cost side of a cluster, from the inventory's prices only (never fetched): the GPU cost of the priced
    endpoints, the TTFT value L2 saves on them, and what added workers cost. Curvine workers use the GPU nodes'
    own NVMe (no extra cost) while there is a node without one; a worker beyond the nodes needs a node, so
    ``add_workers_usd_per_hour`` is that upper bound. ``None`` when nothing is priced."""
    priced = [e for e in endpoints if e.hourly_price_usd is not None]
    if not priced and node_price_usd is None:
        return None
    gpu = round(sum(e.gpu_cost_usd_per_hour or 0.0 for e in priced), 4)
    value = round(sum(e.value_usd_per_hour or 0.0 for e in priced), 4)
    unpriced = sorted({e.instance_type for e in endpoints if e.hourly_price_usd is None})
    added = round(add_workers * node_price_usd, 4) if node_price_usd is not None else None
    lines = [f"cost: GPU ${gpu}/h on {len(priced)} priced endpoint(s); L2 saves ${value}/h of prefill time"]
    if added is not None and add_workers:
        lines.append(f"cost: {add_workers} added worker(s) x ${node_price_usd}/h = ${added}/h at most (free on the "
                     "NVMe of GPU nodes that have no worker yet)")
    if unpriced:
        lines.append(f"cost: no price for {', '.join(unpriced)[:200]}")
    return {"gpu_usd_per_hour": gpu, "saved_usd_per_hour": value, "add_workers_usd_per_hour": added,
            "node_price_usd_per_hour": node_price_usd, "unpriced_instance_types": unpriced, "arithmetic": lines}


def scale_decision_with_working_set(decision: Mapping[str, Any], *, replicas: int, eligible: int,
                                    working_set_bytes: float, worker_bytes: float,
                                    threshold: float = CAPACITY_THRESHOLD) -> dict[str, Any]:
    """The scale-out detection's decision (``curvine_gates.scale_out_due``: ``due``, ``reasons``, ``target``)
    with the advisor's capacity recommendation folded in: when the observed working set needs more workers than
    run (``workers_needed`` at ``threshold``), the target grows to that, capped at one worker per eligible node
    (a reason then names the GPU nodes missing). Never lowers the decision's own target."""
    out = dict(decision)
    reasons = list(out.get("reasons") or [])
    target = int(out.get("target", replicas))
    needed = workers_needed(working_set_bytes, worker_bytes, threshold)
    out.update(advised_workers=needed, working_set_bytes=round(working_set_bytes))
    if needed > replicas:
        cap = max(replicas, eligible)
        reason = (f"advisor: working set {working_set_bytes / GIB:.1f} GiB needs {needed} worker(s) of "
                  f"{worker_bytes / GIB:.0f} GiB at {threshold:.0%}")
        if needed > cap:
            reason += f"; only {cap} eligible node(s): add {needed - cap} GPU node(s) to hold it"
        reasons.append(reason)
        target = max(target, min(needed, cap))
    out.update(reasons=reasons, target=target, due=bool(out.get("due")) or target > replicas)
    return out
