"""A load generator: a steady stream of short completion requests to every endpoint, through the Kubernetes API
server's Service proxy (``/api/v1/namespaces/<ns>/services/<endpoint>:8000/proxy/v1/completions``), counting per
endpoint the requests sent and failed, their latency, and the longest gap without a successful response.

Used by ``bench/rollout_availability.py`` during a rollout on the sandbox, and standalone against any cluster the
kubeconfig reaches (the sandbox writes one with a context per cluster: ``<state-dir>/kubeconfig``). Each endpoint
gets its own thread, which starts one request every ``1 / rate`` seconds (or at once when the previous request took
longer: at most one request per endpoint is in flight, so an endpoint that hangs is not flooded). A request
fails on any answer other than 2xx (the apiserver's 503 "no endpoints available" when no pod of the Service is
Ready, vLLM's own errors) or on a transport error / timeout.

The Service per endpoint is the one the HyperPod inference operator renders: named after the endpoint, port 8000
(tests/conformance/facts/service_proxy.yaml says what is confirmed and what is assumed).

    python bench/loadgen.py --kubeconfig .sandbox/kubeconfig --fleet fleet.example.yaml --duration 30 [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICE_PORT = 8000
PROMPT = "Reply with one word: ok?"
_PATH = "/api/v1/namespaces/{namespace}/services/{name}/proxy/v1/completions"


@dataclass(frozen=True)
class Target:
    """One endpoint: its cluster (the kubeconfig context), namespace and Service name."""

    cluster: str
    namespace: str
    name: str
    port: int = SERVICE_PORT

    @property
    def ref(self) -> str:
        return f"{self.cluster}:{self.namespace}/{self.name}"


@dataclass
class EndpointStats:
    """What one endpoint's stream measured; times are monotonic seconds."""

    target: Target
    sent: int = 0
    failed: int = 0
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0
    successes: list[float] = field(default_factory=list)  # completion times of successful requests

    @property
    def longest_gap_s(self) -> float:
        """The longest stretch without a successful response, counting from the start and up to the end."""
        marks = [self.started, *self.successes, self.ended or time.monotonic()]
        return max((b - a for a, b in itertools.pairwise(marks)), default=0.0)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_s)

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 4) if lat else None

        return {"endpoint": self.target.ref, "sent": self.sent, "failed": self.failed,
                "longest_gap_s": round(self.longest_gap_s, 3), "latency_p50_s": pct(0.5),
                "latency_p99_s": pct(0.99), "latency_max_s": round(lat[-1], 4) if lat else None,
                "errors": dict(self.errors)}


