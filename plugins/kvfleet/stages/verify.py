"""Stage 5: cross-pod L2 hit verification of one endpoint (a reusable step: rollout gates, the hourly DAG).

1. Pick two Ready pods on **different nodes**; none -> ``unverifiable`` with the reason (never a pass).
2. Pre-check their env (PYTHONHASHSEED, chunk size, URL, serde, model): a mismatch is diagnosed before any
   request is sent.
3. Probe: a prompt new for every run (a nonce first, then deterministic filler) of N tokens — at least two
   chunks, because LMCache stores nothing shorter than a chunk — sent streaming through the API-server pod proxy
   to pod A (cold), then to pod B; TTFT measured as vLLM's benchmark does.
4. Read both pods' logs since the request (``sinceTime``), parse the LMCache lines of those request ids with the
   one tolerant parser (colour codes stripped; LMCache logs vLLM's *engine* id, ``<sse id>-<i>[-<8 chars>]``, which
   ``lmcache_log.joins`` ties back to the SSE id and to nothing else), and judge: ``pass`` (hit ratio >= 0.99
   and speedup not below the published curve minus a tolerance), ``degraded`` (full hits but slow, or partial
   hits), ``fail`` (with a diagnosis).

The judges (``pick_pods``, ``env_mismatches``, ``verdict_of``, ``diagnose``) are pure, in ``fleet.verdict``; this
module keeps the I/O and the sequencing. B is asked only once A's log shows the ``Stored`` line of the request
(LMCache stores after prefill), with a bounded wait: no fixed sleep.

Bounded L2 footprint (sources in tests/conformance/facts/probe_l2_footprint.yaml). A fresh nonce
per probe writes ~0.1 GB of never-reused chunks each time (2,000 tokens x 57,344 B), and nothing removes them:
LMCache's fs:// connector has no eviction (``FSConnector.remove_sync`` deletes one key's file, reachable only
in-process through ``LMCacheEngine.clear(tokens)``), and a Curvine TTL is mtime-based and set per file at
create time from the FUSE client's config (``client.ttl_ms`` / ``ttl_action``) or by ``set_attr`` on one path
(not inherited by children), so kvfleet cannot expire only the probe's files. The hourly DAG therefore probes
from a bounded rotating pool (:class:`ProbePool`): ``slots`` documents per endpoint, prompt length and cold pod,
the nonce derived from the cold pod's uid (a fresh nonce for every new cold pod) and the slot of the hour. A
document is written once per cold pod; when the pool comes round again, pod A finds it already cached (its
lookup hits), so that run judges the cross-pod hit only and records ``cold: false``. Rollout gates keep a
fresh nonce per probe (new pods after a rollout, one probe each).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from kvfleet.clients.inference import pod_log_since, stream_completion
from kvfleet.clients.kube import call
from kvfleet.errors import KvfleetError, PermanentError
from kvfleet.fleet import lmcache_log
from kvfleet.fleet.economics import expected_speedup
from kvfleet.fleet.inventory import Endpoint
from kvfleet.fleet.overlay import desired_overlay
from kvfleet.fleet.verdict import PASS_HIT_RATIO as PASS_HIT_RATIO
from kvfleet.fleet.verdict import (
    PUBLISHED_SPEED_TYPES,
    baseline_speedup,
    container_env,
    diagnose,
    env_mismatches,
    pick_pods,
    verdict_of,
)
from kvfleet.fleet.verdict import SPEEDUP_TOLERANCE as SPEEDUP_TOLERANCE
from kvfleet.fleet.verify_batches import describe, nodes_by_endpoint, plan_batches
from kvfleet.stages.base import StageContext

# How long B waits for A's Stored line of the same request, and how often A's log is read meanwhile. Past the
# bound B is asked anyway: a missing store line is then the diagnosis ("no store line"), not a hang.
STORE_WAIT_S = 3.0
STORE_POLL_S = 0.05
# A pair with full hits but a slow warm TTFT is measured again with fresh prompts (a queueing blip on either pod
# must not degrade an endpoint): the speedup judged is the median over all pairs, every sample is recorded.
SPEEDUP_SAMPLES_ON_DOUBT = 3
# The hourly DAG's pool: 24 slots of one hour = a day of cold probes per cold pod, then the documents repeat.
PROBE_POOL_SLOTS = 24
PROBE_POOL_PERIOD_S = 3600
# 512, not the published 500: the shortest prompt that fills two 256-token chunks (check_prompt_length refuses
# less, so a sweep starting at 500 failed at once); the published curve is read at 512 by interpolation.
SWEEP_LENGTHS = (512, 1000, 1500, 2000, 2500, 3000)
_WORDS = ("cache", "tier", "prefill", "decode", "block", "chunk", "token", "replica", "node", "router", "prompt",
          "shared", "context", "session", "history", "vector")


@dataclass
class Verification:
    cluster: str
    endpoint: str
    lob: str
    instance_type: str
    verdict: str  # pass | degraded | fail | unverifiable
    diagnosis: str | None = None
    prompt_tokens: int | None = None
    stored_tokens: int | None = None
    hit_tokens: int | None = None
    hit_ratio: float | None = None
    l2_read_ms: float | None = None
    ttft_cold_ms: float | None = None
    ttft_warm_ms: float | None = None
    speedup: float | None = None
    expected_speedup: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_prompt(tokens: int, nonce: str) -> str:
    """``tokens`` whitespace-separated words: a run nonce first (a new prefix every run), then filler."""
    words = [f"run-{nonce}"]
    i = 0
    while len(words) < tokens:
        words.append(_WORDS[int(hashlib.sha1(f"{nonce}{i}".encode()).hexdigest(), 16) % len(_WORDS)])
        i += 1
    return " ".join(words)


@dataclass(frozen=True)
class ProbePool:
    """A bounded rotating pool of probe documents: at most ``slots`` per (endpoint, prompt length, cold pod)."""

    slots: int = PROBE_POOL_SLOTS
    period_s: float = PROBE_POOL_PERIOD_S

    def slot_at(self, at: datetime) -> int:
        return int(at.timestamp() // self.period_s) % self.slots

    def nonce(self, endpoint: str, cold_pod_uid: str, tokens: int, at: datetime) -> str:
        return probe_nonce(endpoint, cold_pod_uid, tokens, self.slot_at(at))


def probe_nonce(endpoint: str, cold_pod_uid: str, tokens: int, slot: int) -> str:
    """The pool's nonce: the same (endpoint, cold pod, length, slot) always gives the same document."""
    return hashlib.sha256(f"{endpoint}|{cold_pod_uid}|{tokens}|{slot}".encode()).hexdigest()[:12]


