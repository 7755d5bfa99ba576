"""How Kubernetes client failures are classified at the call site (the fault matrix's network failures)."""

from __future__ import annotations

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kvfleet.clients.kube import call, get_or_none
from kvfleet.errors import PermanentError, TemporaryError


def _raise(exc: BaseException):  # type: ignore[no-untyped-def]
    def fn(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise exc

    return fn


@pytest.mark.parametrize("exc", [urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError()),
                                 ConnectionRefusedError("refused"), TimeoutError("timed out")])
def test_a_connection_without_an_answer_is_temporary(exc: BaseException) -> None:
    with pytest.raises(TemporaryError, match="did not answer"):
        call(_raise(exc), what="patch deployment x")
    with pytest.raises(TemporaryError):
        get_or_none(_raise(exc))


def test_status_codes_keep_their_classes() -> None:
    with pytest.raises(TemporaryError):
        call(_raise(ApiException(status=409, reason="Conflict")), what="x")
    with pytest.raises(PermanentError):
        call(_raise(ApiException(status=403, reason="Forbidden")), what="x")
    assert get_or_none(_raise(ApiException(status=404, reason="Not Found"))) is None
