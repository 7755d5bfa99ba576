"""kvfleet.clients.aws reuses a boto3 client only while everything that configures it is the same, and EKS tokens
made on one shared STS client from several threads each carry their own cluster's header."""

from __future__ import annotations

import base64
import threading
from typing import Any

import boto3
import pytest

from kvfleet.clients import aws
from kvfleet.clients.aws import EKS_CLUSTER_HEADER
from kvfleet.clients.kube import eks_token


@pytest.fixture(autouse=True)
def no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's own credential chain (aws_conn_id None), static keys (tests/conftest.py drops the reused clients
    after every test)."""
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_a_client_is_reused_for_the_same_service_region_connection_and_environment() -> None:
    first = aws.client("sts", "us-east-1", None)
    assert aws.client("sts", "us-east-1", None) is first
    assert aws.client("sts", "us-west-2", None) is not first
    assert aws.client("eks", "us-east-1", None) is not first


def test_a_changed_endpoint_or_connection_in_the_environment_builds_a_new_client(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    first = aws.client("sts", "us-east-1", None)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    moved = aws.client("sts", "us-east-1", None)
    assert moved is not first
    assert moved.meta.endpoint_url == "http://127.0.0.1:9"
    monkeypatch.setenv("AIRFLOW_CONN_OTHER", '{"conn_type": "aws"}')
    assert aws.client("sts", "us-east-1", None) is not moved


def test_an_old_client_or_one_built_before_a_fork_is_not_reused() -> None:
    first = aws.client("sts", "us-east-1", None)
    [(key, (at, built))] = aws._clients.items()
    aws._clients[key] = (at - aws.REUSE_S - 1, built)  # as if built REUSE_S + 1 seconds earlier
    second = aws.client("sts", "us-east-1", None)
    assert second is not first
    [key] = aws._clients
    aws._clients[(*key[:3], -1, *key[4:])] = aws._clients.pop(key)  # as if built by the parent of a fork
    assert aws.client("sts", "us-east-1", None) is not second
    assert all(k[3] != -1 for k in aws._clients)  # and the parent's is dropped


def test_the_reused_clients_are_bounded_and_the_oldest_goes_first(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(aws, "MAX_CLIENTS", 3)
    for i in range(5):
        aws.client("sts", f"region-{i}", None)
    assert sorted(k[1] for k in aws._clients) == ["region-2", "region-3", "region-4"]


def test_tokens_made_at_once_on_one_shared_client_each_sign_their_own_cluster() -> None:
    """The cluster header reaches the request through the STS client's event hooks, which the threads share.
    Hooks before and after kvfleet's hold each thread until all three are there (a barrier, not a sleep): every
    token is made while the other two threads' tokens are under way, in the same hook, on every round. Each
    signed request must still carry only its own thread's cluster."""
    sts = boto3.client("sts", region_name="us-east-1")
    seen: list[tuple[str, str]] = []
    failures: list[BaseException] = []
    clusters = ("cluster-a", "cluster-b", "cluster-c")
    before, after = threading.Barrier(len(clusters), timeout=60), threading.Barrier(len(clusters), timeout=60)

    def all_before(request: Any, **_: Any) -> None:  # registered first, so it runs before kvfleet's hook
        before.wait()  # every thread has set its cluster and none has had the header added yet

    def all_after(request: Any, **_: Any) -> None:  # after kvfleet's hook
        after.wait()  # every thread's header was added: none is signed before the others' are in
        seen.append((threading.current_thread().name, request.headers[EKS_CLUSTER_HEADER]))

    def tokens(cluster: str) -> None:
        try:
            for _ in range(15):
                eks_token(sts, cluster)
        except BaseException as exc:  # a broken barrier included: named by the assertion below
            failures.append(exc)
            before.abort()
            after.abort()

    sts.meta.events.register_first("before-sign.sts.GetCallerIdentity", all_before)
    sts.meta.events.register("before-sign.sts.GetCallerIdentity", all_after)
    threads = [threading.Thread(target=tokens, args=(c,), name=c) for c in clusters]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert len(seen) == 45
    assert [(name, header) for name, header in seen if name != header] == []


def test_the_cluster_header_is_added_to_kvfleets_tokens_only() -> None:
    """The hook stays on the shared client: another presigned GetCallerIdentity made on it carries no cluster."""
    from urllib.parse import parse_qs, urlsplit

    sts = boto3.client("sts", region_name="us-east-1")

    def signed_headers(url: str) -> str:
        return parse_qs(urlsplit(url).query)["X-Amz-SignedHeaders"][0]

    token = eks_token(sts, "cluster-a")
    url = base64.urlsafe_b64decode(token.removeprefix("k8s-aws-v1.") + "==").decode()
    assert EKS_CLUSTER_HEADER in signed_headers(url).split(";")
    other = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=60, HttpMethod="GET")
    assert EKS_CLUSTER_HEADER not in signed_headers(other).split(";")


def test_a_reused_sts_client_has_the_cluster_header_hook_before_it_is_shared() -> None:
    """Registered when the client is built, not on first use: a thread signing on the shared client cannot race
    the registration (botocore's handler cache could then keep a list without the hook)."""
    from urllib.parse import parse_qs, urlsplit

    sts = aws.client("sts", "us-east-1", None)
    with aws.signing_for_eks("cluster-b"):  # not through eks_token: the hook is there already
        url = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=60, HttpMethod="GET")
    assert EKS_CLUSTER_HEADER in parse_qs(urlsplit(url).query)["X-Amz-SignedHeaders"][0].split(";")


def test_botocore_s_refresh_windows_are_the_attributes_kvfleet_scales() -> None:
    """kvfleet.clients.aws._assumed sets RefreshableCredentials' refresh windows on a DeferredRefreshableCredentials
    (which does not pass advisory_timeout / mandatory_timeout on): the attributes those arguments set, in the
    botocore it was written against."""
    import botocore
    from botocore.credentials import DeferredRefreshableCredentials, RefreshableCredentials

    assert botocore.__version__ == "1.44.8"
    made = RefreshableCredentials("a", "b", None, None, lambda: {}, "m", advisory_timeout=11, mandatory_timeout=7)
    assert (made._advisory_refresh_timeout, made._mandatory_refresh_timeout) == (11, 7)
    deferred = DeferredRefreshableCredentials(refresh_using=lambda: {}, method="m")
    deferred._advisory_refresh_timeout, deferred._mandatory_refresh_timeout = 225, 150
    assert deferred.refresh_needed(deferred._advisory_refresh_timeout)  # no credentials yet: fetched at first use