def check_prompt_length(tokens: int, chunk_size: int) -> None:
    if tokens < 2 * chunk_size:
        raise PermanentError(f"prompt_tokens: {tokens} is too short to verify L2: LMCache stores nothing shorter "
                             f"than one {chunk_size}-token chunk, so use at least {2 * chunk_size} tokens "
                             "(default 2,000)")


def endpoint_nodes(ctx: StageContext, endpoints: Sequence[Endpoint]) -> tuple[dict[str, frozenset[str] | None],
                                                                          str | None]:
    """The nodes of each endpoint's live pods (by ``ep.key``), from ONE list of the cluster's pods with the label
    selection :func:`verify_endpoint` picks its pods by (``app=<name>`` in the endpoint's namespace): the input of
    ``verify_batches.plan_batches`` for the hourly sweep. When the list fails, every endpoint's nodes are unknown
    (``None``: each is then verified alone, as before) and the second value says why."""
    if not endpoints:
        return {}, None
    names = sorted({ep.name for ep in endpoints})
    try:
        pods = call(ctx.kube.core.list_pod_for_all_namespaces, label_selector=f"app in ({','.join(names)})",
                    what=f"pods of {len(endpoints)} endpoint(s) (verification batches)").items
    except KvfleetError as exc:
        return {ep.key: None for ep in endpoints}, str(exc)
    docs = [ctx.kube.api_client.sanitize_for_serialization(p) for p in pods]
    return nodes_by_endpoint(docs, [(ep.key, ep.namespace, ep.name) for ep in endpoints]), None


R = TypeVar("R")
log = logging.getLogger(__name__)


