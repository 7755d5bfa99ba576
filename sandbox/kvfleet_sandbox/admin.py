"""The sandbox's admin endpoint: request counters and fault injection for processes outside the sandbox.

Started by :func:`kvfleet_sandbox.runtime.start_sandbox` on 127.0.0.1 (its URL is exported as
``KVFLEET_SANDBOX_ADMIN``). The sandbox lives in one process, but the demo's ``airflow dags test``, ``make bench``
and humans run in others; they cannot reach ``KubeStore.request_counts()`` or a controller object, so this tiny
JSON API stands in for them. It is sandbox machinery only: product code never calls it.

- ``GET /health`` → ``{"ok": true}``
- ``GET /clusters`` → the clusters, their URLs, controllers and registered services
- ``GET /exports`` → the environment the sandbox exports
- ``GET /requests[?cluster=C]`` → per cluster ``{"total", "counts": {"<verb> <resource>": n}}`` (discovery not
  counted), and ``aws``: the AWS operations in order, narrowed to those naming the cluster when ``cluster`` is
  given (operations that name no cluster, e.g. STS, are always included)
  (and ``by_account``: the same operations by the account they were answered in); ``C`` is a cluster's key
  ``account/region/name`` or a bare name only one cluster has
- ``GET /aws/calls`` → the AWS request log, oldest first: ``{"service", "operation", "account", "caller_arn",
  "session_tags", "mutating"}`` per call
- ``POST /reset-requests[?cluster=C]`` → clears the counters (AWS too when no cluster is given)
- ``POST /aws/credential-lifetime`` with ``{"seconds": N | null}`` → credentials the AWS emulator's AssumeRole issues
  from now on live at most N real seconds (``AwsEmulator.credential_lifetime_s``); null lifts the cap
- ``POST /fault`` with ``{"cluster": C | "*", "kind": K, ...}``:

  ======================= ==============================================================================
  ``api_error_rate``      ``rate`` (0..1): share of requests answered 5xx; ``target`` kube|aws|all (all)
  ``api_latency``         ``seconds`` (real seconds) added to every request; ``target`` as above
  ``api_conflict``        ``count`` (0..10000): the next that many mutating requests answered 409 Conflict;
                          ``resource`` (optional): only requests on that kube resource (e.g. ``deployments``) or
                          that AWS operation (e.g. ``UpdateCluster``); ``target`` as above; count 0 clears it
  ``api_network_failure`` ``count``, ``resource``, ``target`` as for ``api_conflict``: the connection of each of
                          those requests is closed without an answer (a temporary network failure)
  ``fail_write``          ``resource`` (a kube resource, e.g. ``deployments``), ``nth`` (1..10000), ``code``
                          (409, 422, 429, 500 or 503; 500): the nth write (PUT, PATCH or scale; dry runs
                          and status writes do not count) of that resource on the cluster is answered with
                          that status, once (``write_faults``); ``name``/``namespace`` (optional) count one
                          object's writes only
  ``clear``               error rate, latency, conflicts, network failures and fail_write faults back to 0 on
                          kube and AWS
  ``operator_rerender``   ``services["operator"].rerender_now()``
  ``kill_pod``            ``services["workloads"].kill_pod(namespace, name)``
  ``lose_node``           ``services["workloads"].lose_node(node)``
  ``restart_curvine_master``  ``services["curvine"].restart_master()``
  ``l2_read_penalty``     ``ms``: every L2 read that many ms slower (``services["vllm"]``); 0 clears it
  ``l2_drop_reads``       ``namespace``, ``endpoint``: that endpoint's pods find nothing in L2 (every lookup
                          misses; ``services["vllm"].drop_l2_reads``); ``drop`` (boolean, true) false clears it
  ======================= ==============================================================================

  A hook whose controller has not registered its service answers 409 with the reason. The AWS emulator is
  shared by every cluster, so an AWS fault applies fleet-wide whatever ``cluster`` says.

Hostile requests are answered 4xx with a message, before anything changes: a field of the wrong type
(a boolean is not a number), an unknown field, an unknown node → 400/404; a body over ``MAX_BODY_BYTES`` or a
``Content-Length`` over it → 413 without reading it; a ``Content-Length`` that is not a non-negative integer, or
chunked encoding → 400/411; JSON nested deeper than ``MAX_JSON_DEPTH`` → 400; a client that stops sending is
dropped after ``READ_TIMEOUT_S`` (408), so no handler thread is held.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from kvfleet_sandbox.write_faults import WriteFaults

if TYPE_CHECKING:
    from kvfleet_sandbox.runtime import Sandbox
    from kvfleet_sandbox.twin import ClusterTwin

log = logging.getLogger(__name__)

# kind -> (service name, method, body keys passed positionally)
SERVICE_FAULTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "operator_rerender": ("operator", "rerender_now", ()),
    "kill_pod": ("workloads", "kill_pod", ("namespace", "name")),
    "lose_node": ("workloads", "lose_node", ("node",)),
    "restart_curvine_master": ("curvine", "restart_master", ()),
    "l2_read_penalty": ("vllm", "set_l2_read_penalty", ("ms",)),
    "l2_drop_reads": ("vllm", "drop_l2_reads", ("namespace", "endpoint")),
}
API_FAULTS = ("api_error_rate", "api_latency", "api_conflict", "api_network_failure", "fail_write", "clear")
MAX_FAULT_COUNT = 10_000
# The fields each kind reads (besides "cluster" and "kind"), and what each must be.
FAULT_FIELDS: dict[str, dict[str, str]] = {
    "api_error_rate": {"rate": "number", "target": "target"},
    "api_latency": {"seconds": "number", "target": "target"},
    "api_conflict": {"count": "integer", "resource": "name", "target": "target"},
    "api_network_failure": {"count": "integer", "resource": "name", "target": "target"},
    "fail_write": {"resource": "name", "nth": "integer", "code": "integer", "name": "name", "namespace": "name"},
    "clear": {"target": "target"},
    "operator_rerender": {},
    "kill_pod": {"namespace": "name", "name": "name"},
    "lose_node": {"node": "name"},
    "restart_curvine_master": {},
    "l2_read_penalty": {"ms": "number"},
    "l2_drop_reads": {"namespace": "name", "endpoint": "name", "drop": "boolean"},
}

MAX_BODY_BYTES = 64 * 1024
MAX_TRAFFIC_ROWS = 64
MAX_JSON_DEPTH = 32
READ_TIMEOUT_S = 5.0


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
        self._write_faults: dict[str, WriteFaults] = {}
        self._write_faults_lock = threading.Lock()
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
        try:
            return [sb.twins[str(cluster)]]
        except KeyError as exc:  # unknown, or a bare name of several accounts' clusters (the keys listed)
            raise AdminError(404, _cut(str(exc.args[0]) if exc.args else str(exc), 400)) from None

    def requests(self, cluster: str | None) -> dict[str, Any]:
        sb = self._sb()
        twins = self._twins(cluster)
        clusters = {}
        for twin in twins:
            counts = twin.store.request_counts()
            clusters[sb.twins.label(twin.key) if twin.key else twin.name] = {
                "total": sum(counts.values()),
                "counts": {f"{verb} {resource}": n for (verb, resource), n in sorted(counts.items())},
            }
        names: set[str] = set()
        account = None
        if cluster not in (None, "", "*"):
            twin = twins[0]
            account = twin.account or sb.aws.account_id
            hp = sb.aws.hyperpod_cluster(twin.name, account=twin.account) or {}
            names = {twin.name, twin.eks_name, str(hp.get("ClusterArn"))}
        aws: list[str] = []
        by_account: dict[str, list[str]] = {}
        for entry in list(sb.aws.request_log):
            named = {str(entry.params[k]) for k in ("ClusterName", "name", "clusterName") if k in entry.params}
            if not names or not named or (named & names and entry.account == account):
                aws.append(f"{entry.service}:{entry.operation}")
                by_account.setdefault(entry.account, []).append(f"{entry.service}:{entry.operation}")
        return {"clusters": clusters, "aws": {"total": len(aws), "operations": aws, "by_account": by_account}}

    def aws_calls(self) -> list[dict[str, Any]]:
        """The AWS emulator's request log, oldest first: each call with the account it was answered in, the
        caller's ARN and the session tags of its credentials (parameters left out)."""
        return [{"service": e.service, "operation": e.operation, "account": e.account, "caller_arn": e.caller_arn,
                 "session_tags": [list(t) for t in e.session_tags], "mutating": e.mutating}
                for e in list(self._sb().aws.request_log)]

    def credential_lifetime(self, body: dict[str, Any]) -> dict[str, Any]:
        """``{"seconds": N}`` (1..43200) caps the lifetime of credentials the AWS emulator's AssumeRole issues from
        now on (real seconds, so a test can watch them expire); ``{"seconds": null}`` lifts the cap."""
        unknown = sorted(str(k) for k in body if k != "seconds")
        if unknown or "seconds" not in body:
            raise AdminError(400, "credential-lifetime takes exactly {\"seconds\": 1–43200 or null}")
        seconds = None if body["seconds"] is None else _integer(body, "seconds", 1, 43200)
        self._sb().aws.credential_lifetime_s = seconds
        return {"ok": True, "seconds": seconds}

    def reset_requests(self, cluster: str | None) -> dict[str, Any]:
        for twin in self._twins(cluster):
            twin.store.reset_request_log()
        if cluster in (None, "", "*"):
            self._sb().aws.reset_request_log()
        return {"ok": True}

    def fault(self, body: dict[str, Any]) -> dict[str, Any]:
        kind = body.get("kind")
        cluster = body.get("cluster")
        _check_fault_body(kind, cluster, body)
        assert isinstance(kind, str)  # _check_fault_body refused anything else
        if kind == "fail_write":
            return self._write_fault(self._twins(cluster), body)
        if kind == "clear":
            for twin in self._twins(cluster):
                self._write_faults_of(twin).clear()
        if kind in API_FAULTS:
            return self._api_fault(kind, cluster, body)
        return self._service_fault(kind, cluster, body)

    def traffic_mix(self, body: dict[str, Any]) -> dict[str, Any]:
        """Set an endpoint's synthetic traffic (the L2 advisor's input): ``{"cluster", "endpoint" (its app label),
        "rows": [[prompt tokens, requests per hour, hit share], ...]}``, shown in every pod's metrics of that
        endpoint (``VllmSimulation.set_traffic_mix``). A modelling input, not an upstream behaviour."""
        unknown = sorted(str(k) for k in body if k not in ("cluster", "endpoint", "rows"))
        if unknown:
            raise AdminError(400, f"traffic-mix has no field {', '.join(_show(k) for k in unknown[:5])}; its fields: "
                                  "cluster, endpoint, rows")
        cluster, endpoint, rows = body.get("cluster"), body.get("endpoint"), body.get("rows")
        if not isinstance(cluster, str):
            raise AdminError(400, f"\"cluster\" must be a cluster name (a string) or \"*\", not {_show(cluster)}")
        if not (isinstance(endpoint, str) and 0 < len(endpoint) <= 253):
            raise AdminError(400, f"\"endpoint\" must be the endpoint's name (1–253 characters), not {_show(endpoint)}")
        if not (isinstance(rows, list) and 0 < len(rows) <= MAX_TRAFFIC_ROWS):
            raise AdminError(400, f"\"rows\" must be a list of 1–{MAX_TRAFFIC_ROWS} [tokens, requests per hour, hit "
                                  f"share] rows, not {_show(rows)}")
        parsed = []
        for i, row in enumerate(rows):
            if not (isinstance(row, list) and len(row) == 3):
                raise AdminError(400, f"rows[{i}] must be [tokens, requests per hour, hit share], not {_show(row)}")
            fields = dict(zip(("tokens", "per_hour", "hit"), row, strict=True))
            try:
                parsed.append((_integer(fields, "tokens", 1, 1_000_000), _integer(fields, "per_hour", 0, 10_000_000),
                               _number(fields, "hit", 0.0, 1.0)))
            except AdminError as exc:
                raise AdminError(400, f"rows[{i}]: {exc}") from None
        twins = self._twins(cluster)
        for twin in twins:
            twin.services["vllm"].set_traffic_mix(endpoint, parsed)
        return {"clusters": [t.name for t in twins], "endpoint": endpoint, "rows": len(parsed)}

    def _service_fault(self, kind: str, cluster: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """A fault that calls a controller's hook (``SERVICE_FAULTS``) on one cluster."""
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
        args = [body[k] for k in keys]
        if kind == "l2_read_penalty":
            args = [_number(body, "ms", 0.0, 60_000.0)]
        if kind == "l2_drop_reads":
            args.append(body.get("drop", True))
        if kind == "lose_node" and twin.store.get("", "nodes", body["node"]) is None:
            raise AdminError(404, f"cluster {twin.name!r} has no node {_show(body['node'])}; its GPU nodes: "
                                  f"{', '.join(twin.gpu_nodes[:20]) or 'none'}")
        try:
            result = getattr(service, method)(*args)
        except (ValueError, KeyError, TypeError) as exc:  # the hook refused the value (a range, a name)
            raise AdminError(400, f"fault {kind!r}: {_cut(str(exc), 200)}") from None
        return {"ok": True, "cluster": twin.name, "kind": kind, "result": result}

    def _api_fault(self, kind: str, cluster: str | None, body: dict[str, Any]) -> dict[str, Any]:
        twins = self._twins(cluster)
        target = body.get("target", "all")
        if not isinstance(target, str) or target not in ("kube", "aws", "all"):
            raise AdminError(400, f"target must be kube, aws or all, not {_show(target)}")
        if kind in ("api_conflict", "api_network_failure", "clear"):
            count, resource = self._mutation_fault(kind, twins, target, body)
            if kind != "clear":
                return {"ok": True, "kind": kind, "target": target, "count": count, "resource": resource,
                        "clusters": [t.name for t in twins]}
        attr, value = "error_rate", 0.0
        if kind == "api_error_rate":
            value = _number(body, "rate", 0.0, 1.0)
        elif kind == "api_latency":
            attr, value = "latency_s", _number(body, "seconds", 0.0, 60.0)
        settings = [("error_rate", 0.0), ("latency_s", 0.0)] if kind == "clear" else [(attr, value)]
        for name, val in settings:
            self._set_rate(twins, target, name, val)
        return {"ok": True, "kind": kind, "target": target, "clusters": [t.name for t in twins]}

    def _set_rate(self, twins: list[ClusterTwin], target: str, name: str, val: float) -> None:
        """``error_rate`` or ``latency_s`` (real seconds) on the kube servers and/or the AWS emulator."""
        sb = self._sb()
        if target in ("kube", "all"):
            for twin in twins:
                setattr(sb.servers[twin.name], name, val)
        if target in ("aws", "all"):
            # The AWS emulator sleeps its latency on the model clock; the admin API speaks real seconds.
            setattr(sb.aws, name, val / sb.clock.scale if name == "latency_s" else val)

    def _write_faults_of(self, twin: ClusterTwin) -> WriteFaults:
        """The cluster's ``fail_write`` hook, registered on its store the first time it is needed."""
        with self._write_faults_lock:
            faults = self._write_faults.get(twin.name)
            if faults is None:
                faults = self._write_faults[twin.name] = WriteFaults(twin.store)
            return faults

    def _write_fault(self, twins: list[ClusterTwin], body: dict[str, Any]) -> dict[str, Any]:
        if "resource" not in body or "nth" not in body:
            raise AdminError(400, "fault 'fail_write' needs \"resource\" (e.g. \"deployments\") and \"nth\" "
                                  "(1 = the next write)")
        nth = _integer(body, "nth", 1, MAX_FAULT_COUNT)
        code = _integer(body, "code", 400, 599) if "code" in body else 500
        armed = {}
        for twin in twins:
            try:
                armed[twin.name] = self._write_faults_of(twin).arm(
                    body["resource"], nth, code, body.get("name"), body.get("namespace"))["armed"]
            except ValueError as exc:
                raise AdminError(400, f"fault 'fail_write': {exc}") from None
        return {"ok": True, "kind": "fail_write", "clusters": armed}

    def _mutation_fault(self, kind: str, twins: list[ClusterTwin], target: str,
                        body: dict[str, Any]) -> tuple[int, str | None]:
        """api_conflict / api_network_failure (or clear, which ends both): the next ``count`` mutating requests."""
        sb = self._sb()
        count = 0 if kind == "clear" else _integer(body, "count", 0, MAX_FAULT_COUNT)
        resource = body.get("resource")
        modes = ("conflict", "drop") if kind == "clear" else ("conflict" if kind == "api_conflict" else "drop",)
        for mode in modes:
            if target in ("kube", "all"):
                for twin in twins:
                    sb.servers[twin.name].fail_mutations(mode, count, resource)
            if target in ("aws", "all"):
                sb.aws.fail_mutations(mode, count, resource)
        return count, resource

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
        if method == "GET" and path == "/aws/calls":
            return self.aws_calls()
        if method == "POST" and path == "/reset-requests":
            return self.reset_requests(cluster)
        posted = {"/fault": self.fault, "/aws/credential-lifetime": self.credential_lifetime,
                  "/traffic-mix": self.traffic_mix}
        if method == "POST" and path in posted:
            if not isinstance(body, dict):
                raise AdminError(400, f"POST {path} needs a JSON object body")
            return posted[path](body)
        raise AdminError(404, f"no admin route {method} {path}")


def _check_fault_body(kind: Any, cluster: Any, body: dict[str, Any]) -> None:
    """Refuse (400) a fault body whose kind, cluster or fields have the wrong type, before anything runs."""
    if not isinstance(kind, str) or kind not in FAULT_FIELDS:
        known = ", ".join((*API_FAULTS, *SERVICE_FAULTS))
        raise AdminError(400, f"unknown fault kind {_show(kind)}; known kinds: {known}")
    if cluster is not None and not isinstance(cluster, str):
        raise AdminError(400, f"\"cluster\" must be a cluster name (a string) or \"*\", not {_show(cluster)}")
    allowed = FAULT_FIELDS[kind]
    unknown = sorted(str(k) for k in body if k not in allowed and k not in ("cluster", "kind"))
    if unknown:
        raise AdminError(400, f"fault {kind!r} has no field {', '.join(_show(k) for k in unknown[:5])}; its "
                              f"fields: {', '.join(['cluster', 'kind', *allowed]) }")
    for key, what in allowed.items():
        if key in body and what == "name" and not (isinstance(body[key], str) and 0 < len(body[key]) <= 253):
            raise AdminError(400, f"{key!r} must be a Kubernetes name (a string of 1–253 characters), not "
                                  f"{_show(body[key])}")
        if key in body and what == "boolean" and not isinstance(body[key], bool):
            raise AdminError(400, f"{key!r} must be true or false, not {_show(body[key])}")


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> float:
    """A JSON number in [lo, hi]. A boolean is not a number (``True`` would be 1.0), nor is a string."""
    raw = body.get(key)
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise AdminError(400, f"{key!r} must be a number between {lo} and {hi}, not {_show(raw)}")
    value = float(raw) if not isinstance(raw, int) or abs(raw) < 2**63 else math.inf
    if not math.isfinite(value) or not lo <= value <= hi:
        raise AdminError(400, f"{key!r} must be between {lo} and {hi}, not {_show(raw)}")
    return value


def _integer(body: dict[str, Any], key: str, lo: int, hi: int) -> int:
    """A JSON integer in [lo, hi] (a boolean or a float is not one)."""
    raw = body.get(key)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise AdminError(400, f"{key!r} must be a whole number between {lo} and {hi}, not {_show(raw)}")
    if not lo <= raw <= hi:
        raise AdminError(400, f"{key!r} must be between {lo} and {hi}, not {_show(raw)}")
    return raw


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _show(value: Any) -> str:
    """A value quoted in an answer: short (a container by its type and size)."""
    if isinstance(value, dict | list):
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value)} items"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "a very large integer"
    return _cut(repr(value), 80)


