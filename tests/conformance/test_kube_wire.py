"""The twin's HTTP endpoints set TCP_NODELAY on every connection they accept, as the real ones do.

Source: the Kubernetes API server is a Go program, and Go's ``net`` package disables Nagle's algorithm on every TCP
connection it makes or accepts (pkg.go.dev/net, ``TCPConn.SetNoDelay``: "The default is true (no delay), meaning
that data is sent as soon as possible after a Write"; Go 1.x, net/tcpsock.go). AWS's endpoints are not open to
inspection: no source confirms their socket options, so for the AWS emulator this is a choice, written down here,
not a fact: no AWS endpoint is known to add the 40 ms that Nagle's algorithm adds below.

Why it matters: Python's ``BaseHTTPRequestHandler`` writes a response's headers and its body in two ``send`` calls.
On a kept-alive connection with Nagle's algorithm on, the body waits for the ACK of the headers, which the client
delays (Linux: up to 40 ms). Requests to the twin then took up to 40 ms more than on a real cluster (kubectl's
discovery showed 43-47 ms for some requests that the twin answers in 1 ms), and a ``helm upgrade`` of the Curvine
chart took 2.2 s instead of 0.5 s. The check is on the socket option itself, not on a timing.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import pytest

from kvfleet_sandbox.aws import AwsEmulator
from kvfleet_sandbox.kube import KubeApiServer, KubeStore
from kvfleet_sandbox.kube.auth import Authenticator, UserInfo
from kvfleet_sandbox.kube.tls import make_tls

TOKEN = "admin.wire"


def _nodelay(sockets: Iterable[socket.socket]) -> list[int]:
    """TCP_NODELAY of every connected socket among ``sockets`` (a TLS-wrapped one's raw socket is detached)."""
    return [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in list(sockets) if s.fileno() >= 0]


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_the_kubernetes_api_server_answers_without_nagle_delay(tls: bool) -> None:
    material = make_tls() if tls else None
    server = KubeApiServer(KubeStore("wire"), tls=material,
                           authenticator=Authenticator(static_tokens={TOKEN: UserInfo("admin", ("system:masters",))}))
    server.start()
    conn: Any
    try:
        if tls:
            assert material is not None
            context = ssl.create_default_context(cadata=material.ca_pem)
            conn = http.client.HTTPSConnection(server.host, server.port, context=context, timeout=10)
        else:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
        for _ in range(2):  # the connection is kept alive between the two
            conn.request("GET", "/api/v1/namespaces", headers={"Authorization": f"Bearer {TOKEN}"})
            response = conn.getresponse()
            assert response.status == 200 and response.getheader("Connection", "keep-alive") != "close"
            response.read()
        assert server._httpd is not None
        with server._httpd.sockets_lock:
            flags = _nodelay(server._httpd.open_sockets)
        conn.close()
    finally:
        server.stop()
    assert flags and all(flags), flags


def test_the_aws_emulator_answers_without_nagle_delay() -> None:
    emu = AwsEmulator(delay_s=0)
    emu.start()
    try:
        conn = http.client.HTTPConnection(emu.host, emu.port, timeout=10)
        for _ in range(2):
            conn.request("POST", "/", body=b"{}", headers={"X-Amz-Target": "AWSCredentialsService.Nothing",
                                                           "Content-Type": "application/x-amz-json-1.1"})
            conn.getresponse().read()
        with emu._lock:
            flags = _nodelay(emu._connections)
        conn.close()
    finally:
        emu.stop()
    assert flags and all(flags), flags
