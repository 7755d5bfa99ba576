"""kvfleet's Kubernetes client talks to an API server only over TLS verified with the cluster's CA, since it sends
a bearer token: a cluster that reports no CA (or an endpoint that is not https://) is refused before any token is
made, and a server whose certificate that CA does not sign is a permanent error, not an unverified request and
not an endless retry. Against the twin's API server (``kvfleet_sandbox.kube``), which serves TLS."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from kvfleet.clients.kube import ClusterAccess, call
from kvfleet.errors import PermanentError
from kvfleet_sandbox.kube import KubeApiServer, KubeStore
from kvfleet_sandbox.kube.auth import Authenticator, UserInfo
from kvfleet_sandbox.kube.tls import TlsMaterial, make_tls

pytestmark = pytest.mark.integration
TOKEN = "admin.tls"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[KubeApiServer, TlsMaterial]]:
    material = make_tls()
    server = KubeApiServer(KubeStore("tls"), tls=material,
                           authenticator=Authenticator(static_tokens={TOKEN: UserInfo("admin", ("system:masters",))}))
    server.start()
    try:
        yield server, material
    finally:
        server.stop()


def _b64(pem: str) -> str:
    return base64.b64encode(pem.encode()).decode()


class _Tokens:
    """Counts the tokens made: a refused cluster must get none."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self) -> str:
        self.made += 1
        return TOKEN


@pytest.mark.parametrize("ca_data", [None, "", "not base64 !", _b64("no certificate here")],
                         ids=["none", "empty", "not-base64", "not-pem"])
def test_a_cluster_without_a_usable_ca_is_refused_naming_it_before_a_token_is_made(
        served: tuple[KubeApiServer, Any], ca_data: str | None) -> None:
    server, _ = served
    tokens = _Tokens()
    with pytest.raises(PermanentError, match="HyperPod cluster ml-prod-use1 .EKS cluster eks-prod.") as info:
        ClusterAccess(eks_name="eks-prod", endpoint=server.https_url, ca_data=ca_data, token_source=tokens,
                      what="HyperPod cluster ml-prod-use1 (EKS cluster eks-prod)")
    assert "certificate" in str(info.value) and "token" in str(info.value)
    assert tokens.made == 0
    with pytest.raises(PermanentError, match="EKS cluster eks-prod"):  # named by its EKS name by default
        ClusterAccess(eks_name="eks-prod", endpoint=server.https_url, ca_data=None, token_source=tokens)


def test_an_endpoint_that_is_not_https_is_refused(served: tuple[KubeApiServer, TlsMaterial]) -> None:
    server, material = served
    tokens = _Tokens()
    with pytest.raises(PermanentError, match=r"eks-prod: the API server endpoint 'http://.*' is not https://"):
        ClusterAccess(eks_name="eks-prod", endpoint=server.url, ca_data=_b64(material.ca_pem), token_source=tokens)
    assert tokens.made == 0


def test_the_clusters_ca_verifies_the_server_and_another_ca_is_a_permanent_error(
        served: tuple[KubeApiServer, TlsMaterial]) -> None:
    server, material = served
    access = ClusterAccess(eks_name="eks-prod", endpoint=server.https_url, ca_data=_b64(material.ca_pem),
                           token_source=_Tokens())
    try:
        assert access.api_client.configuration.verify_ssl is True
        names = [n.metadata.name for n in call(access.core.list_namespace, what="list namespaces").items]
        assert "default" in names
        kubeconfig = access.kubeconfig()["clusters"][0]["cluster"]
        assert kubeconfig["certificate-authority-data"] == _b64(material.ca_pem)  # helm and kubectl verify too
    finally:
        access.close()
    stranger = ClusterAccess(eks_name="eks-prod", endpoint=server.https_url, ca_data=_b64(make_tls().ca_pem),
                             token_source=_Tokens())
    try:
        with pytest.raises(PermanentError, match="certificate failed verification"):
            call(stranger.core.list_namespace, what="list namespaces", _request_timeout=10)
    finally:
        stranger.close()


class _ConnectProxy:
    """An HTTP CONNECT proxy on 127.0.0.1 that counts the tunnels it opens and relays their bytes."""

    def __init__(self) -> None:
        import socket
        import threading

        self.tunnels: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import threading

        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._tunnel, args=(conn,), daemon=True).start()

    def _tunnel(self, conn: Any) -> None:
        import select
        import socket

        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                conn.close()
                return
            head += chunk
        target = head.split(b" ")[1].decode()
        self.tunnels.append(target)
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        pair = {conn: upstream, upstream: conn}
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select(list(pair), [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    pair[s].sendall(data)
        finally:
            conn.close()
            upstream.close()

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=5)


@pytest.mark.parametrize("no_proxy", [None, "127.0.0.1"])
def test_the_kubernetes_client_takes_the_proxy_helm_and_kubectl_take(
        served: tuple[KubeApiServer, Any], monkeypatch: pytest.MonkeyPatch, no_proxy: str | None) -> None:
    """HTTPS_PROXY for an https API server, NO_PROXY honoured, HTTP_PROXY not used (Go's ProxyFromEnvironment,
    which helm and kubectl follow); the Kubernetes Python client on its own would take HTTP_PROXY."""
    server, material = served
    proxy = _ConnectProxy()
    try:
        for name in ("https_proxy", "http_proxy", "no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens: taking it would fail the call
        if no_proxy:
            monkeypatch.setenv("NO_PROXY", no_proxy)
        access = ClusterAccess(eks_name="eks-prod", endpoint=server.https_url, ca_data=_b64(material.ca_pem),
                               token_source=lambda: TOKEN)
        try:
            call(access.core.list_namespace, what="list namespaces")
        finally:
            access.close()
        port = server.https_url.rsplit(":", 1)[1]
        assert proxy.tunnels == ([] if no_proxy else [f"127.0.0.1:{port}"])
    finally:
        proxy.stop()


class _StaleFirst:
    """The first token is one the server no longer takes (it expired on the way); every later one is good."""

    def __init__(self, good: str = TOKEN) -> None:
        self.made, self.good = 0, good

    def __call__(self) -> str:
        self.made += 1
        return "expired.on-the-way" if self.made == 1 else self.good


def test_a_request_answered_401_is_sent_once_more_with_a_fresh_token(
        served: tuple[KubeApiServer, TlsMaterial]) -> None:
    """A token lives no longer than the credentials that signed it, so under load one can expire between its
    making and the server's check: the server answers 401 and applies nothing, and the client sends the request
    once more with a token made then (a read and a write alike), as client-go does. A token the server still
    refuses is a permanent error after that one try, not a loop."""
    server, material = served
    tokens = _StaleFirst()
    access = ClusterAccess(eks_name="eks-prod", endpoint=server.https_url, ca_data=_b64(material.ca_pem),
                           token_source=tokens)
    try:
        assert "default" in [n.metadata.name for n in call(access.core.list_namespace, what="list").items]
        assert tokens.made == 2
        created = call(access.core.create_namespace, {"metadata": {"name": "renewed-token"}}, what="create")
        assert created.metadata.name == "renewed-token" and tokens.made == 2  # the fresh token is kept
    finally:
        access.close()
    refused = ClusterAccess(eks_name="eks-prod", endpoint=server.https_url, ca_data=_b64(material.ca_pem),
                            token_source=_StaleFirst(good="still.not.known"))
    try:
        with pytest.raises(PermanentError, match="401"):
            call(refused.core.list_namespace, what="list namespaces")
    finally:
        refused.close()
