"""A preflight check that cannot finish for a transient reason (a timeout, a dropped connection, 5xx/429/409) is
retried as a TemporaryError; it is never reported as a missing prerequisite, which would refuse the cluster for
good. A denied read (403) is a problem with its fix."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from kubernetes.client.exceptions import ApiException

from kvfleet.errors import TemporaryError
from kvfleet.stages import preflight


def _checker() -> preflight._Checker:
    ctx = SimpleNamespace(cluster=SimpleNamespace(name="c1", region="us-east-1"), memo={}, aws_conn_id=None)
    return preflight._Checker(ctx)  # type: ignore[arg-type]


def _raise(exc: BaseException):  # type: ignore[no-untyped-def]
    def fn() -> None:
        raise exc
    return fn


@pytest.mark.parametrize("exc", [
    ReadTimeoutError(endpoint_url="https://s3.amazonaws.com/b"),
    EndpointConnectionError(endpoint_url="https://iam.amazonaws.com"),
    TimeoutError("timed out"),
    ConnectionResetError("reset by peer"),
    ApiException(status=503, reason="Service Unavailable"),
    ApiException(status=429, reason="Too Many Requests"),
    ApiException(status=409, reason="Conflict"),
])
def test_a_transient_failure_is_retried_not_reported_missing(exc: BaseException) -> None:
    c = _checker()
    with pytest.raises(TemporaryError, match="could not check the TLS certificate bucket on c1"):
        c.guarded("tls_bucket", "the TLS certificate bucket", "s3:ListBucket", _raise(exc))
    assert c.problems == []


def test_a_denied_read_is_a_problem_with_its_fix() -> None:
    c = _checker()
    c.guarded("execution_role", "the operator's execution role", "iam:GetRole",
              _raise(ApiException(status=403, reason="Forbidden")))
    (p,) = c.problems
    assert p.check == "execution_role" and "403 Forbidden" in p.what and "iam:GetRole" in p.fix