def json_depth_exceeds(raw: bytes, limit: int) -> bool:
    """True when the JSON text nests arrays/objects deeper than ``limit`` (strings are skipped)."""
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    admin: AdminServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = READ_TIMEOUT_S  # socket timeout for every read: a stalled client frees its thread

    def _read_body(self) -> tuple[int, str] | bytes:
        """The request body, or (status, reason) when it is refused. Never reads more than MAX_BODY_BYTES."""
        if self.headers.get("Transfer-Encoding"):
            return 411, "send the body with a Content-Length (chunked transfer encoding is not accepted)"
        header = self.headers.get_all("Content-Length") or []
        if len(header) > 1:
            return 400, "more than one Content-Length header"
        text = (header[0] if header else "0").strip()
        if not text.isascii() or not text.isdigit() or len(text) > 20:
            return 400, f"Content-Length must be a non-negative integer, not {_cut(repr(text), 40)}"
        length = int(text)
        if length > MAX_BODY_BYTES:
            return 413, f"the body is {length} bytes; at most {MAX_BODY_BYTES} are accepted"
        try:
            raw = self.rfile.read(length) if length else b""
        except TimeoutError:
            return 408, f"the body did not arrive within {READ_TIMEOUT_S} s"
        if len(raw) < length:
            return 400, f"the body ended after {len(raw)} of {length} bytes"
        return raw

    def _serve(self) -> None:
        url = urlsplit(self.path)
        try:
            query = {k: v[-1] for k, v in parse_qs(url.query, max_num_fields=20).items()}
        except ValueError:
            query = None
        if query is None or len(url.query) > 2048:
            self.close_connection = True
            return self._send(400, {"error": "the query has more than 20 fields or 2048 characters"})
        got = self._read_body()
        if isinstance(got, tuple):
            self.close_connection = True  # the unread rest of the body must not be parsed as a request
            return self._send(got[0], {"error": got[1]})
        raw = got
        if raw and json_depth_exceeds(raw, MAX_JSON_DEPTH):
            return self._send(400, {"error": f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels"})
        try:
            body = json.loads(raw, parse_constant=_no_constant) if raw else None
        except (ValueError, RecursionError):
            return self._send(400, {"error": "the body is not JSON (UTF-8, no NaN or Infinity)"})
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
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away; nothing to answer
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("sandbox-admin " + format, *args)
