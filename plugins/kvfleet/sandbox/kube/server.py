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
Authentication: ``Authorization: Bearer k8s-aws-v1.<base64url>`` (the EKS token format); any other
``Authorization`` header is refused with 401. A request with no ``Authorization`` header at all is served as
anonymous while ``allow_anonymous`` is true (the default), because client-go (kubectl, helm) reads the kubeconfig's
credentials only for TLS transports and never sends a token to a plain-HTTP server; the Python client does send
it, so the token path is exercised there. Set ``allow_anonymous = False`` to refuse anonymous requests too.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kvfleet.sandbox.kube import routing
from kvfleet.sandbox.kube.errors import ApiError
from kvfleet.sandbox.kube.store import KubeStore


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], api: KubeApiServer) -> None:
        self.api = api
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(addr, _Handler)

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
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _handle(self) -> None:
        api = self.server.api
        try:
            routing.handle(api, self)
        except ApiError as err:
            self.send_json(err.code, err.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

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

    def __init__(self, store: KubeStore, host: str = "127.0.0.1", port: int = 0) -> None:
        if host in ("0.0.0.0", "", "::"):
            raise ValueError("the Kubernetes emulator binds to a loopback address only")
        self.store = store
        self.host = host
        self.port = port
        self.error_rate = 0.0
        self.latency_s = 0.0
        self.allow_anonymous = True
        self.random = random.Random(1234)
        self.stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
