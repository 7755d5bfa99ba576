"""Simulated vLLM pods with LMCache: the OpenAI API, ``/metrics`` and the LMCache log lines of every vLLM pod of
a rendered Deployment, with a tiered KV cache that breaks exactly where the real one does.

The model, with no socket or HTTP code: engines, caches, timing and logs. Its OpenAI server is
``kvfleet_sandbox.controllers.vllm.openai_http``; both are attached to each cluster twin by
``kvfleet_sandbox.runtime`` (``kvfleet_sandbox.controllers.vllm.attach(twin)``) and reached only through the
Kubernetes API emulator: the API-server pod proxy (port 8000) and ``pods/log``. kvfleet's stage 5 and the
benchmark measure these pods the way vLLM's own benchmark does, so TTFT is slept in *real* time (not scaled by the
model clock) from ``kvfleet_sandbox.ttft_model``: each phase ends at a deadline counted from the request's arrival,
the moment the twin's API server read the request line off its socket (``KubeApiServer``'s handler stamps it; the
pod proxy passes it as ``received``), so the twin's own work on a busy machine (auth, routing, planning, hashing) is
hidden inside the model time instead of added to it; the speedup stage 5 judges is then the model's, up to the
socket transport on either side. A modelling choice, not vLLM's behaviour: tests/conformance/facts/vllm_ttft_model.yaml.

Which pods: a pod whose container named like the pod's ``app`` label listens on 8000 (the Inference Operator's
container 0, named after the endpoint). Other pods are ignored. Everything a pod does depends only on its own
spec, frozen at creation: the vLLM container's env (``LMCACHE_CHUNK_SIZE``, ``LMCACHE_REMOTE_URL`` — the LAST
entry wins, as in Kubernetes —, ``LMCACHE_REMOTE_SERDE``, ``PYTHONHASHSEED``, ``LMCACHE_LOCAL_CPU``,
``LMCACHE_MAX_LOCAL_CPU_SIZE``, ``LMCACHE_SAVE_UNFULL_CHUNK``), its volumeMounts and the pod's volumes.

Token counting (deterministic): a prompt's tokens are its whitespace-separated words (``str.split()``); a list of
integers is taken as token ids. Chat messages are rendered with Qwen2's template before counting:
``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then ``<|im_start|>assistant\\n`` — so each message
costs 1 + its words tokens (the role marker glues to the role name) and the generation prompt 1 more. A prompt
whose tokens plus ``max_tokens`` exceed the context (32,768) is refused with vLLM's 400. Output is ``max_tokens``
tokens (default 16, at most 256 so the sandbox stays responsive), streamed one token per SSE chunk.

Cache tiers, per request of n tokens with chunk keys k1..km (``_lmcache.chunk_keys``: a hash chain rooted in
PYTHONHASHSEED; unset or "random" → each pod draws its own root at start, so cross-pod hits are 0):
- L0, vLLM's prefix cache on the GPU (per pod, LRU bounded by the profile's ``gpu_kv_gb``), tracked at chunk
  granularity: vLLM's computed tokens = its contiguous full-chunk prefix, at most n - 1, block (16) aligned.
- LMCache lookup: the contiguous prefix of chunks found in L1 (the pod's CPU cache, LRU bounded by
  ``LMCACHE_MAX_LOCAL_CPU_SIZE`` GiB) or else in L2. ``need to load = hits - computed`` (minus 1 on a full-prompt
  hit). Chunks read from L2 are written back to L1.
- L2 (``_lmcache.resolve_l2``): ``fs://host:port/<path>`` with <path> under a volumeMount of the vLLM container
  whose PVC is bound to a PV of the ``curvine`` CSI driver → ``twin.l2`` at
  ``<fs-path>/pvc-<uid>/<rest of the path below the mount>/<key file>`` (0.3.9:
  ``vllm@-opt-ml-model@1@0@<hex>@bfloat16.data``); the operator's ``sagemaker-hyperpod://`` URL →
  ``twin.node_l2(node)`` at ``/lmcache/<key file>`` (node-local: no cross-node hits); an fs:// path on no Curvine
  mount → the pod's own filesystem (lost with the pod); ``LMCACHE_REMOTE_SERDE=cachegen`` with fs:// → every
  write fails with an ``LMCache ERROR: Failed to write file ...`` line and the store is abandoned (no "Stored"
  line, nothing cached), the zip bug of the blog.
- Store after prefill: the chunks past the LMCache hit prefix, under ``_lmcache.storable``'s rule (nothing below
  one chunk; the partial tail chunk only with save_unfull_chunk: True in 0.3.9, False in 0.5.6).

Log lines (container log of the vLLM container, real UTC timestamps so ``sinceTime`` works, a bounded ring per
pod), written like the real thing (tests/conformance/facts/lmcache_vllm_logs.yaml): vLLM's ``(EngineCore_DP0
pid=<n>) `` prefix, LMCache's coloured ``[2026-11-29 10:00:00,123] LMCache INFO:`` prefix and ``(<file>:<line>:
<logger>)`` suffix, and the message: ``Reqid: <id>, Total tokens N, LMCache hit tokens: H, need to load: L`` at
arrival, the ``Retrieved ...`` line after a load, the ``Stored ...`` line after prefill. The format is the pod
image tag's (``lmcache/vllm-openai:v0.3.9`` -> 0.3.9, v0.5 and later -> 0.5.6; ``settings.lmcache_version`` for a
tag without a version). The id logged is vLLM's *engine* request id, never the ``id`` returned to the client:
``cmpl-<hex>-0-<8 hex>`` for a completion (prompt index 0, then ``assign_request_id``'s 8 random characters),
``chatcmpl-<hex>-<8 hex>`` for a chat completion; stage 5 must join them.

Probe hooks: ``twin.services["vllm"]`` is the ``VllmSimulation`` (``pod_cache_stats``, ``l2_target``,
``set_profile``).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import hashlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvfleet_sandbox import ttft_model
from kvfleet_sandbox.controllers import _lmcache as lm
from kvfleet_sandbox.twin import ClusterTwin, L2Namespace

VLLM_PORT = 8000
CONTEXT_TOKENS = 32768
DEFAULT_MAX_TOKENS = 16
MAX_OUTPUT_TOKENS = 256
VLLM_BLOCK_SIZE = 16
LOG_LINES_PER_POD = 5000
DEFAULT_MODEL_PATH = "/opt/ml/model"  # what LMCache puts in its keys: the served path, not the display name
# vLLM's ``vllm:request_prompt_tokens`` buckets: build_1_2_5_buckets(max_model_len) in vllm/v1/metrics/loggers.py
# (0.11.x), i.e. 1, 2, 5, 10, 20, 50, ... up to the model's context length (the sandbox serves 32,768 tokens).
PROMPT_BUCKETS = tuple(m * 10 ** e for e in range(5) for m in (1, 2, 5) if m * 10 ** e <= 32768)
# The twin's traffic mixes (the L2 advisor's input), by a word in the endpoint's name: (prompt tokens, requests
# per wall-clock hour for the whole endpoint, LMCache hit share). The counters a pod shows grow with its age (from
# the pod's startTime, in real seconds), split evenly over the Deployment's replicas: deterministic, with no
# background load. A RAG endpoint with long retrieved context, a chat endpoint with short turns, a batch-eval
# endpoint in between; other endpoints carry only their real requests. ``VllmSimulation.set_traffic_mix``
# replaces them per endpoint.
DEFAULT_TRAFFIC: dict[str, tuple[tuple[int, int, float], ...]] = {
    "rag": ((1800, 1200, 0.8), (2600, 2000, 0.8), (3200, 400, 0.8)),
    "chat": ((180, 2000, 0.6), (420, 1400, 0.6), (700, 200, 0.6)),
    "batch-eval": ((900, 600, 0.3), (1400, 600, 0.3), (2200, 600, 0.3)),
}
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


# --- which pods, and what they are ---------------------------------------------------------------------------

def vllm_container(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The operator's vLLM container: named like the pod's ``app`` label and listening on 8000; else None."""
    app = ((pod.get("metadata") or {}).get("labels") or {}).get("app")
    if not app:
        return None
    for container in (pod.get("spec") or {}).get("containers") or []:
        ports = {int(p.get("containerPort", 0)) for p in container.get("ports") or []}
        if container.get("name") == app and VLLM_PORT in ports:
            return dict(container)
    return None


def pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return status.get("phase") == "Running" and ready


def _arg(container: dict[str, Any], flag: str) -> str | None:
    args = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _dtype(container: dict[str, Any], env: dict[str, str]) -> str:
    """LMCache's dtype string; vLLM's ``auto`` takes Qwen2's bfloat16."""
    value = (_arg(container, "--dtype") or env.get("DTYPE") or "auto").lower()
    return {"float16": "half", "half": "half", "float32": "float", "float": "float"}.get(value, "bfloat16")


def count_tokens(text: str) -> list[str]:
    return text.split()


def render_chat(messages: list[dict[str, Any]]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|im_start|>{m.get('role', 'user')}\n{content or ''}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


# --- per-pod state ---------------------------------------------------------------------------------------------

class _Lru:
    """Chunk keys with their size, evicted least-recently-used past ``capacity`` (same unit as the sizes)."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self._items: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.used = 0.0
        self.evictions = 0

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def touch(self, key: str) -> None:
        if key in self._items:
            self._items.move_to_end(key)

    def put(self, key: str, size: float) -> None:
        if size > self.capacity:
            return
        if key in self._items:
            self._items.move_to_end(key)
            return
        self._items[key] = size
        self.used += size
        while self.used > self.capacity and self._items:
            _, dropped = self._items.popitem(last=False)
            self.used -= dropped
            self.evictions += 1


@dataclass
class Metrics:
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    lm_requested: int = 0
    lm_hit: int = 0
    lm_stored: int = 0
    lm_retrieved: int = 0
    ttft_buckets: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS))
    ttft_sum: float = 0.0
    ttft_count: int = 0
    prompt_buckets: list[float] = field(default_factory=lambda: [0.0] * len(PROMPT_BUCKETS))
    prompt_sum: float = 0.0
    prompt_count: float = 0

    def observe_prompt(self, tokens: int, n: float = 1) -> None:
        self.prompt_sum += tokens * n
        self.prompt_count += n
        for i, bound in enumerate(PROMPT_BUCKETS):
            if tokens <= bound:
                self.prompt_buckets[i] += n

    def observe_ttft(self, seconds: float) -> None:
        self.ttft_sum += seconds
        self.ttft_count += 1
        for i, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                self.ttft_buckets[i] += 1


class PodEngine:
    """One vLLM process: created when the pod is first seen Running, gone with the pod (keyed by uid)."""

    def __init__(self, twin: ClusterTwin, pod: dict[str, Any], container: dict[str, Any],
                 profile: ttft_model.TtftProfile) -> None:
        meta = pod["metadata"]
        self.uid = meta.get("uid", "")
        self.namespace = meta.get("namespace", "default")
        self.name = meta["name"]
        self.container = container["name"]
        self.node = (pod.get("spec") or {}).get("nodeName", "")
        env = lm.container_env(pod, container)
        self.image = str(container.get("image") or "")
        self.version = lm.version_for_image(self.image, twin.settings.lmcache_version)
        # vLLM's engine-core process id, as its log prefix shows it (stable per pod, not drawn from twin.rng)
        self.pid = 100 + int(hashlib.sha1(f"{self.namespace}/{self.name}/{self.uid}".encode()).hexdigest(), 16) % 9000
        self.config = lm.LmcacheConfig.from_env(env, self.version)
        self.model_path = _arg(container, "--model") or env.get("MODEL_PATH") or DEFAULT_MODEL_PATH
        self.served_name = (_arg(container, "--served-model-name") or env.get("SERVED_MODEL_NAME")
                            or self.container)
        self.dtype = _dtype(container, env)
        self.profile = profile
        self.root = lm.hash_root(self.config.hash_seed, twin.rng.getrandbits(256))
        self.l0 = _Lru(profile.gpu_kv_tokens())
        l1_bytes = self.config.max_local_cpu_gb * 1024**3 if self.config.local_cpu else 0.0
        self.l1 = _Lru(l1_bytes)
        self.private_l2 = L2Namespace()  # the container's own filesystem, for an fs:// path off Curvine
        self.lock = threading.Lock()
        self.log: collections.deque[tuple[dt.datetime, str]] = collections.deque(maxlen=LOG_LINES_PER_POD)
        self.metrics = Metrics()
        self.started = time.time()
        self.app = ((meta.get("labels") or {}).get("app") or "")
        self._startup_lines()

    def write(self, level: str, message: str, where: str = "engine") -> None:
        """Append one line as LMCache's logger would print it, logged from ``where`` (a key of lm.LOCATIONS)."""
        now = dt.datetime.now(dt.UTC)
        self.log.append((now, lm.stamp(now, level, message, lm.LOCATIONS[self.version][where], self.pid)))

    def _startup_lines(self) -> None:
        cfg = self.config
        self.write("INFO", f"Creating LMCacheEngine with config: chunk_size={cfg.chunk_size}, local_cpu="
                           f"{cfg.local_cpu}, max_local_cpu_size={cfg.max_local_cpu_gb}, remote_url="
                           f"{cfg.remote_url}, remote_serde={cfg.remote_serde}, save_unfull_chunk="
                           f"{cfg.save_unfull_chunk}")
        if cfg.hash_seed is None:
            self.write("WARNING", "Using builtin hash without PYTHONHASHSEED set. For production environments you "
                                  "MUST set PYTHONHASHSEED to ensure consistent hashing across processes. "
                                  "Example: export PYTHONHASHSEED=0")
            if cfg.remote_url:
                self.write("WARNING", "Centralized cache sharing detected but PYTHONHASHSEED not set. For "
                                      "consistent caching, set: export PYTHONHASHSEED=0 before the engine starts.")


# --- one request -------------------------------------------------------------------------------------------------

@dataclass
class RequestPlan:
    """What the engine decided at arrival; the timed part runs in ``VllmSimulation.until_first_token``."""

    req_id: str
    total: int
    chunks: list[lm.Chunk]
    computed: int
    hits: int
    l1_tokens: int = 0
    l2_tokens: int = 0
    retrieved: int = 0
    required: int = 0
    to_store: list[lm.Chunk] = field(default_factory=list)
    cost: ttft_model.RequestCost | None = None
    retrieve_ms: float = 0.0
    retrieve_log: float = 0.0  # the retrieve cost LMCache logs (reads only, no fixed overhead)
    arrived: float = 0.0  # time.monotonic() when the API server read the request: the model's phases count from it
    arrived_model: float = 0.0  # ModelClock reading at arrival (the twin's clock: VllmSimulation.model_clock)


class ModelClock:
    """The twin's clock of served model time, for a test that must judge a speedup by the model and not by the
    machine's load: a reading (seconds) that moves only when a simulated vLLM pod sends a request's first token,
    to the request's arrival reading plus its model ``ttft_ms``, never backwards (the rest of the stream does not
    move it: a client stalled past the last token still reads the first token's time). A client that reads it
    just before a request and again on the first token measures the model's TTFT exactly, whatever the machine did
    meanwhile, as long as no other request of the same cluster twin reaches its first token in between (requests
    one after another, as stage 5 sends a probe pair).
    kvfleet's stage 5 reads it when a test hands it in (``StageContext.probe_clock``); by default it measures
    wall time. A modelling choice: tests/conformance/facts/vllm_ttft_model.yaml (modelled.model_clock)."""

    def __init__(self) -> None:
        self._now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance_to(self, reading: float) -> None:
        with self._lock:
            self._now = max(self._now, reading)


class VllmSimulation:
    """All simulated vLLM pods of one cluster twin."""

    def __init__(self, twin: ClusterTwin) -> None:
        self.twin = twin
        self._engines: dict[str, PodEngine] = {}
        self._lock = threading.RLock()
        self._profiles: dict[str, ttft_model.TtftProfile] = {}
        self._stopped = False
        self.model_clock = ModelClock()
        self.l2_read_penalty_ms = 0.0  # added to every request that reads L2: a congested NVMe pool or network
        self.l2_reads_dropped: set[tuple[str, str]] = set()  # (namespace, endpoint) whose L2 lookups find nothing
        self._traffic: dict[str, tuple[tuple[int, int, float], ...]] = {}  # endpoint (app label) -> mix
        twin.store.register_log_source(self._pod_log)
        twin.store.subscribe(self._on_event)
        twin.services["vllm"] = self

    def stop(self) -> None:
        self._stopped = True

    @property
    def stopped(self) -> bool:
        return self._stopped

    # --- what the OpenAI server (``openai_http``) asks of the engines ------------------------------------------

    def engine_of(self, pod: dict[str, Any]) -> PodEngine | None:
        """The engine of a Running vLLM pod (started on first sight), else None."""
        return self._engine(pod)

    def admit(self, engine: PodEngine, engine_id: str, tokens: list[str], output_tokens: int,
              arrived: float) -> RequestPlan:
        """A request arrives at ``arrived`` (``time.monotonic()``): cache lookup and retrieve now; its phases then
        run on the model's schedule from that moment (``until_first_token``)."""
        with engine.lock:
            plan = self._plan(engine, engine_id, tokens, output_tokens)
        plan.arrived = arrived
        plan.arrived_model = self.model_clock()
        return plan

    def decoded(self, engine: PodEngine, tokens: int) -> None:
        with engine.lock:
            engine.metrics.generation_tokens += tokens

    def scrape(self, engine: PodEngine) -> tuple[Metrics, float]:
        """A copy of the engine's counters plus its endpoint's traffic mix, and LMCache's local cache use."""
        extra = self._synthetic(engine)
        with engine.lock:
            m = _combined(engine.metrics, extra)
            return (dataclasses.replace(m, ttft_buckets=list(m.ttft_buckets), prompt_buckets=list(m.prompt_buckets)),
                    engine.l1.used)

    # --- probes -------------------------------------------------------------------------------------------

    def set_profile(self, profile: ttft_model.TtftProfile) -> None:
        """Override the TTFT profile of an instance type (takes effect for pods started afterwards)."""
        self._profiles[profile.instance_type] = profile

    def traffic_mix(self, app: str) -> tuple[tuple[int, int, float], ...]:
        if app in self._traffic:
            return self._traffic[app]
        return next((mix for word, mix in DEFAULT_TRAFFIC.items() if word in app), ())

    def set_traffic_mix(self, app: str, mix: list[tuple[int, int, float]]) -> dict[str, Any]:
        """The endpoint's traffic: ``(prompt tokens, requests per hour, hit share)`` rows, shown in the metrics
        of every pod of the endpoint (app label ``app``) from their start."""
        rows = tuple((int(t), int(n), float(h)) for t, n, h in mix)
        if any(t < 1 or n < 0 or not 0 <= h <= 1 for t, n, h in rows):
            raise ValueError("traffic rows are (tokens >= 1, requests per hour >= 0, hit share 0..1)")
        self._traffic[app] = rows
        return {"endpoint": app, "rows": len(rows)}

    def _synthetic(self, engine: PodEngine) -> Metrics:
        """What the endpoint's traffic mix adds to this pod's counters at this moment."""
        extra = Metrics()
        mix = self.traffic_mix(engine.app)
        if not mix:
            return extra
        pod = self.twin.store.get("", "pods", engine.name, engine.namespace) or {}
        started = _parse_ts((pod.get("status") or {}).get("startTime"))
        # The mix is requests per *wall* hour (a modelling choice: tests/conformance/facts/vllm_traffic_mix.yaml):
        # kvfleet reads rates on the wall clock, as a real operator tool does. The pod's startTime is model time
        # (the workloads controller stamps twin.clock), so its model age becomes real seconds through clock.real.
        now = self.twin.clock.now()
        hours = max(0.0, self.twin.clock.real(now - (started or now)) / 3600)
        dep = self.twin.store.get("apps", "deployments", engine.app, engine.namespace) if engine.app else None
        replicas = max(1, int(((dep or {}).get("spec") or {}).get("replicas") or 1))
        for tokens, per_hour, hit in mix:
            n = per_hour * hours / replicas
            extra.observe_prompt(tokens, n)
            extra.requests += n  # type: ignore[assignment]
            extra.prompt_tokens += tokens * n  # type: ignore[assignment]
            extra.lm_requested += tokens * n  # type: ignore[assignment]
            extra.lm_hit += tokens * n * hit  # type: ignore[assignment]
        return extra

    def drop_l2_reads(self, namespace: str, endpoint: str, drop: bool = True) -> dict[str, Any]:
        """Fault: every pod of ``namespace/endpoint`` finds nothing in L2 (a lookup misses as if the files were
        not there: a broken or wrong mount on that endpoint only); its own writes still go through. ``drop``
        False clears it."""
        key = (str(namespace), str(endpoint))
        if drop:
            self.l2_reads_dropped.add(key)
        else:
            self.l2_reads_dropped.discard(key)
        return {"l2_reads_dropped": sorted("/".join(k) for k in self.l2_reads_dropped)}

    def set_l2_read_penalty(self, ms: float) -> dict[str, float]:
        """Make every L2 read ``ms`` slower (hits stay hits; only the warm TTFT suffers). 0 clears it."""
        value = float(ms)
        if not 0 <= value <= 60_000:
            raise ValueError(f"L2 read penalty must be between 0 and 60000 ms, not {ms!r}")
        self.l2_read_penalty_ms = value
        return {"l2_read_penalty_ms": value}

    def pod_cache_stats(self, namespace: str, pod: str) -> dict[str, Any] | None:
        engine = self._engine_for(namespace, pod)
        if engine is None:
            return None
        with engine.lock:
            m = engine.metrics
            return {"node": engine.node, "version": engine.version, "chunk_size": engine.config.chunk_size,
                    "hash_seed": engine.config.hash_seed, "l0_tokens": engine.l0.used, "l0_chunks": len(engine.l0),
                    "l1_chunks": len(engine.l1), "l1_bytes": engine.l1.used, "l1_evictions": engine.l1.evictions,
                    "private_l2_files": engine.private_l2.file_count(), "requests": m.requests,
                    "hit_tokens": m.lm_hit, "stored_tokens": m.lm_stored, "l2": self.l2_target(namespace, pod),
                    "profile": engine.profile.instance_type}

    def l2_target(self, namespace: str, pod: str) -> dict[str, Any] | None:
        obj = self.twin.store.get("", "pods", pod, namespace)
        container = vllm_container(obj) if obj else None
        engine = self._engine_for(namespace, pod)
        if obj is None or container is None or engine is None:
            return None
        target = lm.resolve_l2(self.twin.store, obj, container, engine.config)
        return {"kind": target.kind, "directory": target.directory, "reason": target.reason,
                "fails_writes": target.fails_writes}

    # --- engines ------------------------------------------------------------------------------------------

    def _profile_of(self, pod: dict[str, Any]) -> ttft_model.TtftProfile:
        node = self.twin.store.get("", "nodes", (pod.get("spec") or {}).get("nodeName", "") or "-")
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        instance = next((labels[k] for k in INSTANCE_TYPE_LABELS if labels.get(k)), self.twin.gpu_instance_type)
        return ttft_model.profile_for(instance, self._profiles)

    def _engine(self, pod: dict[str, Any]) -> PodEngine | None:
        container = vllm_container(pod)
        if container is None or (pod.get("status") or {}).get("phase") != "Running":
            return None
        uid = pod["metadata"].get("uid") or f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
        with self._lock:
            engine = self._engines.get(uid)
            if engine is None:
                engine = PodEngine(self.twin, pod, container, self._profile_of(pod))
                self._engines[uid] = engine
            return engine

    def _engine_for(self, namespace: str, name: str) -> PodEngine | None:
        pod = self.twin.store.get("", "pods", name, namespace)
        return self._engine(pod) if pod else None

    def _on_event(self, kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
        if group != "" or resource != "pods" or self._stopped:
            return
        if kind == "DELETED":
            with self._lock:
                self._engines.pop(obj["metadata"].get("uid", ""), None)
        elif vllm_container(obj) is not None:
            self._engine(obj)  # a process starts (and draws its hash root) when the pod runs

    # --- the cache ------------------------------------------------------------------------------------------

    def _l2_store(self, engine: PodEngine, target: lm.L2Target) -> L2Namespace | None:
        if target.kind == "curvine":
            return self.twin.l2
        if target.kind == "node-local":
            return self.twin.node_l2(engine.node)
        if target.kind == "pod-private":
            return engine.private_l2
        return None

    def _plan(self, engine: PodEngine, req_id: str, tokens: list[str], output_tokens: int) -> RequestPlan:
        """Lookup at arrival (under the engine lock): L0, then LMCache's L1/L2 contiguous prefix; retrieve."""
        cfg, n = engine.config, len(tokens)
        chunks = lm.chunk_keys(tokens, engine.root, chunk_size=cfg.chunk_size, model_name=engine.model_path,
                               dtype=engine.dtype, version=engine.version)
        computed = min(_l0_prefix(engine, chunks), n - 1) // VLLM_BLOCK_SIZE * VLLM_BLOCK_SIZE
        pod = self.twin.store.get("", "pods", engine.name, engine.namespace) or {}
        container = vllm_container(pod) or {"name": engine.container}
        target = lm.resolve_l2(self.twin.store, pod, container, cfg) if pod else lm.L2Target("none")
        l2 = self._l2_store(engine, target)
        app = ((pod.get("metadata") or {}).get("labels") or {}).get("app", "")
        readable = l2 if l2 is not None and (engine.namespace, app) not in self.l2_reads_dropped else None
        tiers = _tiers(engine, chunks, readable, target)
        hits = chunks[len(tiers) - 1].end if tiers else 0
        plan = RequestPlan(req_id, n, chunks, computed, hits)
        need = hits - computed - (1 if hits == n else 0)
        engine.write("INFO", lm.lookup_line(engine.version, req_id, n, computed, hits, need), "lookup")
        if need > 0:
            self._retrieve(engine, plan, tiers, l2, target)
        if l2 is not None or cfg.local_cpu:  # with neither, LMCache has no storage backend
            plan.to_store = [c for c in lm.storable(chunks, n, cfg) if c.start >= plan.hits]
        writes_fail = l2 is not None and target.fails_writes is not None
        stored = 0 if writes_fail else sum(c.tokens for c in plan.to_store)
        plan.cost = ttft_model.request_cost(engine.profile, n, computed=computed, l1_tokens=plan.l1_tokens,
                                            l2_tokens=plan.l2_tokens, stored_tokens=stored,
                                            output_tokens=output_tokens, rng=self._request_rng(engine, tokens),
                                            noise=self.twin.settings.ttft_noise)
        if plan.l2_tokens and self.l2_read_penalty_ms:
            plan.cost = _with_l2_penalty(plan.cost, self.l2_read_penalty_ms)
        self._account(engine, plan)
        for c in chunks:  # vLLM keeps the prompt's full blocks in its prefix cache
            if c.tokens == cfg.chunk_size:
                engine.l0.put(c.key, c.tokens)
        return plan

    def _request_rng(self, engine: PodEngine, tokens: list[str]) -> random.Random:
        """The request's own noise stream, seeded by the sandbox seed, the pod, the prompt and how many requests
        the pod served before: a request's model time is the same in every run, whichever thread drew from the
        twin's shared generator first (called under the engine lock)."""
        key = hashlib.sha256(" ".join(tokens).encode()).hexdigest()
        seed = f"{self.twin.settings.seed}|{engine.namespace}/{engine.name}|{key}|{engine.metrics.requests}"
        return random.Random(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big"))

    def _retrieve(self, engine: PodEngine, plan: RequestPlan, tiers: list[str], l2: L2Namespace | None,
                  target: lm.L2Target) -> None:
        cfg = engine.config
        skip = plan.computed // cfg.chunk_size * cfg.chunk_size  # LMCache masks vLLM's computed chunks
        plan.required = plan.hits - skip
        for c, tier in zip(plan.chunks, tiers, strict=False):
            if c.start < skip:
                continue
            if tier == "l2":
                try:
                    entry = l2.read(target.path_of(c)) if l2 is not None else None
                except OSError as exc:
                    engine.write("ERROR", f"Failed to read from file {target.path_of(c)}: {exc}", "fs_error")
                    entry = None
                if entry is None:
                    break
                plan.l2_tokens += c.tokens
                engine.l1.put(c.key, c.tokens * engine.profile.kv_bytes_per_token)
            else:
                engine.l1.touch(c.key)
                plan.l1_tokens += c.tokens
            plan.retrieved += c.tokens
        # A partial retrieve leaves the rest to prefill; what was not loaded does not count as a hit.
        plan.hits = skip + plan.retrieved if plan.retrieved < plan.required else plan.hits

    def _store(self, engine: PodEngine, plan: RequestPlan) -> None:
        """Write the new chunks (at the end of prefill): L1, then L2; log Stored or the write errors."""
        if plan.to_store:
            with engine.lock:
                self._store_locked(engine, plan)

    def _store_locked(self, engine: PodEngine, plan: RequestPlan) -> None:
        pod = self.twin.store.get("", "pods", engine.name, engine.namespace) or {}
        container = vllm_container(pod) or {"name": engine.container}
        target = lm.resolve_l2(self.twin.store, pod, container, engine.config) if pod else lm.L2Target("none")
        l2 = self._l2_store(engine, target)
        bpt = engine.profile.kv_bytes_per_token
        if l2 is not None and target.fails_writes:
            for c in plan.to_store:
                engine.write("ERROR", f"Failed to write file {target.path_of(c)}: {target.fails_writes}",
                             "fs_error")
            return
        stored = 0
        for c in plan.to_store:
            if engine.config.local_cpu:
                engine.l1.put(c.key, c.tokens * bpt)
            if l2 is not None:
                try:
                    l2.write(target.path_of(c), int(c.tokens * bpt), {"key": c.key, "pod": engine.name,
                                                                      "node": engine.node, "tokens": c.tokens})
                except OSError as exc:
                    engine.write("ERROR", f"Failed to write file {target.path_of(c)}: {exc}", "fs_error")
            stored += c.tokens
        cost = plan.cost
        assert cost is not None
        ms = cost.store_ms * cost.noise_factor
        share = engine.profile.offload_share
        engine.write("INFO", lm.store_line(engine.version, plan.req_id, stored, plan.total,
                                           engine.profile.kv_gb(stored), ms, ms * share, ms * (1 - share)), "store")
        engine.metrics.lm_stored += stored

    def _account(self, engine: PodEngine, plan: RequestPlan) -> None:
        m = engine.metrics
        m.requests += 1
        m.prompt_tokens += plan.total
        m.observe_prompt(plan.total)
        m.prefix_queries += plan.total
        m.prefix_hits += plan.computed
        m.external_queries += plan.total - plan.computed
        m.external_hits += max(0, plan.hits - plan.computed)
        m.lm_requested += plan.total
        m.lm_hit += plan.hits
        m.lm_retrieved += plan.retrieved

    def until_first_token(self, engine: PodEngine, plan: RequestPlan) -> None:
        """Run the request's phases on the model's schedule, counted from the request's arrival: each phase ends
        at ``plan.arrived`` + the model time up to it, whatever the twin's own work (planning, hashing, the L2
        writes) took in between, so a busy machine delays the first token only past the model time, never
        within it. LMCache's lines are logged when their phase ends; returns at the first token. The store runs
        even if the client goes away."""
        cost = plan.cost
        assert cost is not None
        f = cost.noise_factor
        load_ms = (cost.overhead_ms + cost.l1_read_ms + cost.l2_overhead_ms + cost.l2_read_ms) * f
        try:
            sleep_until(plan.arrived + load_ms / 1000)
            if plan.retrieved:
                read_ms = (cost.l1_read_ms + cost.l2_read_ms) * f
                engine.write("INFO", lm.retrieve_line(engine.version, plan.req_id, plan.retrieved, plan.required,
                                                      plan.total, engine.profile.kv_gb(plan.retrieved), read_ms),
                             "retrieve")
            sleep_until(plan.arrived + (load_ms + cost.prefill_ms * f) / 1000)
        finally:
            self._store(engine, plan)
        sleep_until(plan.arrived + cost.ttft_ms / 1000)
        with engine.lock:
            engine.metrics.observe_ttft(cost.ttft_ms / 1000)
        self.model_clock.advance_to(plan.arrived_model + cost.ttft_ms / 1000)

    def _pod_log(self, namespace: str, pod: str, container: str | None, since_time: dt.datetime | None,
                 since_seconds: int | None, tail_lines: int | None) -> str | None:
        obj = self.twin.store.get("", "pods", pod, namespace)
        vc = vllm_container(obj) if obj else None
        if obj is None or vc is None or (container not in (None, vc["name"])):
            return None
        engine = self._engine(obj)
        if engine is None:
            return ""
        with engine.lock:
            lines = list(engine.log)
        if since_time is not None:
            cutoff = since_time if since_time.tzinfo else since_time.replace(tzinfo=dt.UTC)
            lines = [(t, s) for t, s in lines if t >= cutoff]
        if since_seconds is not None:
            cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=since_seconds)
            lines = [(t, s) for t, s in lines if t >= cutoff]
        if tail_lines is not None:
            lines = lines[-tail_lines:] if tail_lines > 0 else []
        return "".join(s + "\n" for _, s in lines)


def _l0_prefix(engine: PodEngine, chunks: list[lm.Chunk]) -> int:
    """Tokens of the prompt's contiguous full-chunk prefix in vLLM's prefix cache (touched as used)."""
    l0_tokens = 0
    for c in chunks:
        if c.tokens != engine.config.chunk_size or c.key not in engine.l0:
            break
        engine.l0.touch(c.key)
        l0_tokens = c.end
    return l0_tokens


def _tiers(engine: PodEngine, chunks: list[lm.Chunk], l2: L2Namespace | None, target: lm.L2Target) -> list[str]:
    """Where LMCache finds each chunk of the contiguous hit prefix: ``l1`` (the pod's CPU cache) or ``l2``."""
    tiers: list[str] = []
    for c in chunks:
        if c.key in engine.l1:
            tiers.append("l1")
        elif l2 is not None and l2.available and l2.exists(target.path_of(c)):
            tiers.append("l2")
        else:
            break
    return tiers


def _with_l2_penalty(cost: ttft_model.RequestCost, extra_ms: float) -> ttft_model.RequestCost:
    """The fault ``set_l2_read_penalty``: every L2 read ``extra_ms`` slower (scaled by the request's noise)."""
    return dataclasses.replace(cost, l2_overhead_ms=cost.l2_overhead_ms + extra_ms,
                               ttft_ms=cost.ttft_ms + extra_ms * cost.noise_factor,
                               e2e_ms=cost.e2e_ms + extra_ms * cost.noise_factor)


def sleep_until(deadline: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``deadline`` (not at all if it already has)."""
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)


def _parse_ts(raw: Any) -> float | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _combined(m: Metrics, extra: Metrics) -> Metrics:
    """A pod's own counters plus what its endpoint's traffic mix adds (never stored: computed per scrape)."""
    if not extra.prompt_count:
        return m
    return dataclasses.replace(
        m, requests=m.requests + extra.requests, prompt_tokens=m.prompt_tokens + extra.prompt_tokens,
        lm_requested=m.lm_requested + extra.lm_requested, lm_hit=m.lm_hit + extra.lm_hit,
        prompt_buckets=[a + b for a, b in zip(m.prompt_buckets, extra.prompt_buckets, strict=True)],
        prompt_sum=m.prompt_sum + extra.prompt_sum, prompt_count=m.prompt_count + extra.prompt_count)
