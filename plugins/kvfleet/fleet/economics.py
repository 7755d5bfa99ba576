"""L2 economics: the expected TTFT speedup for a prompt length, from the published curve (DOMAIN.md).

Pure. Stage 5 compares a measured speedup with ``expected_speedup``; a cross-pod hit that is full but slower
than the curve minus a tolerance is ``degraded``. Profiles per instance type are configurable; the default is
the blog's ml.g5.4xlarge table (Qwen2-7B, fp16, TP=1, two nodes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

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


def bytes_per_token_from_stored(size_gib: float, tokens: int) -> float:
    """Bytes a token takes, from an LMCache ``Stored N out of total M tokens. size: X GB`` line (X is GiB)."""
    if tokens <= 0:
        raise ValueError("tokens must be positive")
    return size_gib * GIB / tokens


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


@dataclass(frozen=True)
class EndpointAdvice:
    endpoint: str
    verdict: str  # pays_off | marginal | does_not_pay_off | insufficient_data
    requests: float
    requests_per_hour: float
    mean_prompt_tokens: float
    share_below_payoff: float
    saved_ms_per_request: float
    saved_s_per_hour: float
    saved_fraction: float
    working_set_bytes: float
    curve: str
    arithmetic: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    prefer_prefix_routing: bool = False
    value_usd_per_hour: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def advise_endpoint(t: EndpointTraffic, *, retention_h: float = 24.0, payoff_tokens: int = MIN_USEFUL_TOKENS,
                    min_requests: int = MIN_REQUESTS,
                    profiles: Mapping[str, Sequence[tuple[int, float]]] | None = None) -> EndpointAdvice:
    """Integrate the speedup curve over the observed length distribution. The saving of a request of ``n`` tokens
    is ``cold(n) x (1 - 1/speedup(n)) x reuse``; the verdict compares the saved share of the endpoint's TTFT
    with ``PAYS_OFF_SAVED_FRACTION`` and ``MARGINAL_SAVED_FRACTION``."""
    requests = sum(b.requests for b in t.lengths)
    per_hour = requests * 3600 / t.window_s if t.window_s > 0 else 0.0
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
    reuse = t.reuse_ratio
    if reuse is None:
        reuse = 1.0
        assumptions.append("prefix reuse unknown (no LMCache hit metrics): upper bound, every prefix reused")
    bpt = t.bytes_per_token or kv_bytes_per_token(28, 4, 128, 2)
    if t.bytes_per_token is None:
        assumptions.append("bytes per token of Qwen2-7B fp16 (57,344 B) used: no Stored line or model config given")
    if requests < min_requests:
        return EndpointAdvice(
            endpoint=t.endpoint, verdict="insufficient_data", requests=requests, requests_per_hour=round(per_hour, 1),
            mean_prompt_tokens=0.0, share_below_payoff=0.0, saved_ms_per_request=0.0, saved_s_per_hour=0.0,
            saved_fraction=0.0, working_set_bytes=0.0, curve=curve_name, assumptions=assumptions,
            arithmetic=[f"{requests:.0f} request(s) observed < {min_requests} needed for a verdict"])
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
    unique_tokens_per_h = per_hour * mean_tokens * (1 - min(reuse, 1.0) if t.reuse_ratio is not None else 1.0)
    working_set = unique_tokens_per_h * retention_h * bpt
    saved_s_h = saved_ms * per_hour / 1000
    value = round(saved_s_h / 3600 * t.hourly_price_usd, 4) if t.hourly_price_usd is not None else None
    arithmetic = [
        f"{requests:.0f} requests in {t.window_s:.0f} s = {per_hour:.1f}/h; mean prompt {mean_tokens:.0f} tokens; "
        f"{below:.0%} below the {payoff_tokens}-token payoff threshold",
        f"saving per request = sum over lengths of cold(n) x (1 - 1/speedup(n)) x reuse {reuse:.2f} "
        f"= {saved_ms:.1f} ms of a mean cold TTFT {cold_total / requests:.1f} ms ({fraction:.1%} saved, "
        f"{curve_name})",
        f"verdict {verdict}: pays_off at >= {PAYS_OFF_SAVED_FRACTION:.0%} saved, marginal at >= "
        f"{MARGINAL_SAVED_FRACTION:.0%}",
        f"working set = {unique_tokens_per_h:.0f} new prefix tokens/h x {retention_h:g} h x {bpt:.0f} B/token "
        f"= {working_set / GIB:.2f} GiB",
    ]
    if value is not None:
        arithmetic.append(f"value = {saved_s_h:.1f} s of TTFT saved/h x ${t.hourly_price_usd}/h / 3600 = ${value}/h")
    return EndpointAdvice(
        endpoint=t.endpoint, verdict=verdict, requests=requests, requests_per_hour=round(per_hour, 1),
        mean_prompt_tokens=round(mean_tokens, 1), share_below_payoff=round(below, 3),
        saved_ms_per_request=round(saved_ms, 1), saved_s_per_hour=round(saved_s_h, 2),
        saved_fraction=round(fraction, 3), working_set_bytes=round(working_set), curve=curve_name,
        arithmetic=arithmetic, assumptions=assumptions, prefer_prefix_routing=below >= 0.5,
        value_usd_per_hour=value)


@dataclass(frozen=True)
class ClusterAdvice:
    cluster: str
    recommendation: str  # add_workers | fine | over_provisioned
    add_workers: int
    working_set_bytes: float
    capacity_bytes: float
    workers: int
    usage: float
    arithmetic: list[str]

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def advise_cluster(cluster: str, endpoints: Sequence[EndpointAdvice], *, capacity_bytes: float, workers: int,
                   threshold: float = CAPACITY_THRESHOLD, min_workers: int = 1) -> ClusterAdvice:
    """The cluster's total working set against Curvine's capacity: add N workers above ``threshold`` x capacity,
    over-provisioned below ``OVERPROVISIONED_BELOW`` (never below ``min_workers``), fine otherwise."""
    if not 0 < threshold <= 1:
        raise ValueError(f"capacity threshold {threshold} is outside (0, 1]")
    total = sum(e.working_set_bytes for e in endpoints)
    per_worker = capacity_bytes / workers if workers > 0 else CURVINE_WORKER_BYTES
    usage = total / capacity_bytes if capacity_bytes > 0 else math.inf
    arithmetic = [f"working set {total / GIB:.2f} GiB over {len(endpoints)} endpoint(s); capacity "
                  f"{capacity_bytes / GIB:.1f} GiB on {workers} worker(s) ({per_worker / GIB:.1f} GiB each); "
                  f"usage {usage:.1%} (threshold {threshold:.0%})"]
    add = 0
    if usage > threshold:
        need = math.ceil(total / (threshold * per_worker))
        add = max(1, need - workers)
        recommendation = "add_workers"
        arithmetic.append(f"ceil({total / GIB:.2f} GiB / ({threshold:.0%} x {per_worker / GIB:.1f} GiB)) = {need} "
                          f"worker(s) needed -> add {add}")
    elif usage < OVERPROVISIONED_BELOW and workers > min_workers:
        recommendation = "over_provisioned"
        arithmetic.append(f"usage below {OVERPROVISIONED_BELOW:.0%}; the pool could shrink, but workers also keep "
                          "writes node-local, so shrink only below one worker per GPU node deliberately")
    else:
        recommendation = "fine"
    return ClusterAdvice(cluster=cluster, recommendation=recommendation, add_workers=add, working_set_bytes=total,
                         capacity_bytes=capacity_bytes, workers=workers,
                         usage=round(usage, 4) if math.isfinite(usage) else -1.0, arithmetic=arithmetic)
