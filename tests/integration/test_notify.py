"""kvfleet's notifications (kvfleet.airflow.notify) against the twin's SNS emulation (moto behind the sandbox's
AWS emulator, reached by boto3 through an Airflow AWS connection) and a webhook receiver on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from kvfleet.airflow import notify
from kvfleet.airflow.notify import NotifySettings, SettingError
from kvfleet_sandbox.aws import AwsEmulator

pytestmark = pytest.mark.integration
REGION = "us-west-2"
ACCOUNT = "123456789012"
CONN = "aws_notify_test"


class Receiver:
    """A webhook receiver: records every POST; answers ``status``."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.status = 204
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.posts.append({"path": self.path, "content_type": self.headers.get("Content-Type"),
                                       "json": json.loads(body)})
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/kvfleet?token=s3cret"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def emulator() -> Iterator[AwsEmulator]:
    emu = AwsEmulator(account_id=ACCOUNT, delay_s=0.01)
    emu.start()
    yield emu
    emu.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture
def topic(emulator: AwsEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    """A topic in the emulator, and the Airflow AWS connection (from the environment) that reaches it."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", json.dumps({
        "conn_type": "aws", "login": "AKIDSANDBOX", "password": "sandbox-secret",
        "extra": {"region_name": REGION, "endpoint_url": emulator.url}}))
    sns = boto3.client("sns", endpoint_url=emulator.url, region_name=REGION, aws_access_key_id="AKIDSANDBOX",
                       aws_secret_access_key="sandbox-secret")
    arn: str = sns.create_topic(Name="kvfleet-notify")["TopicArn"]
    emulator.reset_request_log()
    return arn


def settings(topic: str = "", webhook: str = "", **kw: Any) -> NotifySettings:
    return NotifySettings(sns_topic_arn=topic, aws_conn_id=CONN, region=REGION, webhook_url=webhook,
                          timeout_s=kw.pop("timeout_s", 5.0), airflow_url="https://airflow.example.com",
                          runbook_url="https://git.example.com/kvfleet/docs/runbook.md", **kw)


def gate_context() -> dict[str, Any]:
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    task = ApprovalOperator(task_id="gate_0", subject="kvfleet rollout ml-prod-use1 wave 0 (canary): 2/2 endpoints "
                            "verified — approve the next wave? (manual 2026-12-01 10:00)",
                            body="| endpoint | verdict |\n|---|---|\n| `llm/a` | ✅ pass |\n\n{{ not a template }}")
    ti = SimpleNamespace(dag_id="kvfleet_rollout", run_id="manual__2026-12-01T10:00:00+00:00",
                         task_id="cluster.gate_0", map_index=1)
    return {"task": task, "ti": ti, "task_instance": ti}


def test_gate_waiting_reaches_sns_and_the_webhook(emulator: AwsEmulator, topic: str, receiver: Receiver) -> None:
    notifier = notify.gate_waiting_notifier(settings(topic, receiver.url))
    notifier(gate_context())  # as HITLOperator.execute calls its notifiers
    assert notifier.last_results == {"sns": "sent", "webhook": "sent"}
    (published,) = emulator.published(topic)
    assert published["Subject"].startswith("kvfleet gate waiting: kvfleet rollout ml-prod-use1 wave 0 (canary)")
    assert len(published["Subject"]) < 100
    message = json.loads(published["Message"])["default"]
    link = ("https://airflow.example.com/dags/kvfleet_rollout/runs/manual__2026-12-01T10%3A00%3A00%2B00%3A00/tasks/"
            "cluster.gate_0/mapped/1/required_actions")
    assert "| `llm/a` | ✅ pass |" in message and "Options: Approve, Reject." in message and message.endswith(link)
    assert "{{ not a template }}" in message  # the notifier renders no Jinja
    attrs = {published[f"MessageAttributes.entry.{i}.Name"]: published[f"MessageAttributes.entry.{i}.Value.StringValue"]
             for i in (1, 2, 3, 4)}
    assert attrs == {"kind": "gate_waiting", "dag_id": "kvfleet_rollout",
                     "run_id": "manual__2026-12-01T10:00:00+00:00", "task_id": "cluster.gate_0"}
    (post,) = receiver.posts
    assert post["content_type"] == "application/json" and post["path"] == "/hooks/kvfleet?token=s3cret"
    assert post["json"]["kind"] == "gate_waiting" and post["json"]["link"] == link
    assert post["json"]["subject"].startswith("kvfleet gate waiting: kvfleet rollout ml-prod-use1")


@pytest.mark.parametrize("status", ["failed", "completed_with_failures"])
def test_a_run_ending_red_is_notified(emulator: AwsEmulator, topic: str, receiver: Receiver, status: str) -> None:
    run = {"dag_id": "kvfleet_rollout", "run_id": "scheduled__2026-12-01T00:00:00+00:00", "status": status,
           "summary": {"reason": "task failed (cluster.wave_1)", "failed": 2}}
    event = notify.run_end_event(run, settings(topic))
    assert event is not None
    assert notify.send(event, settings(topic, receiver.url)) == {"sns": "sent", "webhook": "sent"}
    (published,) = emulator.published(topic)
    assert published["Subject"] == f"kvfleet kvfleet_rollout: run {status}"
    message = json.loads(published["Message"])["default"]
    assert f"ended **{status}**" in message and "Reason: task failed (cluster.wave_1)" in message
    assert "https://airflow.example.com/kvfleet/runs?dag_id=kvfleet_rollout" in message
    assert "docs/runbook.md#1-first-rollout-to-a-new-cluster" in message
    assert receiver.posts[0]["json"]["attributes"]["status"] == status


@pytest.mark.parametrize("status", ["success", "running", "aborted"])
def test_other_run_endings_are_not_notified(status: str) -> None:
    assert notify.run_end_event({"dag_id": "d", "run_id": "r", "status": status}, settings("x")) is None


def test_drift_found_is_notified_and_a_quiet_check_is_not(emulator: AwsEmulator, topic: str,
                                                          receiver: Receiver) -> None:
    quiet = {"cluster": "ml-prod-use1", "reachable": True, "findings": [], "sync": {"opened": 0}, "remediations": []}
    assert notify.notify_drift(quiet, "kvfleet_drift_check/r1", settings(topic, receiver.url)) == {}
    found = {**quiet, "sync": {"opened": 1, "still_open": 0, "resolved": 0},
             "findings": [{"kind": "operator_paused", "severity": "high", "object_ref": "deploy/hp-operator",
                           "field": "spec.replicas", "expected": "1", "actual": "0"}],
             "remediations": [{"action": "restore operator", "outcome": "refused",
                               "detail": {"reason": "a rollout holds the lease"}}]}
    assert notify.notify_drift(found, "kvfleet_drift_check/r2", settings(topic, receiver.url)) == {
        "sns": "sent", "webhook": "sent"}
    (published,) = emulator.published(topic)
    assert published["Subject"] == "kvfleet drift on ml-prod-use1: 1 new finding(s), 1 remediation(s) refused or failed"
    message = json.loads(published["Message"])["default"]
    assert "high operator_paused deploy/hp-operator spec.replicas: expected '1', found '0'" in message
    assert "remediation restore operator refused: a rollout holds the lease" in message
    (post,) = receiver.posts
    assert post["json"]["link"] == "https://airflow.example.com/kvfleet/drift?cluster=ml-prod-use1"


def test_failures_are_logged_never_raised_and_not_retried(emulator: AwsEmulator, topic: str, receiver: Receiver,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    event = notify.Event("run_ended", "kvfleet test", "body")
    receiver.status = 500
    emulator.error_rate = 1.0
    try:
        results = notify.send(event, settings(topic, receiver.url))
    finally:
        emulator.error_rate = 0.0
    assert results["sns"].startswith("failed: ") and results["webhook"] == "failed: HTTPError"
    assert len(emulator.published(topic)) == 2  # botocore standard mode, total_max_attempts=2: no retry storm
    assert len(receiver.posts) == 1  # the webhook gets one attempt
    assert "s3cret" not in caplog.text and "the run goes on" in caplog.text  # the webhook's secret is not logged
    gone = Receiver()
    gone.stop()  # nothing listens on its port any more
    assert notify.send(event, settings(webhook=gone.url)) == {"webhook": "failed: URLError"}


def test_nothing_configured_sends_nothing() -> None:
    notifier = notify.gate_waiting_notifier(NotifySettings())
    notifier(gate_context())
    assert notifier.last_results == {}


@pytest.mark.parametrize(("env", "names"), [
    ({"KVFLEET_NOTIFY_SNS_TOPIC_ARN": "kvfleet-topic"}, ["KVFLEET_NOTIFY_SNS_TOPIC_ARN", "'kvfleet-topic'", "arn:"]),
    ({"KVFLEET_NOTIFY_WEBHOOK_URL": "ftp://host/x?token=s3cret"}, ["KVFLEET_NOTIFY_WEBHOOK_URL", "https://"]),
    ({"KVFLEET_NOTIFY_TIMEOUT_S": "600"}, ["KVFLEET_NOTIFY_TIMEOUT_S", "'600'", "from 1 to 60"]),
])
def test_bad_settings_name_the_variable_value_and_range(env: dict[str, str], names: list[str]) -> None:
    with pytest.raises(SettingError) as info:
        NotifySettings.from_env(env)
    for name in names:
        assert name in str(info.value)
    assert "s3cret" not in str(info.value)


def test_settings_from_env() -> None:
    s = NotifySettings.from_env({"KVFLEET_NOTIFY_SNS_TOPIC_ARN": "arn:aws:sns:eu-west-1:123456789012:kvfleet",
                                 "KVFLEET_NOTIFY_WEBHOOK_URL": "https://hooks.example.com/x",
                                 "KVFLEET_AIRFLOW_URL": "https://airflow.example.com/"})
    assert (s.region, s.aws_conn_id, s.timeout_s, s.enabled) == ("eu-west-1", "aws_default", 5.0, True)
    assert s.links.view("fleet") == "https://airflow.example.com/kvfleet/fleet"
    assert not NotifySettings.from_env({"KVFLEET_AIRFLOW_URL": "x"}).enabled


def test_a_bad_setting_turns_notifications_off_without_failing(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("KVFLEET_NOTIFY_WEBHOOK_URL", "not a url")
    notifier = notify.gate_waiting_notifier()
    notifier(gate_context())
    assert notifier.last_results == {} and "notifications are off: KVFLEET_NOTIFY_WEBHOOK_URL" in caplog.text


@pytest.mark.parametrize("airflow_state", ["failed", "success"])
def test_run_end_notifier_reads_the_status_the_run_status_callback_wrote(history: Any, receiver: Receiver,
                                                                          airflow_state: str) -> None:
    """As wired in a DAG: ``on_failure_callback=[callbacks.on_dag_failure, notify.run_end_notifier()]``."""
    from kvfleet.airflow import run_status
    from kvfleet.history.repo import StepEvent, StepKey

    run_id = f"manual__2026-12-01T10:00:00+00:00-{airflow_state}"
    rk = f"kvfleet_rollout/{run_id}"
    history.start_run(rk, dag_id="kvfleet_rollout", run_id=run_id, trigger="manual", triggered_by="alice", params={})
    history.record_step(StepKey(rk, "cluster.wave_0", 0), StepEvent("endpoint:llm/a", "endpoint", "changed",
                                                                    cluster="c1", endpoint="llm/a"))
    if airflow_state == "failed":
        history.record_step(StepKey(rk, "cluster.wave_1", 0), StepEvent("error:cluster.wave_1", "run", "failed",
                                                                        detail={"error": "TemporaryError: boom"}))
    from airflow.sdk import DAG

    context = {"dag": DAG("kvfleet_rollout", schedule=None), "run_id": run_id, "reason": "task_failure"}
    closed = (run_status.on_dag_failure if airflow_state == "failed" else run_status.on_dag_success)(context)
    notifier = notify.run_end_notifier(settings(webhook=receiver.url))
    notifier(context)
    recorded = history.run(rk)["status"]
    assert closed == recorded
    if recorded in notify.RUN_END_STATUSES:
        (post,) = receiver.posts
        assert post["json"]["attributes"] == {"kind": "run_ended", "dag_id": "kvfleet_rollout", "run_id": run_id,
                                              "status": recorded}
        assert notifier.last_results == {"webhook": "sent"}
    else:
        assert recorded == "success" and receiver.posts == [] and notifier.last_results == {}
    assert airflow_state == "success" or recorded in notify.RUN_END_STATUSES


def test_wave_evidence_is_read_from_the_history_for_this_run_and_cluster(history: Any) -> None:
    from datetime import UTC, datetime

    from kvfleet.airflow.gates import load_wave_evidence
    from kvfleet.history.repo import StepKey

    def verify(rk: str, cluster: str, endpoint: str, verdict: str, speedup: float) -> None:
        history.record_verification(StepKey(rk, "cluster.wave_0", 0), f"verify:0:{cluster}:{endpoint}", {
            "cluster": cluster, "endpoint": endpoint, "lob": "retail", "hit_ratio": 1.0, "speedup": speedup,
            "expected_speedup": 2.7, "verdict": verdict})

    rk, other = "kvfleet_rollout/r-evidence", "kvfleet_hit_verification/r-hourly"
    for key in (rk, other):
        history.start_run(key, dag_id=key.split("/")[0], run_id=key.split("/")[1], trigger="manual",
                          triggered_by=None, params={})
    verify(rk, "c1", "llm/a", "pass", 2.6)
    verify(rk, "c1", "llm/b", "degraded", 1.1)
    verify(rk, "c2", "llm/a", "fail", 0.9)  # same endpoint name on another cluster
    verify(other, "c1", "llm/a", "fail", 0.5)  # another run
    history.sync_findings("c1", [{"fingerprint": "fp-1", "kind": "operator_paused", "severity": "high",
                                  "object_ref": "Deployment op"}], rk)
    history.sync_findings("c2", [{"fingerprint": "fp-2", "kind": "pvc_unbound", "severity": "high",
                                  "object_ref": "PVC x"}], rk)
    rows, drift = load_wave_evidence(history, rk, "c1", ["llm/a", "llm/b"])
    assert sorted((r["endpoint"], r["verdict"]) for r in rows) == [("llm/a", "pass"), ("llm/b", "degraded")]
    assert [d["kind"] for d in drift] == ["operator_paused"]
    assert all(r["at"] <= datetime.now(UTC) for r in rows)


def test_wave_gate_text_from_the_history_and_without_it(history: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy import create_engine

    from kvfleet.airflow import gates
    from kvfleet.history.repo import History, StepKey

    monkeypatch.setenv("KVFLEET_AIRFLOW_URL", "https://airflow.example.com")
    rk = "kvfleet_rollout/r-text"
    history.start_run(rk, dag_id="kvfleet_rollout", run_id="r-text", trigger="manual", triggered_by=None, params={})
    history.record_verification(StepKey(rk, "cluster.wave_1", 0), "verify:1:llm/a", {
        "cluster": "c9", "endpoint": "llm/a", "lob": "retail", "hit_ratio": 1.0, "speedup": 1.5,
        "expected_speedup": 2.7, "verdict": "degraded", "diagnosis": "slow"})
    history.sync_findings("c9", [{"fingerprint": "fp-c9", "kind": "stale_pods", "severity": "medium",
                                  "object_ref": "Deployment llm/a"}], rk)
    wave = {"cluster": "c9", "waves": [1], "review": ["llm/a"], "endpoints": {"llm/a": "degraded — slow"}}
    text = gates.for_wave_gate(asked="ask_review", run_key=rk, wave=wave, reason="verification inconclusive",
                               params={"speedup_tolerance": 0.1}, slot=1, history=history)
    assert text.subject.startswith("kvfleet rollout c9 wave 1: 1 of 1 endpoints inconclusive, 1 open drift")
    assert "| `llm/a` | retail | ⚠ degraded | 1.00 | 1.50× ⬇ | 2.43× | 2.70× | slow |" in text.body
    assert "| stale_pods | medium | Deployment llm/a |" in text.body
    assert "https://airflow.example.com/kvfleet/fleet?cluster=c9" in text.body
    down = History(create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"))  # nothing listens on port 1
    fallback = gates.for_wave_gate(asked="ask_review", run_key=rk, wave=wave, reason="verification inconclusive",
                                   params={}, slot=1, history=down)
    assert "the history could not be read: OperationalError" in fallback.body
    assert "| `llm/a` | – | ⚠ degraded | – |" in fallback.body  # the wave's own summary still shows
    approval = gates.for_curvine_approval(run_key="kvfleet_curvine_upgrade/r1", params={"version": "0.3.3"},
                                          preflight=[{"cluster": "c9", "outcome": "planned"}], history=history)
    assert "stale_pods" in approval.body and approval.subject.startswith("kvfleet Curvine upgrade to 0.3.3 on c9")
