"""Reproduce the published TTFT table and 4-turn conversation (docs/reference/vllm.md#published-figures) against
the sandbox's vLLM pods.

Run by ``make bench`` (through ``bench/run.py``) or directly: ``python bench/ttft_table.py``. Importable:
``main(argv) -> int`` (0 when every published point is within ±10 %, else 1).

What it does, like the blog and like vLLM's own benchmark:
- starts the sandbox of ``fleet.example.yaml`` with only the vLLM simulation attached (ml-stage-usw2 runs
  ml.g5.4xlarge nodes, ml-prod-use1 ml.g6e.4xlarge), and in each cluster a Curvine PV/PVC plus two vLLM pods on
  two different nodes carrying the blog's env (``fs://localhost:0/mnt/curvine/l2cache/``, serde ``naive``,
  ``PYTHONHASHSEED=0``, the Curvine PVC mounted at /mnt/curvine). The pods are created directly: this benchmark
  measures the data plane, not the rollout;
- for 500 … 3,000 tokens sends a fresh prompt cold to pod A, then the same to pod B, through the official
  Kubernetes client's pod proxy with streaming; TTFT = time to the first SSE chunk with ``choices``; pod B's
  LMCache lookup line (read with ``sinceTime``) gives the hit ratio;
- reads the L2 write (pod A's ``Stored``) and read (pod B's ``Retrieved``) of a 1,925-token prompt;
- runs the 4-turn conversation (530 → 2,114 tokens, 32 output tokens per turn) on ml.g6e.4xlarge: turn time is
  the end-to-end request time (to ``[DONE]``), because the published totals include decode. Cold: every turn sent
  to pod A as a conversation it has never seen. Warm: pod A plays the conversation once (writing every turn to
  L2), then pod B replays it and every turn is a 100 % LMCache hit (see ``kvfleet_sandbox.ttft_model``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NS = "default"
APP = "qwen2-7b-instruct-kvcache"
TOLERANCE = 0.10
LENGTHS = (500, 1000, 1500, 2000, 2500, 3000)
PUBLISHED_SPEEDUP = {500: 0.99, 1000: 1.7, 2500: 2.7}
PUBLISHED_2500 = {"cold_ms": 774.0, "warm_ms": 287.0}
PUBLISHED_L2 = {"tokens": 1925, "gb": 0.1028, "write_ms": 10.71, "write_gbps": 9.60, "read_ms": 55.75,
                "read_gbps": 1.84}
CONVERSATION = (530, 1058, 1586, 2114)
CONVERSATION_OUTPUT = 32
PUBLISHED_CONVERSATION = {"first": 1.22, "last": 1.34, "total": 1.30, "cold_s": 4.21, "warm_s": 3.25}
G5_CLUSTER, G6E_CLUSTER = "ml-stage-usw2", "ml-prod-use1"
HIT = re.compile(r"Reqid: (?P<req>[^,]+), Total tokens (?P<total>\d+),(?: Inference Engine computed tokens: "
                 r"\d+,)? LMCache hit tokens: (?P<hit>\d+)")
STORED = re.compile(r"Stored (?P<n>\d+) out of total \d+ tokens\. size: (?P<gb>[\d.]+) (?:gb|GB), "
                    r"cost (?P<ms>[\d.]+) ms, throughput: (?P<tp>[\d.]+) GB/s")
RETRIEVED = re.compile(r"Retrieved (?P<n>\d+) out of \d+ required tokens \(from \d+ total tokens\)\. "
                       r"size: (?P<gb>[\d.]+) gb, cost (?P<ms>[\d.]+) ms, throughput: (?P<tp>[\d.]+) GB/s")


# --- the cluster side ----------------------------------------------------------------------------------------

def _blog_pod(name: str, node: str) -> dict[str, Any]:
    env = [{"name": "LMCACHE_REMOTE_URL", "value": "fs://localhost:0/mnt/curvine/l2cache/"},
           {"name": "LMCACHE_REMOTE_SERDE", "value": "naive"}, {"name": "PYTHONHASHSEED", "value": "0"}]
    return {"metadata": {"name": name, "namespace": NS, "labels": {"app": APP}},
            "spec": {"nodeName": node,
                     "volumes": [{"name": "curvine-cache", "persistentVolumeClaim": {"claimName": "curvine-pvc"}}],
                     "containers": [{"name": APP, "image": "vllm", "ports": [{"containerPort": 8000}], "env": env,
                                     "volumeMounts": [{"name": "curvine-cache", "mountPath": "/mnt/curvine"}]},
                                    {"name": "reverse-proxy", "image": "proxy"},
                                    {"name": "otel-collector", "image": "otel"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def _seed_endpoint(store: Any, nodes: Sequence[str]) -> tuple[str, str]:
    """A bound Curvine PVC (PV of the ``curvine`` CSI driver) and two vLLM pods on two different nodes."""
    pv = f"pvc-{uuid.uuid4()}"
    store.create("", "persistentvolumes", {"metadata": {"name": pv}, "spec": {
        "capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "curvine-sc",
        "csi": {"driver": "curvine", "volumeHandle": f"curvine@/l2cache@{pv}"}}})
    store.create("", "persistentvolumeclaims", {"metadata": {"name": "curvine-pvc", "namespace": NS}, "spec": {
        "accessModes": ["ReadWriteMany"], "storageClassName": "curvine-sc", "volumeName": pv,
        "resources": {"requests": {"storage": "100Gi"}}}, "status": {"phase": "Bound"}})
    store.create("", "pods", _blog_pod(f"{APP}-a", nodes[0]))
    store.create("", "pods", _blog_pod(f"{APP}-b", nodes[1]))
    return f"{APP}-a", f"{APP}-b"


@dataclass
class Endpoint:
    api: Any  # kubernetes.client.ApiClient
    pod_a: str
    pod_b: str


def start(state_dir: Path, noise: float | None = None, seed: int | None = None
          ) -> tuple[Callable[[], None], Endpoint, Endpoint]:
    """The sandbox runtime with only the vLLM controller; returns (stop, g5 endpoint, g6e endpoint)."""
    from kubernetes import client

    from kvfleet_sandbox.runtime import eks_token, start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    settings = SandboxSettings()
    if noise is not None:
        settings.ttft_noise = noise
    if seed is not None:
        settings.seed = seed
    sandbox = start_sandbox(ROOT / "fleet.example.yaml", state_dir, settings, controllers=("vllm",))
    clients: list[Any] = []

    def endpoint(cluster: str) -> Endpoint:
        twin = sandbox.twin(cluster)
        config = client.Configuration()
        config.host = sandbox.servers[cluster].url
        config.api_key = {"authorization": f"Bearer {eks_token(twin.region)}"}
        api = client.ApiClient(config)
        clients.append(api)
        return Endpoint(api, *_seed_endpoint(twin.store, twin.gpu_nodes))

    def stop() -> None:
        for api in clients:
            api.close()
        sandbox.stop()

    try:
        return stop, endpoint(G5_CLUSTER), endpoint(G6E_CLUSTER)
    except BaseException:
        stop()
        raise


# --- the client side, as vLLM's benchmark measures -------------------------------------------------------------

@dataclass
class Timing:
    req_id: str
    ttft_s: float
    e2e_s: float


def prompt(tokens: int, nonce: str | None = None) -> list[str]:
    """A prompt of exactly ``tokens`` whitespace-separated words (the simulation's token rule), new every run."""
    return [nonce or uuid.uuid4().hex] + [f"w{i % 89}" for i in range(tokens - 1)]


def stream(api: Any, pod: str, words: Sequence[str], max_tokens: int) -> Timing:
    body = {"model": APP, "prompt": " ".join(words), "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    resp = api.call_api("/api/v1/namespaces/{namespace}/pods/{name}/proxy/v1/completions", "POST",
                        {"namespace": NS, "name": f"{pod}:8000"}, [], {"Content-Type": "application/json"},
                        body=body, auth_settings=["BearerToken"], _preload_content=False)
    ttft, req_id, buffer = None, "", b""
    for raw in resp.stream(512):
        buffer += raw
        while b"\n\n" in buffer:
            message, buffer = buffer.split(b"\n\n", 1)
            data = message.decode().removeprefix("data: ").strip()
            if not data or data.startswith(":") or data == "[DONE]":
                continue
            payload = json.loads(data)
            req_id = payload.get("id", req_id)
            if payload.get("choices") and ttft is None:
                ttft = time.perf_counter() - start
    e2e = time.perf_counter() - start
    return Timing(req_id, ttft if ttft is not None else e2e, e2e)


def pod_log(api: Any, pod: str, since: dt.datetime) -> str:
    resp = api.call_api("/api/v1/namespaces/{namespace}/pods/{name}/log", "GET", {"namespace": NS, "name": pod},
                        [("container", APP), ("sinceTime", since.strftime("%Y-%m-%dT%H:%M:%SZ"))],
                        {"Accept": "*/*"}, auth_settings=["BearerToken"], _preload_content=False)
    return resp.data.decode()


def request_lines(log: str, req_id: str) -> list[str]:
    """The lookup line of ``req_id`` and the LMCache lines that follow it, up to the next request's lookup."""
    out: list[str] = []
    for line in log.splitlines():
        m = HIT.search(line)
        if m:
            if out:
                break
            if m["req"] == req_id:
                out.append(line)
        elif out:
            out.append(line)
    return out


def _search(pattern: re.Pattern[str], lines: Sequence[str]) -> re.Match[str] | None:
    return next((m for line in lines if (m := pattern.search(line))), None)


# --- the experiments ---------------------------------------------------------------------------------------

def _within(value: float, published: float) -> bool:
    return abs(value - published) <= TOLERANCE * published


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def speedup_table(ep: Endpoint, out: Callable[[str], None]) -> bool:
    out("TTFT vs prompt length — ml.g5.4xlarge, Qwen2-7B, pod A cold → pod B (other node) via Curvine L2")
    out(f"{'tokens':>7} {'cold ms':>8} {'warm ms':>8} {'B hit':>6} {'speedup':>8} {'published':>10} {'±10%':>5}")
    ok = True
    for n in LENGTHS:
        words = prompt(n)
        since = dt.datetime.now(dt.UTC).replace(microsecond=0)
        cold = stream(ep.api, ep.pod_a, words, max_tokens=2)
        warm = stream(ep.api, ep.pod_b, words, max_tokens=2)
        hit = _search(HIT, request_lines(pod_log(ep.api, ep.pod_b, since), warm.req_id))
        ratio = int(hit["hit"]) / n if hit else 0.0
        speedup = cold.ttft_s / warm.ttft_s
        published = PUBLISHED_SPEEDUP.get(n)
        checks = []
        if published is not None:
            checks.append(_within(speedup, published))
        if n == 2500:
            checks += [_within(cold.ttft_s * 1000, PUBLISHED_2500["cold_ms"]),
                       _within(warm.ttft_s * 1000, PUBLISHED_2500["warm_ms"])]
        checks.append(ratio >= 0.99)
        ok &= all(checks)
        pub = f"{published:.2f}×" if published is not None else "—"
        out(f"{n:>7} {cold.ttft_s * 1000:>8.0f} {warm.ttft_s * 1000:>8.0f} {ratio:>6.0%} {speedup:>7.2f}× "
            f"{pub:>10} {_mark(all(checks)):>5}")
    out(f"  published at 2,500 tokens: cold {PUBLISHED_2500['cold_ms']:.0f} ms, warm "
        f"{PUBLISHED_2500['warm_ms']:.0f} ms (both checked ±10 %); gains slow after ~2,500")
    return ok


def l2_transfer(ep: Endpoint, out: Callable[[str], None]) -> bool:
    n = PUBLISHED_L2["tokens"]
    words = prompt(int(n))
    since = dt.datetime.now(dt.UTC).replace(microsecond=0)
    cold = stream(ep.api, ep.pod_a, words, max_tokens=1)
    warm = stream(ep.api, ep.pod_b, words, max_tokens=1)
    stored = _search(STORED, request_lines(pod_log(ep.api, ep.pod_a, since), cold.req_id))
    got = _search(RETRIEVED, request_lines(pod_log(ep.api, ep.pod_b, since), warm.req_id))
    out(f"\nL2 transfer of a {n:,}-token prompt (LMCache log lines)")
    if stored is None or got is None:
        out("  ✗ missing Stored/Retrieved line")
        return False
    rows = [("write size GB", float(stored["gb"]), PUBLISHED_L2["gb"]),
            ("write ms", float(stored["ms"]), PUBLISHED_L2["write_ms"]),
            ("write GB/s", float(stored["tp"]), PUBLISHED_L2["write_gbps"]),
            ("read ms", float(got["ms"]), PUBLISHED_L2["read_ms"]),
            ("read GB/s", float(got["tp"]), PUBLISHED_L2["read_gbps"])]
    ok = int(stored["n"]) == n and int(got["n"]) == n
    out(f"  stored {stored['n']} tokens on A, retrieved {got['n']} on B")
    for label, value, published in rows:
        good = _within(value, published)
        ok &= good
        out(f"  {label:<14} {value:>9.4f}   published {published:>8.4f}   {_mark(good)}")
    return ok


def conversation(ep: Endpoint, out: Callable[[str], None]) -> bool:
    out("\n4-turn conversation — ml.g6e.4xlarge, growing history, end-to-end turn time (32 output tokens)")
    cold = [stream(ep.api, ep.pod_a, prompt(n), CONVERSATION_OUTPUT).e2e_s for n in CONVERSATION]
    nonce = uuid.uuid4().hex
    turns = [prompt(n, nonce) for n in CONVERSATION]  # each turn extends the previous one
    for words in turns:  # pod A plays the conversation once: every turn lands in L2
        stream(ep.api, ep.pod_a, words, CONVERSATION_OUTPUT)
    warm = [stream(ep.api, ep.pod_b, words, CONVERSATION_OUTPUT).e2e_s for words in turns]
    out(f"{'turn':>5} {'tokens':>7} {'cold s':>7} {'warm s':>7} {'speedup':>8} {'published':>10} {'±10%':>5}")
    ok = True
    for i, n in enumerate(CONVERSATION):
        speedup = cold[i] / warm[i]
        published = {0: PUBLISHED_CONVERSATION["first"], len(CONVERSATION) - 1: PUBLISHED_CONVERSATION["last"]}.get(i)
        good = published is None or _within(speedup, published)
        ok &= good
        pub = f"{published:.2f}×" if published is not None else "—"
        out(f"{i + 1:>5} {n:>7} {cold[i]:>7.2f} {warm[i]:>7.2f} {speedup:>7.2f}× {pub:>10} {_mark(good):>5}")
    total = sum(cold) / sum(warm)
    good = _within(total, PUBLISHED_CONVERSATION["total"])
    ok &= good
    out(f"{'total':>5} {'':>7} {sum(cold):>7.2f} {sum(warm):>7.2f} {total:>7.2f}× "
        f"{PUBLISHED_CONVERSATION['total']:>9.2f}× {_mark(good):>5}"
        f"   (published {PUBLISHED_CONVERSATION['cold_s']} s → {PUBLISHED_CONVERSATION['warm_s']} s)")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=None, help="relative TTFT noise (default: the sandbox's)")
    parser.add_argument("--seed", type=int, default=None, help="sandbox seed (default: the sandbox's)")
    args = parser.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="kvfleet-bench-ttft-"))
    began = time.perf_counter()
    stop, g5, g6e = start(state, args.noise, args.seed)
    try:
        results = [speedup_table(g5, print), l2_transfer(g5, print), conversation(g6e, print)]
    finally:
        stop()
        shutil.rmtree(state, ignore_errors=True)
    ok = all(results)
    print(f"\n{'PASS' if ok else 'FAIL'}: every published point within ±{TOLERANCE:.0%} "
          f"({time.perf_counter() - began:.1f} s)" if ok else
          f"\nFAIL: some published points are outside ±{TOLERANCE:.0%} ({time.perf_counter() - began:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
