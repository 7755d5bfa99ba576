"""The gates' notifier that the DAG files wire in (``kvfleet.airflow.callbacks.GateWaitingNotifier``): it imports
``kvfleet.airflow.notify`` only when a gate starts waiting, then sends what ``notify.gate_waiting_notifier()``
sends (a webhook receiver on 127.0.0.1 here), and never raises."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvfleet.airflow import callbacks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from webhook_receiver import Receiver  # tests/support, shared with tests/integration/test_notify.py


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    r = Receiver()
    for name in ("KVFLEET_NOTIFY_SNS_TOPIC_ARN", "KVFLEET_NOTIFY_GLOBAL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KVFLEET_NOTIFY_WEBHOOK_URL", r.url)
    monkeypatch.setenv("KVFLEET_AIRFLOW_URL", "https://airflow.example.com")
    yield r
    r.stop()


def gate_context() -> dict[str, Any]:
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    task = ApprovalOperator(task_id="gate_0", subject="kvfleet rollout ml-prod-use1 wave 0 (canary): approve?",
                            body="| endpoint | verdict |\n|---|---|\n| `llm/a` | ✅ pass |")
    ti = SimpleNamespace(dag_id="kvfleet_rollout", run_id="manual__2026-12-01T10:00:00+00:00",
                         task_id="cluster.gate_0", map_index=1)
    return {"task": task, "ti": ti, "task_instance": ti}


def test_the_lazy_gate_notifier_sends_what_notify_sends(receiver: Receiver) -> None:
    notifier = callbacks.gate_waiting_notifier()
    notifier(gate_context())  # as HITLOperator.execute calls its notifiers
    assert notifier.last_results == {"webhook": "sent"}
    (post,) = receiver.posts
    assert "kvfleet rollout ml-prod-use1 wave 0 (canary)" in json.dumps(post["json"])
    assert "kvfleet.airflow.notify" in sys.modules


def test_the_lazy_gate_notifier_never_raises_when_notify_cannot_be_imported(
        receiver: Receiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import kvfleet.airflow

    monkeypatch.delattr(kvfleet.airflow, "notify", raising=False)
    monkeypatch.setitem(sys.modules, "kvfleet.airflow.notify", None)  # makes the import fail
    notifier = callbacks.gate_waiting_notifier()
    with caplog.at_level(logging.ERROR, logger="kvfleet.airflow.callbacks"):
        notifier(gate_context())
    assert notifier.last_results == {} and receiver.posts == []
    assert "could not import kvfleet.airflow.notify" in caplog.text