def in_node_batches(ctx: StageContext, endpoints: Sequence[Endpoint], one: Callable[[Endpoint], R], *,
                    max_parallel: int) -> dict[str, R]:
    """``one(ep)`` for every endpoint of ``ctx``'s cluster, in batches of endpoints whose pods share no node
    (``verify_batches.plan_batches`` over one read of the pods, :func:`endpoint_nodes`): the endpoints of a batch
    run at the same time, at most ``max_parallel`` (a thread pool), and the batches one after another, since one
    probe's prefill on a node would disturb the TTFT another measures there. Results by ``ep.key``. An endpoint
    whose call raises does not stop the others of its batch; the first error in ``endpoints`` order is raised once
    the batch is done, and no later batch starts. A SIGTERM while a batch is submitted cancels what has not
    started. The threads share ``ctx`` (its Kubernetes client is built here, before any thread starts)."""
    cluster = ctx.cluster.name
    nodes, why = endpoint_nodes(ctx, endpoints)
    if why:
        log.warning("%s: the pods could not be read (%s): every endpoint is verified alone", cluster, why)
    by_key = {ep.key: ep for ep in endpoints}
    batches = plan_batches([ep.key for ep in endpoints], nodes)
    log.info("%s: verification plan: %s (at most %d at a time): %s", cluster, describe(batches), max_parallel,
             " | ".join(", ".join(b) for b in batches))
    out: dict[str, R] = {}
    with ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix=f"verify-{cluster}") as executor:
        for i, batch in enumerate(batches, 1):
            started = time.monotonic()
            futures: dict[str, Future[R]] = {}
            try:
                for key in batch:
                    futures[key] = executor.submit(one, by_key[key])
                wait(futures.values())
            except BaseException:  # SIGTERM (Airflow raises in this thread): start nothing more; running probes end
                executor.shutdown(wait=False, cancel_futures=True)
                raise
            log.info("%s: batch %d/%d (%d endpoint(s): %s) took %.1f s", cluster, i, len(batches), len(batch),
                     ", ".join(batch), time.monotonic() - started)
            for key, future in futures.items():  # the first failure in inventory order
                out[key] = future.result()
    return out


