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
