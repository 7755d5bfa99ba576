"""``KubeApiServer``: the HTTP face of one emulated cluster, spoken to by kubectl, helm and the Python client.

Started by the sandbox (one per EKS cluster) and by integration tests; it serves a ``store.KubeStore`` on
127.0.0.1 (never 0.0.0.0; port 0 picks a free port). It is written on the standard library's
``ThreadingHTTPServer`` rather than aiohttp: every handler is a short synchronous call into a lock-guarded
store, streams (watch, pod proxy, SSE) are plain chunked writes from a thread, and the simulated controllers
that call into the same store are synchronous too, so an event loop would only add a thread hop.
``kmock`` was weighed and not used: it lacks label/field selectors, strategic merge patch, server-side apply and
subresources (scale, status, log, proxy), which are exactly what kvfleet exercises.

Fault injection: ``error_rate`` (0..1, a seeded random fraction of resource requests answered 500 or 503 with a
``Status`` body; discovery is spared so clients keep their REST mapping) and ``latency_s`` (added to every request).
``conflicts_left``/``drops_left`` (set through :meth:`KubeApiServer.fail_mutations`): the next N mutating requests
(create, update, patch, delete, deletecollection; dry runs spared), optionally only those on one resource, are
answered 409 ``Conflict`` or have their connection closed without an answer (a network failure mid-request).

Authentication (``auth``): a bearer token, EKS-shaped (``k8s-aws-v1.<base64url presigned STS URL>``) or one of
the sandbox's static admin tokens; anything else, including no ``Authorization`` header, is 401, as on EKS.
Authorization (``rbac``): every resource request of a user outside ``system:masters`` is checked against the
RBAC objects in the store (403 when no rule allows it), and writes of RBAC objects pass the escalation check.

Impersonation (``_Handler._impersonation``): kube-apiserver's ``WithImpersonation`` filter, which runs after
authentication and before everything else (kubernetes/apiserver ``pkg/endpoints/filters/impersonation.go``,
tag kubernetes-1.33.0, commit 9529108a5dff5a998bca0afd61510c9c0e34b2e3; facts in
tests/conformance/facts/kube_impersonation.yaml). A request with ``Impersonate-*`` headers from an authenticated
user is allowed only if that user may ``impersonate`` each thing asked for (``Authorizer.authorize_impersonation``:
403 ``Forbidden`` at the first refusal, nothing done); groups, extras or a uid without ``Impersonate-User`` is a
500 in plain text (``responsewriters.InternalError``). Allowed, the headers are removed and the request runs, and
is authorized and audited (the store's request log), as the impersonated user.

TLS: with ``tls`` set, the same port speaks HTTPS (``https_url``, what the EKS endpoint publishes) and plain
HTTP (``url``); the first byte of a connection decides (0x16 opens a TLS handshake). client-go sends a
kubeconfig's token only over TLS, so kubectl and helm must use ``https_url``; the Python client sends it either
way.
"""

from __future__ import annotations

import json
import random
import socket
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kvfleet_sandbox.kube import routing
from kvfleet_sandbox.kube.auth import (
    IMPERSONATE_EXTRA_PREFIX,
    IMPERSONATE_GROUP,
    IMPERSONATE_UID,
    IMPERSONATE_USER,
    Authenticator,
    ImpersonationError,
    UserInfo,
    impersonated_user,
    impersonation_requests,
)
from kvfleet_sandbox.kube.errors import ApiError
from kvfleet_sandbox.kube.rbac import Authorizer
from kvfleet_sandbox.kube.store import KubeStore
from kvfleet_sandbox.kube.tls import TlsMaterial

