"""The sandbox's admin endpoint: request counters and fault injection for processes outside the sandbox.

Started by :func:`kvfleet.sandbox.runtime.start_sandbox` on 127.0.0.1 (its URL is exported as
``KVFLEET_SANDBOX_ADMIN``). The sandbox lives in one process, but the demo's ``airflow dags test``, ``make bench``
and humans run in others; they cannot reach ``KubeStore.request_counts()`` or a controller object, so this tiny
JSON API stands in for them. It is sandbox machinery only: product code never calls it.

- ``GET /health`` → ``{"ok": true}``
- ``GET /clusters`` → the clusters, their URLs, controllers and registered services
- ``GET /exports`` → the environment the sandbox exports
- ``GET /requests[?cluster=C]`` → per cluster ``{"total", "counts": {"<verb> <resource>": n}}`` (discovery not
  counted), and ``aws``: the AWS operations in order, narrowed to those naming the cluster when ``cluster`` is
  given (operations that name no cluster, e.g. STS, are always included)
- ``POST /reset-requests[?cluster=C]`` → clears the counters (AWS too when no cluster is given)
- ``POST /fault`` with ``{"cluster": C | "*", "kind": K, ...}``:

  ======================= ==============================================================================
  ``api_error_rate``      ``rate`` (0..1): share of requests answered 5xx; ``target`` kube|aws|all (all)
  ``api_latency``         ``seconds`` (real seconds) added to every request; ``target`` as above
  ``clear``               error rate and latency back to 0 on kube and AWS
  ``operator_rerender``   ``services["operator"].rerender_now()``
  ``kill_pod``            ``services["workloads"].kill_pod(namespace, name)``
  ``lose_node``           ``services["workloads"].lose_node(node)``
  ``restart_curvine_master``  ``services["curvine"].restart_master()``
  ``l2_read_penalty``     ``ms``: every L2 read that many ms slower (``services["vllm"]``); 0 clears it
  ======================= ==============================================================================

  A hook whose controller has not registered its service answers 409 with the reason. The AWS emulator is
  shared by every cluster, so an AWS fault applies fleet-wide whatever ``cluster`` says.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from kvfleet.sandbox.runtime import Sandbox
    from kvfleet.sandbox.twin import ClusterTwin

log = logging.getLogger(__name__)

# kind -> (service name, method, body keys passed positionally)
SERVICE_FAULTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "operator_rerender": ("operator", "rerender_now", ()),
    "kill_pod": ("workloads", "kill_pod", ("namespace", "name")),
    "lose_node": ("workloads", "lose_node", ("node",)),
    "restart_curvine_master": ("curvine", "restart_master", ()),
    "l2_read_penalty": ("vllm", "set_l2_read_penalty", ("ms",)),
}
API_FAULTS = ("api_error_rate", "api_latency", "clear")


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AdminServer:
    """A ThreadingHTTPServer on 127.0.0.1 answering for one :class:`Sandbox` (set ``sandbox`` before start)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"the sandbox admin endpoint binds to loopback only, not {host!r}")
        self.host, self.port = host, port
        self.sandbox: Sandbox | None = None
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        if self._httpd is not None:
            return
        httpd = _Server((self.host, self.port), _Handler)
        httpd.admin = self
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"sandbox-admin:{self.port}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- operations ------------------------------------------------------------------------------------

    def _sb(self) -> Sandbox:
        if self.sandbox is None:
            raise AdminError(503, "the sandbox is still starting")
        return self.sandbox

    def _twins(self, cluster: str | None) -> list[ClusterTwin]:
        sb = self._sb()
        if cluster in (None, "", "*"):
            return list(sb.twins.values())
        if cluster not in sb.twins:
            raise AdminError(404, f"no cluster {cluster!r} in the sandbox; known: {', '.join(sb.twins)}")
        return [sb.twins[cluster]]

    def requests(self, cluster: str | None) -> dict[str, Any]:
        sb = self._sb()
        twins = self._twins(cluster)
        clusters = {}
        for twin in twins:
            counts = twin.store.request_counts()
            clusters[twin.name] = {
                "total": sum(counts.values()),
                "counts": {f"{verb} {resource}": n for (verb, resource), n in sorted(counts.items())},
            }
        names: set[str] = set()
        if cluster not in (None, "", "*"):
            twin = twins[0]
            hp = sb.aws.hyperpod_cluster(twin.name) or {}
            names = {twin.name, twin.eks_name, str(hp.get("ClusterArn"))}
        aws = []
        for entry in list(sb.aws.request_log):
            named = {str(entry.params[k]) for k in ("ClusterName", "name", "clusterName") if k in entry.params}
            if not names or not named or named & names:
                aws.append(f"{entry.service}:{entry.operation}")
        return {"clusters": clusters, "aws": {"total": len(aws), "operations": aws}}

    def reset_requests(self, cluster: str | None) -> dict[str, Any]:
        for twin in self._twins(cluster):
            twin.store.reset_request_log()
        if cluster in (None, "", "*"):
            self._sb().aws.reset_request_log()
        return {"ok": True}

    def fault(self, body: dict[str, Any]) -> dict[str, Any]:
        kind = body.get("kind")
        cluster = body.get("cluster")
        if kind in API_FAULTS:
            return self._api_fault(kind, cluster, body)
        if kind not in SERVICE_FAULTS:
            known = ", ".join((*API_FAULTS, *SERVICE_FAULTS))
            raise AdminError(400, f"unknown fault kind {kind!r}; known kinds: {known}")
        if cluster in (None, "", "*"):
            raise AdminError(400, f"fault {kind!r} needs one cluster: add \"cluster\": \"<name>\"")
        twin = self._twins(cluster)[0]
        service_name, method, keys = SERVICE_FAULTS[kind]
        missing = [k for k in keys if k not in body]
        if missing:
            raise AdminError(400, f"fault {kind!r} needs {', '.join(repr(k) for k in missing)}")
        service = twin.services.get(service_name)
        if service is None or not callable(getattr(service, method, None)):
            raise AdminError(409, f"cluster {twin.name!r} has no {service_name!r} service with {method}(): the "
                                  f"{service_name} controller is not attached (or does not support {kind})")
        try:
            result = getattr(service, method)(*(body[k] for k in keys))
        except ValueError as exc:  # the hook refused the value (a range, a name)
            raise AdminError(400, f"fault {kind!r}: {exc}") from None
        return {"ok": True, "cluster": twin.name, "kind": kind, "result": result}

    def _api_fault(self, kind: str, cluster: str | None, body: dict[str, Any]) -> dict[str, Any]:
        sb = self._sb()
        twins = self._twins(cluster)
        target = body.get("target", "all")
        if target not in ("kube", "aws", "all"):
            raise AdminError(400, f"target must be kube, aws or all, not {target!r}")
        attr, value = "error_rate", 0.0
        if kind == "api_error_rate":
            value = _number(body, "rate", 0.0, 1.0)
        elif kind == "api_latency":
            attr, value = "latency_s", _number(body, "seconds", 0.0, 60.0)
        settings = [("error_rate", 0.0), ("latency_s", 0.0)] if kind == "clear" else [(attr, value)]
        for name, val in settings:
            if target in ("kube", "all"):
                for twin in twins:
                    setattr(sb.servers[twin.name], name, val)
            if target in ("aws", "all"):
                # The AWS emulator sleeps its latency on the model clock; the admin API speaks real seconds.
                setattr(sb.aws, name, val / sb.clock.scale if name == "latency_s" else val)
        return {"ok": True, "kind": kind, "target": target, "clusters": [t.name for t in twins]}

    def route(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        cluster = query.get("cluster")
        if method == "GET" and path == "/health":
            return {"ok": True}
        if method == "GET" and path == "/clusters":
            return self._sb().describe()
        if method == "GET" and path == "/exports":
            return self._sb().exports()
        if method == "GET" and path == "/requests":
            return self.requests(cluster)
        if method == "POST" and path == "/reset-requests":
            return self.reset_requests(cluster)
        if method == "POST" and path == "/fault":
            if not isinstance(body, dict):
                raise AdminError(400, "POST /fault needs a JSON object body")
            return self.fault(body)
        raise AdminError(404, f"no admin route {method} {path}")


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> float:
    try:
        value = float(body[key])
    except (KeyError, TypeError, ValueError):
        raise AdminError(400, f"{key!r} must be a number between {lo} and {hi}") from None
    if not lo <= value <= hi:
        raise AdminError(400, f"{key!r} must be between {lo} and {hi}, not {value}")
    return value


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    admin: AdminServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _serve(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return self._send(400, {"error": "the body is not JSON"})
        try:
            self._send(200, self.server.admin.route(self.command, url.path.rstrip("/") or "/", query, body))
        except AdminError as exc:
            self._send(exc.status, {"error": str(exc)})
        except Exception as exc:  # a failing hook must answer, not hang the caller
            log.exception("sandbox admin %s %s failed", self.command, self.path)
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})

    do_GET = do_POST = _serve

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload, default=str, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("sandbox-admin " + format, *args)
