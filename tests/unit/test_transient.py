"""One predicate for "the call got no answer" (``kvfleet.clients.transient.is_network_error``), shared by the
Kubernetes client, the task boundary and the polling triggers: what it counts, what it does not (a certificate
that fails verification, bad input), and that the three places agree."""

from __future__ import annotations

import ssl
import subprocess

import pytest
import urllib3
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError
from botocore.exceptions import SSLError as BotoSSLError

from kvfleet.airflow.boundary import Kind, classify
from kvfleet.airflow.triggers.readiness import worth_waiting_on
from kvfleet.clients.kube import call
from kvfleet.clients.transient import certificate_refused, is_network_error
from kvfleet.errors import PermanentError, TemporaryError


def _cert_failure() -> urllib3.exceptions.MaxRetryError:
    """What the official client raises for a server whose certificate the CA does not sign (urllib3 2)."""
    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    return urllib3.exceptions.MaxRetryError(None, "/api", urllib3.exceptions.SSLError(verify))  # type: ignore[arg-type]


NO_ANSWER = [
    ConnectionRefusedError("refused"), ConnectionResetError("reset"), TimeoutError("timed out"),
    subprocess.TimeoutExpired(["helm", "upgrade"], 300),
    urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError()),
    urllib3.exceptions.MaxRetryError(None, "/api", urllib3.exceptions.NewConnectionError(None, "refused")),  # type: ignore[arg-type]
    urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"),  # type: ignore[arg-type]
    EndpointConnectionError(endpoint_url="https://sagemaker.us-east-1.amazonaws.com"),
    ConnectionClosedError(endpoint_url="https://eks.us-east-1.amazonaws.com"),
    ReadTimeoutError(endpoint_url="https://eks.us-east-1.amazonaws.com"),
]
ANSWERED_OR_BAD = [
    _cert_failure(), ValueError("bad input"), KeyError("x"), FileNotFoundError("fleet.yaml"),
    urllib3.exceptions.LocationParseError("http://[::1"),  # a bad URL: every retry fails the same way
    PermanentError("refused"),
]


@pytest.mark.parametrize("exc", NO_ANSWER, ids=lambda e: type(e).__name__)
def test_a_call_without_an_answer_is_a_network_error_everywhere(exc: BaseException) -> None:
    assert is_network_error(exc)
    assert classify(exc, "t").kind == Kind.TEMPORARY  # the task boundary retries it
    assert worth_waiting_on(exc)  # the readiness triggers wait on
    with pytest.raises(TemporaryError, match="did not answer"):  # the Kubernetes client makes it temporary
        call(_raising(exc), what="list pods")


@pytest.mark.parametrize("exc", ANSWERED_OR_BAD, ids=lambda e: type(e).__name__)
def test_a_certificate_that_fails_verification_or_bad_input_is_not(exc: BaseException) -> None:
    assert not is_network_error(exc)
    assert not worth_waiting_on(exc)
    assert classify(exc, "t").kind != Kind.TEMPORARY


def test_a_certificate_failure_is_found_however_it_is_wrapped() -> None:
    assert certificate_refused(_cert_failure())
    with pytest.raises(PermanentError, match="list pods: the Kubernetes API server's certificate failed verification"):
        call(_raising(_cert_failure()), what="list pods")  # permanent: every retry fails the same way
    try:  # botocore raises its SSLError while handling urllib3's: the ssl error is in its context
        try:
            raise _cert_failure().reason  # type: ignore[misc]
        except urllib3.exceptions.SSLError as inner:
            raise BotoSSLError(endpoint_url="https://sts.amazonaws.com", error=inner) from None
    except BotoSSLError as exc:
        assert certificate_refused(exc) and not is_network_error(exc)
    assert not certificate_refused(ConnectionResetError("reset"))


def test_a_temporary_error_is_worth_waiting_on_without_being_a_network_error() -> None:
    exc = TemporaryError("throttled", delay=3)
    assert worth_waiting_on(exc) and not is_network_error(exc)


def _raising(exc: BaseException):  # type: ignore[no-untyped-def]
    def fn(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise exc

    return fn