TLS_HANDSHAKE = 0x16
MUTATING_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], api: KubeApiServer) -> None:
        self.api = api
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        self.tls_context = api.tls.server_context() if api.tls is not None else None
        super().__init__(addr, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """In the connection's own thread: a TLS handshake if the client opens one, plain HTTP otherwise."""
        if self.tls_context is None:
            _Handler(request, client_address, self)
            return
        try:
            request.settimeout(30)
            first = request.recv(1, socket.MSG_PEEK)
            request.settimeout(None)
            if not first or first[0] != TLS_HANDSHAKE:
                _Handler(request, client_address, self)
                return
            tls = self.tls_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        except OSError:
            return
        # The raw socket is detached now: stop() must shut the TLS one, and it is closed here.
        with self.sockets_lock:
            self.open_sockets.add(tls)
        try:
            tls.settimeout(30)
            tls.do_handshake()
            tls.settimeout(None)
            _Handler(tls, client_address, self)
        except (OSError, ssl.SSLError):
            pass
        finally:
            with self.sockets_lock:
                self.open_sockets.discard(tls)
            try:
                tls.close()
            except OSError:
                pass

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.sockets_lock:
                self.open_sockets.discard(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as the real API server's connections have it (Go's net package sets it on every TCP connection
    # by default: pkg.go.dev/net, TCPConn.SetNoDelay, "The default is true (no delay)"). Without it, the handler's
    # two writes per response (headers, then body) meet the client's delayed ACK on a keep-alive connection: a
    # request stalls up to 40 ms, which a real API server does not add (tests/conformance/test_kube_wire.py).
    disable_nagle_algorithm = True
    server: _Server
    received = 0.0  # time.monotonic() when this request's line was read off the socket (``parse_request``)

    def log_message(self, format: str, *args: Any) -> None:
        return

    def parse_request(self) -> bool:
        """Stamp the request's arrival first thing, before headers, auth, routing or the body: the pod proxy hands
        it to the simulated pods as the moment the request reached them (``routing.Request._forward``), so the
        time a busy thread takes to get here and through the API server is not added to their modelled times."""
        self.received = time.monotonic()
        return super().parse_request()

    def _handle(self) -> None:
        api = self.server.api
        try:
            acting_as = self._impersonation(api)
            if acting_as is None:
                routing.handle(api, self)
            else:
                with api.authenticator.impersonating(self.headers.get("Authorization"), acting_as):
                    routing.handle(api, self)
        except ApiError as err:
            self.send_json(err.code, err.status())
        except ImpersonationError as err:
            # responsewriters.InternalError: http.Error's plain text, sanitized like every error message.
            text = f"Internal Server Error: {json.dumps(self.path, ensure_ascii=False)}: {err}"
            text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            self.send_bytes(500, (text + "\n").encode(), {"Content-Type": "text/plain; charset=utf-8",
                                                          "X-Content-Type-Options": "nosniff"})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _impersonation(self, api: KubeApiServer) -> UserInfo | None:
        """``WithImpersonation``: None when the request impersonates nobody or is not authenticated (routing then
        answers it, 401 for the latter, as authentication runs first); else the impersonated user, every
        ``impersonate`` check passed and the ``Impersonate-*`` headers removed. Raises ``ImpersonationError``
        (groups, extras or uid without a user) or the 403 ``ApiError`` of the first refused check; the body is
        read first so the connection stays usable."""
        requested = [(k, v) for k, v in self.headers.items() if k.lower().startswith("impersonate-")]
        if not requested:
            return None
        requester = api.authenticator.authenticate(self.headers.get("Authorization"))
        if requester is None:
            return None
        try:
            requests = impersonation_requests(requested)
            if not requests:
                return None
            api.authorizer.authorize_impersonation(requester, requests)
        except (ImpersonationError, ApiError):
            self.read_body()
            raise
        for name in [IMPERSONATE_USER, IMPERSONATE_GROUP, IMPERSONATE_UID,
                     *{k for k, _ in requested if k.lower().startswith(IMPERSONATE_EXTRA_PREFIX.lower())}]:
            del self.headers[name]
        return impersonated_user(requests)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    # --- response helpers used by routing -----------------------------------------------------------------

    def send_json(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = json.dumps(body).encode()
        self.send_bytes(code, data, {"Content-Type": content_type})

    def send_bytes(self, code: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(code)
        for k, v in headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def start_chunked(self, code: int, headers: dict[str, str]) -> None:
        self.send_response(code)
        for k, v in headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            return self.rfile.read(length)
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        return b""

    def query(self) -> tuple[str, str, dict[str, str]]:
        parsed = urllib.parse.urlsplit(self.path)
        params = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query, keep_blank_values=True).items()}
        return parsed.path, parsed.query, params


class KubeApiServer:
    """Serves one ``KubeStore`` over HTTP on ``host`` (127.0.0.1 by default; port 0 = ephemeral)."""

    def __init__(self, store: KubeStore, host: str = "127.0.0.1", port: int = 0, *,
                 tls: TlsMaterial | None = None, authenticator: Authenticator | None = None) -> None:
        if host in ("0.0.0.0", "", "::"):
            raise ValueError("the Kubernetes emulator binds to a loopback address only")
        self.store = store
        self.host = host
        self.port = port
        self.error_rate = 0.0
        self.latency_s = 0.0
        self.bookmark_interval_s = 60.0  # watch BOOKMARK frequency (the watch cache's ~1 minute); tests lower it
        self.tls = tls
        self.authenticator = authenticator or Authenticator()
        self.authorizer = Authorizer(store)
        store.add_admission(self.authorizer.admit)
        self.random = random.Random(1234)
        self.conflicts_left = 0
        self.conflict_resource: str | None = None
        self.drops_left = 0
        self.drop_resource: str | None = None
        self._fault_lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def https_url(self) -> str:
        """The TLS address (what kubectl and helm need to send a token); requires ``tls``."""
        if self.tls is None:
            raise RuntimeError("this Kubernetes emulator was started without TLS material")
        return f"https://{self.host}:{self.port}"

    def start(self) -> None:
        self.stopping.clear()
        self._httpd = _Server((self.host, self.port), self)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"kube-api-{self.store.cluster_name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, end open streams and keep-alive connections, join every thread, close the socket."""
        if self._httpd is None:
            return
        self.stopping.set()
        self.store.close_all_watches()
        # Each watch handler writes its stream's terminating chunk before the sockets are shut (a real API server
        # ends a watch cleanly on shutdown); bounded, so a handler stuck on a dead client cannot hold the stop.
        self.store.wait_streams_ended(10.0)
        self._httpd.shutdown()
        with self._httpd.sockets_lock:
            for sock in list(self._httpd.open_sockets):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._httpd = None
        self._thread = None

    def inject_fault(self) -> ApiError | None:
        if self.error_rate > 0 and self.random.random() < self.error_rate:
            code = self.random.choice([500, 503])
            reason = "InternalError" if code == 500 else "ServiceUnavailable"
            return ApiError(code, reason, f"injected fault: {reason} (sandbox error_rate={self.error_rate})")
        return None

    def fail_mutations(self, kind: str, count: int, resource: str | None = None) -> None:
        """``kind`` "conflict" (409) or "drop" (no answer): the next ``count`` mutating requests, on ``resource``
        only when given (e.g. "deployments"); count 0 clears that kind."""
        with self._fault_lock:
            if kind == "conflict":
                self.conflicts_left, self.conflict_resource = count, resource
            elif kind == "drop":
                self.drops_left, self.drop_resource = count, resource
            else:
                raise ValueError(f"unknown mutation fault {kind!r}; known: conflict, drop")

    def take_mutation_fault(self, verb: str, resource: str, dry_run: bool) -> str | None:
        """"drop", "conflict" or None for this request, spending one of the faults left."""
        if dry_run or verb not in MUTATING_VERBS:
            return None
        with self._fault_lock:
            if self.drops_left > 0 and self.drop_resource in (None, resource):
                self.drops_left -= 1
                return "drop"
            if self.conflicts_left > 0 and self.conflict_resource in (None, resource):
                self.conflicts_left -= 1
                return "conflict"
        return None