def verify_endpoint(ctx: StageContext, ep: Endpoint, prompt_tokens: int = 2000, nonce: str | None = None,
                    tolerance: float = SPEEDUP_TOLERANCE, *, pool: ProbePool | None = None,
                    baseline: Mapping[str, Any] | None = None) -> Verification:
    """Stage 5 on one endpoint. ``pool``: draw the prompt from a bounded pool (the hourly DAG) instead of a fresh
    nonce; ``baseline``: the endpoint's first sweep after rollout (``verdict.baseline_from_rows``), which a
    full-hit probe must not be slower than by the tolerance."""
    settings = ctx.inventory.settings
    check_prompt_length(prompt_tokens, settings.chunk_size)
    base = Verification(ctx.cluster.key, ep.key, ep.lob, ep.instance_type, "unverifiable",
                        expected_speedup=expected_speedup(prompt_tokens, ep.instance_type))
    if not ep.l2:
        base.diagnosis = "L2 disabled for this endpoint in the inventory"
        return base
    listed = call(ctx.kube.core.list_namespaced_pod, ep.namespace, label_selector=f"app={ep.name}",
                  what=f"pods of {ep.key}").items
    picked = pick_pods([ctx.kube.api_client.sanitize_for_serialization(p) for p in listed])
    if isinstance(picked, str):
        base.diagnosis = picked
        return base
    pod_a, pod_b = _Pod.of(picked[0]), _Pod.of(picked[1])
    env_a, env_b = container_env(picked[0], ep.name), container_env(picked[1], ep.name)
    mismatch = env_mismatches(env_a, env_b, desired_overlay(ep, settings).agree_env)
    base.detail = {"pod_a": pod_a.name, "node_a": pod_a.node, "pod_b": pod_b.name, "node_b": pod_b.node}
    if mismatch:
        base.verdict, base.diagnosis = "fail", "pods disagree before any request: " + "; ".join(mismatch)
        return base
    now = datetime.now(UTC)
    if nonce is None and pool is not None:
        nonce = pool.nonce(ep.key, pod_a.uid, prompt_tokens, now)
        base.detail.update(pool_slot=pool.slot_at(now), pool_slots=pool.slots)
    nonce = nonce or uuid.uuid4().hex[:12]
    since = now - timedelta(seconds=1)
    ctx.say(f"stage 5: {ep.key}: {prompt_tokens}-token probe, cold on {pod_a.name} ({pod_a.node}), then "
            f"{pod_b.name} ({pod_b.node})")
    cold, warm = _probe_pair(ctx, ep, pod_a, pod_b, build_prompt(prompt_tokens, nonce), since)
    scan_a = lmcache_log.parse(pod_log_since(ctx.kube, ep.namespace, pod_a.name, ep.name, since))
    scan_b = lmcache_log.parse(pod_log_since(ctx.kube, ep.namespace, pod_b.name, ep.name, since))
    lookup_a, lookup_b = scan_a.lookup_for(cold.request_id), scan_b.lookup_for(warm.request_id)
    total = (lookup_b.total if lookup_b else None) or warm.prompt_tokens or prompt_tokens
    hits = (lookup_b.hit or 0) if lookup_b else 0
    stored = scan_a.stored_tokens(cold.request_id)
    speedup = _speedup(cold, warm)
    expected = expected_speedup(total, ep.instance_type)
    own = baseline_speedup(baseline, total)
    ratio = hits / total if total else 0.0
    # A pooled document this cold pod has seen before: A's lookup already hits, so A was not cold
    cold_run = not (lookup_a is not None and lookup_a.total and (lookup_a.hit or 0) / lookup_a.total >= PASS_HIT_RATIO)
    pairs = [_Sample(cold, warm, ratio)]
    if cold_run and ratio >= PASS_HIT_RATIO and verdict_of(ratio, speedup, expected, tolerance, own) == "degraded":
        ctx.say(f"stage 5: {ep.key}: full hits but speedup {speedup:.2f}x < {expected * (1 - tolerance):.2f}x; "
                f"measuring {SPEEDUP_SAMPLES_ON_DOUBT - 1} more pairs before judging")
        more = [_probe_pair(ctx, ep, pod_a, pod_b, build_prompt(prompt_tokens, f"{nonce}-{i}"), since)
                for i in range(1, SPEEDUP_SAMPLES_ON_DOUBT)]
        scan_more = lmcache_log.parse(pod_log_since(ctx.kube, ep.namespace, pod_b.name, ep.name, since))
        for c, w in more:  # every re-measured pair must be a full L2 hit too, or its speed says nothing
            lk = scan_more.lookup_for(w.request_id)
            pairs.append(_Sample(c, w, (lk.hit or 0) / lk.total if lk and lk.total else 0.0))
    median = sorted(pairs, key=lambda p: p.speedup)[len(pairs) // 2]
    worst_ratio = min(p.hit_ratio for p in pairs)
    speedup = median.speedup
    verdict = (verdict_of(min(ratio, worst_ratio), speedup, expected, tolerance, own) if cold_run
               else verdict_of(min(ratio, worst_ratio), math.inf, expected, tolerance))
    garbled = scan_a.garbled + scan_b.garbled
    result = Verification(
        ctx.cluster.key, ep.key, ep.lob, ep.instance_type, verdict, prompt_tokens=total, stored_tokens=stored,
        hit_tokens=hits, hit_ratio=round(min(ratio, worst_ratio), 4), l2_read_ms=scan_b.retrieve_ms(warm.request_id),
        ttft_cold_ms=round(median.cold.ttft_s * 1000, 1), ttft_warm_ms=round(median.warm.ttft_s * 1000, 1),
        speedup=round(speedup, 3), expected_speedup=expected,
        detail={**base.detail, "request_a": cold.request_id, "request_b": warm.request_id,
                "engine_request_a": (lookup_a.req_id if lookup_a else None),
                "engine_request_b": (lookup_b.req_id if lookup_b else None), "lookup_b_found": lookup_b is not None,
                "speedup_samples": [p.as_dict() for p in pairs], "cold": cold_run,
                "baseline_speedup": own, "baseline_run": (baseline or {}).get("run_key"),
                "expected_from": ("published curve" if ep.instance_type in PUBLISHED_SPEED_TYPES
                                  else "stand-in curve (end-to-end multi-turn figures); own baseline when recorded"),
                "garbled_lines": garbled[:5], "errors_a": scan_a.errors[-3:]},
    )
    if ratio < PASS_HIT_RATIO:
        result.diagnosis = diagnose(stored, hits, total, env_a, scan_a, settings.hash_seed)
    else:
        result.diagnosis = _full_hit_diagnosis(result, worst_ratio, tolerance, baseline, len(pairs), cold_run)
    if lookup_b is None:
        result.diagnosis = (result.diagnosis or "") + (
            f" [no LMCache lookup line for request {warm.request_id} on B (engine id {warm.request_id} or "
            f"{warm.request_id}-<n>[-<8 chars>])]")
    return result


def _full_hit_diagnosis(r: Verification, worst_ratio: float, tolerance: float, baseline: Mapping[str, Any] | None,
                        pairs: int, cold_run: bool) -> str | None:
    """Why a probe whose first pair fully hit is not a plain pass (``None`` when it is)."""
    if worst_ratio < PASS_HIT_RATIO:
        return (f"full hits on the first pair, but {worst_ratio:.0%} on a re-measured pair: "
                "L2 answers intermittently (Curvine workers, the mount, or the PVC)")
    speedup, expected, own = r.speedup or 0.0, r.expected_speedup or 0.0, r.detail.get("baseline_speedup")
    if r.verdict == "degraded":
        slow = (f"below the expected {expected:.2f}x" if speedup < expected * (1 - tolerance) else
                f"below its own baseline {own}x (first sweep after rollout, {(baseline or {}).get('run_key')})")
        return f"full hits but speedup {speedup:.2f}x {slow}" + (f" (median of {pairs} pairs)" if pairs > 1 else "")
    if not cold_run:
        return "pooled probe document already cached on the cold pod: cross-pod hit checked, speed not judged"
    return None


@dataclass(frozen=True)
class _Sample:
    """One cold/warm pair of the same prompt, and the share of it B found in L2."""

    cold: Any
    warm: Any
    hit_ratio: float

    @property
    def speedup(self) -> float:
        return _speedup(self.cold, self.warm)

    def as_dict(self) -> dict[str, Any]:
        return {"speedup": round(self.speedup, 3), "hit_ratio": round(self.hit_ratio, 4),
                "ttft_cold_ms": round(self.cold.ttft_s * 1000, 1), "ttft_warm_ms": round(self.warm.ttft_s * 1000, 1),
                "request_b": self.warm.request_id}


@dataclass(frozen=True)
class _Pod:
    name: str
    node: str
    uid: str = ""

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> _Pod:
        meta = pod["metadata"]
        return cls(str(meta["name"]), str((pod.get("spec") or {}).get("nodeName")),
                   str(meta.get("uid") or meta["name"]))


def _probe_pair(ctx: StageContext, ep: Endpoint, pod_a: _Pod, pod_b: _Pod, prompt: str,
                since: datetime) -> tuple[Any, Any]:
    """The same new prompt cold on A, then on B (which can only hit it through L2) once A has stored it."""
    cold = stream_completion(ctx.kube, ep.namespace, pod_a.name, model=ep.model, prompt=prompt, clock=ctx.probe_clock)
    _wait_for_store(ctx, ep, pod_a, cold.request_id, since)
    warm = stream_completion(ctx.kube, ep.namespace, pod_b.name, model=ep.model, prompt=prompt, clock=ctx.probe_clock)
    return cold, warm


def _wait_for_store(ctx: StageContext, ep: Endpoint, pod_a: _Pod, request_id: str, since: datetime) -> bool:
    """Poll A's log until the ``Stored`` line of ``request_id`` is there (LMCache stores after prefill, so the
    stream can end before it). Stop early when A looked the request up and LMCache logged an error since the
    probe began (writes fail: no store is coming), and at the latest after ``STORE_WAIT_S``."""
    deadline = time.monotonic() + STORE_WAIT_S
    while True:
        scan = lmcache_log.parse(pod_log_since(ctx.kube, ep.namespace, pod_a.name, ep.name, since))
        if scan.stored_tokens(request_id) > 0:
            return True
        if (scan.errors and scan.lookup_for(request_id) is not None) or time.monotonic() >= deadline:
            return False
        time.sleep(STORE_POLL_S)


def _speedup(cold: Any, warm: Any) -> float:
    return float(cold.ttft_s / warm.ttft_s) if warm.ttft_s > 0 else 0.0

