"""kvfleet's notifications (kvfleet.airflow.notify) against the twin's SNS emulation (moto behind the sandbox's
AWS emulator, reached by boto3 through an Airflow AWS connection) and a webhook receiver on 127.0.0.1."""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from kvfleet.airflow import notify
from kvfleet.airflow.notify import NotifySettings
from kvfleet.settings import ConfigError
from kvfleet_sandbox.aws import AwsEmulator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from webhook_receiver import Receiver  # tests/support, shared with tests/dags/test_gate_notifier.py

pytestmark = pytest.mark.integration
REGION = "us-west-2"
ACCOUNT = "123456789012"
CONN = "aws_notify_test"


@pytest.fixture(scope="module")
def emulator() -> Iterator[AwsEmulator]:
    emu = AwsEmulator(account_id=ACCOUNT, delay_s=0.01)
    emu.start()
    yield emu
    emu.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver("/hooks/kvfleet?token=s3cret")
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


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/hooks?token=s3cret", "http://127.0.0.1:port/x",
                                 "http://[::1/x", "http://user:pw@127.0.0.1:0/x"])
def test_send_never_raises_on_a_hostile_webhook_url(url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A LOB's webhook URL reaches send() as written in the inventory: a port out of range is a failed
    destination, logged without the URL's secret, never an exception."""
    results = notify.send(notify.Event("run_ended", "kvfleet test", "body"), settings(webhook=url))
    assert list(results) == ["webhook"] and results["webhook"].startswith("failed: ")
    assert "s3cret" not in caplog.text and "pw@" not in caplog.text


class _Redirector:
    """Answers every request with a 302 to ``location``; the internal address it points at records any hit."""

    def __init__(self, location: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class _Internal:
    """The "internal address" a redirect points at: counts every request, whatever its method."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                hits.append(f"{self.command} {self.path}")
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET = do_PUT = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/latest/meta-data/"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def test_a_webhook_redirect_is_never_followed() -> None:
    internal = _Internal()
    redirector = _Redirector(internal.url)
    try:
        results = notify.send(notify.Event("run_ended", "kvfleet test", "body"), settings(webhook=redirector.url))
    finally:
        redirector.stop()
        internal.stop()
    assert results == {"webhook": "failed: RuntimeError"}
    assert internal.hits == []


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
    with pytest.raises(ConfigError) as info:
        NotifySettings.load(env)
    for name in names:
        assert name in str(info.value)
    assert "s3cret" not in str(info.value)


def test_settings_from_env() -> None:
    s = NotifySettings.load({"KVFLEET_NOTIFY_SNS_TOPIC_ARN": "arn:aws:sns:eu-west-1:123456789012:kvfleet",
                                 "KVFLEET_NOTIFY_WEBHOOK_URL": "https://hooks.example.com/x",
                                 "KVFLEET_AIRFLOW_URL": "https://airflow.example.com/"})
    assert (s.region, s.aws_conn_id, s.timeout_s, s.enabled) == ("eu-west-1", "aws_default", 5.0, True)
    assert s.links.view("fleet") == "https://airflow.example.com/kvfleet/fleet"
    assert not NotifySettings.load({"KVFLEET_AIRFLOW_URL": "https://airflow.example.com"}).enabled


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
    from kvfleet.history.keys import StepEvent, StepKey

    run_id = f"manual__2026-12-01T10:00:00+00:00-{airflow_state}"
    rk = f"kvfleet_rollout/{run_id}"
    history.runs.start(rk, dag_id="kvfleet_rollout", run_id=run_id, trigger="manual", triggered_by="alice", params={})
    history.runs.record_step(StepKey(rk, "cluster.wave_0", 0), StepEvent("endpoint:llm/a", "endpoint", "changed",
                                                                    cluster="c1", endpoint="llm/a"))
    if airflow_state == "failed":
        history.runs.record_step(StepKey(rk, "cluster.wave_1", 0), StepEvent("error:cluster.wave_1", "run", "failed",
                                                                        detail={"error": "TemporaryError: boom"}))
    from airflow.sdk import DAG

    context = {"dag": DAG("kvfleet_rollout", schedule=None), "run_id": run_id, "reason": "task_failure"}
    closed = (run_status.on_dag_failure if airflow_state == "failed" else run_status.on_dag_success)(context)
    notifier = notify.run_end_notifier(settings(webhook=receiver.url))
    notifier(context)
    recorded = history.runs.get(rk)["status"]
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
    from kvfleet.history.keys import StepKey

    def verify(rk: str, cluster: str, endpoint: str, verdict: str, speedup: float) -> None:
        history.verifications.record(StepKey(rk, "cluster.wave_0", 0), f"verify:0:{cluster}:{endpoint}", {
            "cluster": cluster, "endpoint": endpoint, "lob": "retail", "hit_ratio": 1.0, "speedup": speedup,
            "expected_speedup": 2.7, "verdict": verdict})

    rk, other = "kvfleet_rollout/r-evidence", "kvfleet_hit_verification/r-hourly"
    for key in (rk, other):
        history.runs.start(key, dag_id=key.split("/")[0], run_id=key.split("/")[1], trigger="manual",
                          triggered_by=None, params={})
    verify(rk, "c1", "llm/a", "pass", 2.6)
    verify(rk, "c1", "llm/b", "degraded", 1.1)
    verify(rk, "c2", "llm/a", "fail", 0.9)  # same endpoint name on another cluster
    verify(other, "c1", "llm/a", "fail", 0.5)  # another run
    history.drift.sync("c1", [{"fingerprint": "fp-1", "kind": "operator_paused", "severity": "high",
                                  "object_ref": "Deployment op"}], rk)
    history.drift.sync("c2", [{"fingerprint": "fp-2", "kind": "pvc_unbound", "severity": "high",
                                  "object_ref": "PVC x"}], rk)
    rows, drift = load_wave_evidence(history, rk, "c1", ["llm/a", "llm/b"])
    assert sorted((r["endpoint"], r["verdict"]) for r in rows) == [("llm/a", "pass"), ("llm/b", "degraded")]
    assert [d["kind"] for d in drift] == ["operator_paused"]
    assert all(r["at"] <= datetime.now(UTC) for r in rows)


def test_wave_gate_text_from_the_history_and_without_it(history: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy import create_engine

    from kvfleet.airflow import gates
    from kvfleet.history.keys import StepKey
    from kvfleet.history.repos import HistoryRepos

    monkeypatch.setenv("KVFLEET_AIRFLOW_URL", "https://airflow.example.com")
    rk = "kvfleet_rollout/r-text"
    history.runs.start(rk, dag_id="kvfleet_rollout", run_id="r-text", trigger="manual", triggered_by=None, params={})
    history.verifications.record(StepKey(rk, "cluster.wave_1", 0), "verify:1:llm/a", {
        "cluster": "c9", "endpoint": "llm/a", "lob": "retail", "hit_ratio": 1.0, "speedup": 1.5,
        "expected_speedup": 2.7, "verdict": "degraded", "diagnosis": "slow"})
    history.drift.sync("c9", [{"fingerprint": "fp-c9", "kind": "stale_pods", "severity": "medium",
                                  "object_ref": "Deployment llm/a"}], rk)
    wave = {"cluster": "c9", "waves": [1], "review": ["llm/a"], "endpoints": {"llm/a": "degraded — slow"}}
    text = gates.for_wave_gate(asked="ask_review", run_key=rk, wave=wave, reason="verification inconclusive",
                               params={"speedup_tolerance": 0.1}, slot=1, history=history)
    assert text.subject.startswith("kvfleet rollout c9 wave 1: 1 of 1 endpoints inconclusive, 1 open drift")
    assert "| `llm/a` | retail | ⚠ degraded | 1.00 | 1.50× ⬇ | 2.43× | 2.70× | slow |" in text.body
    assert "| stale_pods | medium | Deployment llm/a |" in text.body
    assert "https://airflow.example.com/kvfleet/fleet?cluster=c9" in text.body
    down = HistoryRepos.on(create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"))  # nothing listens on port 1
    fallback = gates.for_wave_gate(asked="ask_review", run_key=rk, wave=wave, reason="verification inconclusive",
                                   params={}, slot=1, history=down)
    assert "the history could not be read: OperationalError" in fallback.body
    assert "| `llm/a` | – | ⚠ degraded | – |" in fallback.body  # the wave's own summary still shows
    approval = gates.for_curvine_approval(run_key="kvfleet_curvine_upgrade/r1", params={"version": "0.3.3"},
                                          preflight=[{"cluster": "c9", "outcome": "planned"}], history=history)
    assert "stale_pods" in approval.body and approval.subject.startswith("kvfleet Curvine upgrade to 0.3.3 on c9")


# ---- routing per LOB (the inventory's lobs[].notify) -----------------------------------------------------------

ROUTED_FLEET = """
settings: {webhook_private_ranges: [127.0.0.1/32]}  # the receiver listens on loopback
lobs:
  - {name: retail, notify: {webhook_url: "%(retail_url)s"}}
  - {name: support}
  - {name: search, notify: {sns_topic_arn: "%(search_topic)s"}}
clusters:
  - name: c-patch
    region: us-east-1
    gpu_nodes: {count: 6, instance_type: ml.g5.4xlarge}
    l2_injection: patch
  - name: c-search
    region: us-west-2
    gpu_nodes: {count: 2, instance_type: ml.g5.4xlarge}
    l2_injection: patch
endpoints:
  - {name: retail-chat, namespace: retail, lob: retail, cluster: c-patch, model: qwen2-7b, instance_type: ml.g5.4xlarge}
  - {name: support-rag, namespace: support, lob: support, cluster: c-patch, model: qwen2-7b, instance_type: ml.g5.4xlarge}
  - {name: search-rag, namespace: search, lob: search, cluster: c-search, model: qwen2-7b, instance_type: ml.g5.4xlarge}
"""


@pytest.fixture
def lob_receiver() -> Iterator[Receiver]:
    r = Receiver("/hooks/kvfleet?token=s3cret")
    yield r
    r.stop()


@pytest.fixture
def routed_fleet(tmp_path: Any, lob_receiver: Receiver, topic: str, emulator: AwsEmulator) -> Any:
    """An inventory whose retail LOB has its own webhook and whose search LOB has its own SNS topic (the
    emulator's second topic); support names none. Returns (path, search topic ARN)."""
    sns = boto3.client("sns", endpoint_url=emulator.url, region_name=REGION, aws_access_key_id="AKIDSANDBOX",
                       aws_secret_access_key="sandbox-secret")
    search_topic = sns.create_topic(Name="kvfleet-search")["TopicArn"]
    path = tmp_path / "fleet.yaml"
    path.write_text(ROUTED_FLEET % {"retail_url": lob_receiver.url.replace("/hooks/kvfleet", "/hooks/retail"),
                                    "search_topic": search_topic})
    return SimpleNamespace(path=path, search_topic=search_topic)


def test_route_sends_each_lob_to_its_own_destinations_and_falls_back_to_the_global_ones(
        routed_fleet: Any, topic: str, receiver: Receiver, lob_receiver: Receiver) -> None:
    from kvfleet.fleet.inventory import load_inventory

    inv = load_inventory(routed_fleet.path)
    s = settings(topic, receiver.url)
    labels = lambda lobs: sorted((d.label, d.sns_topic_arn, d.webhook_url) for d in notify.route(s, lobs, inv))  # noqa: E731
    retail_url = lob_receiver.url.replace("/hooks/kvfleet", "/hooks/retail")
    assert labels({"retail"}) == [("retail", "", retail_url)]  # its own webhook only
    assert labels({"support"}) == [("", topic, receiver.url)]  # names none: the global destinations
    assert labels({"retail", "support"}) == [("", topic, receiver.url), ("retail", "", retail_url)]
    assert labels(set()) == [("", topic, receiver.url)]  # concerns no LOB
    assert labels({"search"}) == [("search", routed_fleet.search_topic, "")]
    (search,) = notify.route(s, {"search"}, inv)
    assert search.region == REGION and search.aws_conn_id == CONN  # the LOB topic's own region, the same connection
    always = replace(s, global_always=True)
    assert [d.label for d in notify.route(always, {"retail"}, inv)] == ["", "retail"]
    assert notify.route(NotifySettings(), {"support"}, inv) == []  # nothing global, support names nothing
    assert [d.label for d in notify.route(s, {"retail"}, None)] == [""]  # no inventory read: the global ones


def _pinned(path: Any) -> Any:
    """The inventory at ``path`` as a run's first task pins it (routing reads the run's snapshot, not the file)."""
    from kvfleet.fleet.inventory import InventoryWarning
    from kvfleet.fleet.pinning import pin

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InventoryWarning)
        return pin(path)


@pytest.fixture
def gate_run(history: Any, routed_fleet: Any) -> Any:
    """The run of ``gate_context``, opened with the routed fleet pinned; the file is emptied afterwards, so a
    notification that read the file instead of the snapshot would route nowhere."""
    ti = gate_context()["ti"]
    history.runs.start(f"{ti.dag_id}/{ti.run_id}", dag_id=ti.dag_id, run_id=ti.run_id, trigger="manual",
                       triggered_by="ann", params={"fleet": str(routed_fleet.path)},
                       inventory=_pinned(routed_fleet.path))
    routed_fleet.path.write_text("lobs: []\n")
    return history


def test_gate_waiting_goes_to_the_lob_of_its_wave(routed_fleet: Any, emulator: AwsEmulator, topic: str,
                                                  receiver: Receiver, lob_receiver: Receiver, gate_run: Any) -> None:
    context = gate_context()
    context["task"].wave_task_id = "cluster.wave_0"
    wave = {"cluster": "c-patch", "waves": [0], "endpoints": {"retail/retail-chat": "pass"}}
    pulls: list[Any] = []
    context["ti"].xcom_pull = lambda **kw: pulls.append(kw) or wave
    context["params"] = {"fleet": str(routed_fleet.path)}
    notifier = notify.gate_waiting_notifier(settings(topic, receiver.url))
    notifier(context)
    assert pulls == [{"task_ids": "cluster.wave_0", "map_indexes": 1}]
    assert notifier.last_lobs == {"retail"} and notifier.last_results == {"webhook[retail]": "sent"}
    assert receiver.posts == [] and emulator.published(topic) == []  # retail names its own: not the global ones
    (post,) = lob_receiver.posts
    assert post["path"] == "/hooks/retail?token=s3cret" and post["json"]["kind"] == "gate_waiting"
    assert post["json"]["attributes"]["lobs"] == "retail"


def test_curvine_approval_goes_to_every_lob_on_its_clusters(routed_fleet: Any, emulator: AwsEmulator, topic: str,
                                                            receiver: Receiver, lob_receiver: Receiver,
                                                            gate_run: Any) -> None:
    context = gate_context()  # an ApprovalOperator without a wave: the Curvine upgrade's approval
    context["params"] = {"fleet": str(routed_fleet.path), "clusters": ["c-patch"]}
    notifier = notify.gate_waiting_notifier(settings(topic, receiver.url))
    notifier(context)
    assert notifier.last_lobs == {"retail", "support"}
    assert notifier.last_results == {"sns": "sent", "webhook": "sent", "webhook[retail]": "sent"}
    assert len(lob_receiver.posts) == 1 and len(receiver.posts) == 1 and len(emulator.published(topic)) == 1
    assert emulator.published(routed_fleet.search_topic) == []  # search has no endpoint on c-patch


def test_a_red_run_goes_to_the_lobs_of_its_scope(routed_fleet: Any, emulator: AwsEmulator, topic: str,
                                                 receiver: Receiver, history: Any) -> None:
    run_id = "manual__2026-12-01T11:00:00+00:00"
    rk = f"kvfleet_rollout/{run_id}"
    params = {"fleet": str(routed_fleet.path), "lobs": ["search"]}
    history.runs.start(rk, dag_id="kvfleet_rollout", run_id=run_id, trigger="manual", triggered_by="bob",
                      params=params, inventory=_pinned(routed_fleet.path))
    history.runs.end(rk, "failed", {"reason": "task failed (cluster.wave_0)"})
    from airflow.sdk import DAG

    notifier = notify.run_end_notifier(settings(topic, receiver.url))
    notifier({"dag": DAG("kvfleet_rollout", schedule=None), "run_id": run_id, "params": params})
    assert notifier.last_lobs == {"search"} and notifier.last_results == {"sns[search]": "sent"}
    (published,) = emulator.published(routed_fleet.search_topic)
    assert published["Subject"] == "kvfleet kvfleet_rollout: run failed"
    assert emulator.published(topic) == [] and receiver.posts == []


def _drift_run(history: Any, fleet: Any, name: str) -> str:
    rk = f"kvfleet_drift_check/{name}"
    history.runs.start(rk, dag_id="kvfleet_drift_check", run_id=name, trigger="scheduled", triggered_by=None,
                      params={"fleet": str(fleet), "remediate": True}, inventory=_pinned(fleet))
    return rk


def test_a_curvine_data_loss_is_named_and_goes_to_every_lob_of_the_cluster(
        routed_fleet: Any, emulator: AwsEmulator, topic: str, receiver: Receiver, lob_receiver: Receiver,
        history: Any) -> None:
    rk = _drift_run(history, routed_fleet.path, "scheduled__loss")
    old = {"fingerprint": "fp-stale", "kind": "stale_pods", "severity": "medium", "cluster": "c-patch",
           "lob": "retail", "endpoint": "retail/retail-chat", "object_ref": "Deployment/retail/retail-chat",
           "field": "pods", "expected": "0", "actual": "1"}
    history.drift.sync("c-patch", [old], "kvfleet_drift_check/earlier")
    loss = {"fingerprint": "fp-loss", "kind": "curvine_data_loss", "severity": "critical", "cluster": "c-patch",
            "lob": None, "endpoint": None, "object_ref": "curvine/master", "field": "files_total",
            "expected": ">= 1200 (the last snapshot)", "actual": "300"}
    sync = history.drift.sync("c-patch", [old, loss], rk)
    result = {"cluster": "c-patch", "reachable": True, "findings": [old, loss], "sync": sync, "remediations": []}
    assert notify.notify_drift(result, rk, settings(topic, receiver.url)) == {
        "sns": "sent", "webhook": "sent", "webhook[retail]": "sent"}  # support has none: the global ones
    (published,) = emulator.published(topic)
    assert published["Subject"] == "kvfleet drift on c-patch: 1 new finding(s) (curvine_data_loss)"
    message = json.loads(published["Message"])["default"]
    assert "New in this check: curvine_data_loss (critical)." in message
    assert "critical curvine_data_loss curvine/master files_total: expected '>= 1200 (the last snapshot)', " \
           "found '300'" in message
    attrs = {published[f"MessageAttributes.entry.{i}.Name"]: published[f"MessageAttributes.entry.{i}.Value.StringValue"]
             for i in range(1, 6)}
    assert attrs["severity"] == "critical" and attrs["lobs"] == "retail,support"
    assert lob_receiver.posts[0]["json"]["subject"] == published["Subject"]


def test_an_operator_paused_past_its_threshold_is_named_and_a_refused_remediation_alone_is_notified(
        routed_fleet: Any, emulator: AwsEmulator, topic: str, receiver: Receiver, history: Any) -> None:
    """The drift rule reports a kvfleet pause only past ``operator_pause_threshold_minutes`` (fleet.drift); the
    check that opens that finding notifies, naming it; a later check that only had its restore refused notifies
    too, with the refusal's reason."""
    rk = _drift_run(history, routed_fleet.path, "scheduled__paused")
    paused = {"fingerprint": "fp-paused", "kind": "operator_paused", "severity": "high", "cluster": "c-search",
              "lob": None, "endpoint": None, "object_ref": "Deployment/hyperpod-inference-system/hp-operator",
              "field": "spec.replicas", "expected": ">= 1 (paused at most 30 min, and only by a live run)",
              "actual": "0 (paused by kvfleet_rollout/r1 for 95 min)"}
    sync = history.drift.sync("c-search", [paused], rk)
    result = {"cluster": "c-search", "reachable": True, "findings": [paused], "sync": sync, "remediations": []}
    assert notify.notify_drift(result, rk, settings(topic, receiver.url)) == {"sns[search]": "sent"}
    (published,) = emulator.published(routed_fleet.search_topic)
    assert published["Subject"] == "kvfleet drift on c-search: 1 new finding(s) (operator_paused)"
    assert "paused by kvfleet_rollout/r1 for 95 min" in json.loads(published["Message"])["default"]

    rk2 = _drift_run(history, routed_fleet.path, "scheduled__paused-2")
    sync2 = history.drift.sync("c-search", [paused], rk2)
    assert sync2["opened"] == 0
    refused = {"action": "restore_operator", "outcome": "refused", "findings": ["fp-paused"],
               "detail": {"reason": "not paused by kvfleet: no kvfleet.io/paused-by annotation"}}
    result2 = {**result, "sync": sync2, "remediations": [refused]}
    assert notify.notify_drift(result2, rk2, settings(topic, receiver.url)) == {"sns[search]": "sent"}
    second = emulator.published(routed_fleet.search_topic)[1]
    assert second["Subject"] == "kvfleet drift on c-search: 1 remediation(s) refused or failed"
    assert "remediation restore_operator refused: not paused by kvfleet" in json.loads(second["Message"])["default"]
    assert emulator.published(topic) == [] and receiver.posts == []


def test_global_always_copies_every_routed_event(routed_fleet: Any, emulator: AwsEmulator, topic: str,
                                                 receiver: Receiver) -> None:
    env = {"KVFLEET_NOTIFY_WEBHOOK_URL": receiver.url, "KVFLEET_NOTIFY_GLOBAL": "always"}
    assert NotifySettings.load(env).global_always
    with pytest.raises(ConfigError, match="KVFLEET_NOTIFY_GLOBAL='sometimes': .*allowed: fallback or always"):
        NotifySettings.load({**env, "KVFLEET_NOTIFY_GLOBAL": "sometimes"})
    from kvfleet.fleet.inventory import load_inventory

    event = notify.Event("run_ended", "kvfleet test", "body")
    results = notify.send_routed(event, replace(settings(topic, receiver.url), global_always=True), {"search"},
                                 load_inventory(routed_fleet.path))
    assert results == {"sns": "sent", "webhook": "sent", "sns[search]": "sent"}


def test_a_drift_notification_names_one_of_two_ml_prod_and_only_its_findings(
        emulator: AwsEmulator, topic: str, receiver: Receiver, history: Any) -> None:
    """Two accounts' ml-prod, each with a finding its own check opened: each notification names its cluster by key,
    lists its own finding only, and links the page filtered by that key."""
    from urllib.parse import quote

    fleet = Path(__file__).resolve().parents[1] / "fleets" / "multi-account.yaml"
    keys = {"retail": "111111111111/us-east-1/ml-prod", "payments": "222222222222/us-east-1/ml-prod"}
    results = {}
    for lob, key in keys.items():
        rk = _drift_run(history, fleet, f"scheduled__{lob}")
        finding = {"fingerprint": f"fp-{lob}", "kind": "operator_paused", "severity": "high", "cluster": key,
                   "lob": None, "endpoint": None, "object_ref": f"Deployment/{lob}-operator",
                   "field": "spec.replicas", "expected": "1", "actual": "0"}
        sync = history.drift.sync(key, [finding], rk)
        results[lob] = ({"cluster": key, "reachable": True, "findings": [finding], "sync": sync,
                         "remediations": []}, rk)
    for result, rk in results.values():
        assert notify.notify_drift(result, rk, settings(topic, receiver.url))["sns"] == "sent"
    published = emulator.published(topic)
    assert [p["Subject"] for p in published] == [
        f"kvfleet drift on {key}: 1 new finding(s) (operator_paused)" for key in keys.values()]
    for (lob, key), p, post in zip(keys.items(), published, receiver.posts, strict=True):
        other = "payments" if lob == "retail" else "retail"
        message = json.loads(p["Message"])["default"]
        assert f"Deployment/{lob}-operator" in message and f"Deployment/{other}-operator" not in message
        assert post["json"]["link"] == f"https://airflow.example.com/kvfleet/drift?cluster={quote(key, safe='')}"
