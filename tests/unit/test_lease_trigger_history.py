"""The lease trigger waits through a history that does not answer (it polls again) and stops on one that is not
configured (waiting cannot fix that): neither escapes the trigger as an exception."""

from __future__ import annotations

import socket

import pytest

from kvfleet.airflow.triggers.events import ERROR
from kvfleet.airflow.triggers.lease import LeaseFreeTrigger


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_history_is_polled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVFLEET_HISTORY_CONNECT_TIMEOUT_S", "2")
    trigger = LeaseFreeTrigger("c1", "holder", history_url=f"postgresql://kvfleet@127.0.0.1:{_closed_port()}/kvfleet")
    assert trigger._check() == (None, "history database unreachable")


def test_no_history_configured_ends_the_wait_naming_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVFLEET_HISTORY_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_KVFLEET_HISTORY", raising=False)
    status, message = LeaseFreeTrigger("c1", "holder")._check()
    assert status == ERROR and "no history database is configured" in message