def api_client(kubeconfig: str | Path, context: str, pool_size: int = 16) -> Any:
    """The official Kubernetes client for one kubeconfig context, with a connection pool for ``pool_size``
    concurrent streams."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


def complete_once(api: Any, target: Target, *, max_tokens: int = 2, timeout_s: float = 10.0) -> tuple[bool, str]:
    """One short completion through the Service proxy: (ok, error text)."""
    from kubernetes.client.rest import ApiException

    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}
    try:
        resp = api.call_api(_PATH, "POST", {"namespace": target.namespace, "name": f"{target.name}:{target.port}"},
                            [], {"Content-Type": "application/json", "Accept": "application/json"}, body=body,
                            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout_s)
        raw = resp[0] if isinstance(resp, tuple) else resp
        data = raw.data
        payload = json.loads(data) if data else {}
        if not payload.get("choices"):
            return False, "no choices in the answer"
        return True, ""
    except ApiException as exc:
        return False, f"HTTP {exc.status}{_reason(exc.body)}"
    except Exception as exc:  # transport errors, timeouts, bad JSON: all count as a failed request
        return False, type(exc).__name__


def _reason(body: Any) -> str:
    """The Status message of an apiserver error, without the quoted names (so errors group by kind)."""
    try:
        message = str(json.loads(body).get("message") or "")
    except (ValueError, TypeError, AttributeError):
        return ""
    return f": {message.split(chr(34))[0].strip()}" if message else ""


class LoadGenerator:
    """Steady load on ``targets``: ``start()``, then ``stop()`` returns the per-endpoint stats."""

    def __init__(self, kubeconfig: str | Path, targets: Iterable[Target], *, rate: float = 5.0,
                 max_tokens: int = 2, timeout_s: float = 10.0) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 requests per second per endpoint, got {rate}")
        self.targets = list(targets)
        self.interval = 1.0 / rate
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        per_cluster: dict[str, int] = {}
        for t in self.targets:
            per_cluster[t.cluster] = per_cluster.get(t.cluster, 0) + 1
        self._clients = {c: api_client(kubeconfig, c, n + 4) for c, n in per_cluster.items()}
        self.stats = {t.ref: EndpointStats(t) for t in self.targets}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        now = time.monotonic()
        for t in self.targets:
            self.stats[t.ref].started = now
            thread = threading.Thread(target=self._stream, args=(t,), name=f"loadgen-{t.ref}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _stream(self, target: Target) -> None:
        stats, api = self.stats[target.ref], self._clients[target.cluster]
        next_at = time.monotonic()
        while not self._stop.is_set():
            begun = time.monotonic()
            ok, error = complete_once(api, target, max_tokens=self.max_tokens, timeout_s=self.timeout_s)
            done = time.monotonic()
            stats.sent += 1
            if ok:
                stats.latencies_s.append(done - begun)
                stats.successes.append(done)
            else:
                stats.failed += 1
                stats.errors[error] = stats.errors.get(error, 0) + 1
            next_at = max(next_at + self.interval, done)
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> dict[str, EndpointStats]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)
        ended = time.monotonic()
        for stats in self.stats.values():
            stats.ended = ended
        for api in self._clients.values():
            api.close()
        return self.stats


def targets_from_fleet(fleet: str | Path, clusters: Iterable[str] | None = None) -> list[Target]:
    """Every endpoint of an inventory (optionally only on ``clusters``)."""
    from kvfleet.fleet.inventory import load_inventory

    wanted = set(clusters) if clusters else None
    return [Target(ep.cluster, ep.namespace, ep.name) for ep in load_inventory(Path(fleet)).endpoints
            if wanted is None or ep.cluster in wanted]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True, help="kubeconfig with one context per cluster (the sandbox's "
                                                        "<state-dir>/kubeconfig)")
    ap.add_argument("--fleet", default="fleet.example.yaml", help="inventory whose endpoints get load")
    ap.add_argument("--cluster", action="append", help="only these clusters (repeatable)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    ap.add_argument("--rate", type=float, default=5.0, help="requests per second per endpoint (default 5)")
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print only a JSON summary on stdout")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.rate <= 0:
        ap.error(f"--duration and --rate must be > 0 (got {args.duration}, {args.rate}); e.g. --duration 30 "
                 "--rate 5")
    if not Path(args.kubeconfig).is_file():
        ap.error(f"--kubeconfig {args.kubeconfig}: no such file; start the sandbox (kvfleet sandbox up) and pass "
                 "its <state-dir>/kubeconfig")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    targets = targets_from_fleet(args.fleet, args.cluster)
    gen = LoadGenerator(args.kubeconfig, targets, rate=args.rate, max_tokens=args.max_tokens)
    gen.start()
    time.sleep(args.duration)
    rows = [s.summary() for s in gen.stop().values()]
    if args.json:
        print(json.dumps({"duration_s": args.duration, "rate_per_endpoint": args.rate, "endpoints": rows}))
    else:
        print(f"{'endpoint':48} {'sent':>6} {'failed':>6} {'gap s':>7} {'p50 s':>7}")
        for r in rows:
            print(f"{r['endpoint']:48} {r['sent']:6d} {r['failed']:6d} {r['longest_gap_s']:7.2f} "
                  f"{r['latency_p50_s'] or 0:7.3f}")
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
