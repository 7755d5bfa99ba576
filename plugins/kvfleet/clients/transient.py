"""One predicate for "the call got no answer": a network error or a timeout, worth retrying.

Used by ``clients.kube`` (a Kubernetes call without an answer becomes a ``TemporaryError``), by the task boundary
(``kvfleet.airflow.boundary``: an unclassified exception of that kind is retried) and by the triggers that poll
(``kvfleet.airflow.triggers.readiness``: it keeps waiting). The outcome of such a call is unknown, so the retry
observes the live state again (every stage is idempotent).

No answer: the standard library's ``ConnectionError`` (refused, reset, aborted, a broken pipe) and ``TimeoutError``;
a subprocess over its own timeout (``helm``, ``kubectl``); urllib3's protocol errors, timeouts and exhausted retries
(the official Kubernetes client); botocore's connection errors and HTTP client errors (a connection closed or a read
timing out), docs/reference/aws.md. Not transient, even when wrapped in one of those: a TLS certificate that fails
verification (``ssl.SSLCertVerificationError``) fails every retry the same way.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator

import urllib3.exceptions
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import HTTPClientError

NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError, TimeoutError, subprocess.TimeoutExpired,
    urllib3.exceptions.ProtocolError, urllib3.exceptions.MaxRetryError, urllib3.exceptions.TimeoutError,
    BotoConnectionError, HTTPClientError)
_CHAIN_LIMIT = 16  # how deep the causes of an exception are looked at


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: its ``__cause__`` and ``__context__``, urllib3's ``reason``, an exception among
    its ``args`` (urllib3's ``SSLError`` carries the ``ssl`` error there), botocore's ``error`` keyword."""
    todo, seen = [exc], set[int]()
    while todo and len(seen) < _CHAIN_LIMIT:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        kwargs = getattr(current, "kwargs", None)
        wrapped = [current.__cause__, current.__context__, getattr(current, "reason", None),
                   *current.args, *(kwargs.values() if isinstance(kwargs, dict) else ())]
        todo.extend(w for w in wrapped if isinstance(w, BaseException))


def certificate_refused(exc: BaseException) -> bool:
    """A TLS peer whose certificate failed verification, anywhere in ``exc``'s causes."""
    return any(isinstance(c, ssl.SSLCertVerificationError) for c in _causes(exc))


def is_network_error(exc: BaseException) -> bool:
    """The call got no answer (module docstring): retrying may succeed and observes again."""
    return isinstance(exc, NETWORK_ERRORS) and not certificate_refused(exc)
