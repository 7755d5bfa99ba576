"""Gate decisions are queryable, and `kvfleet gate` goes through Airflow's REST API, on one
kvfleet_rollout run under dag.test() against the twin, with a real `airflow api-server` on 127.0.0.1 sharing the
test session's Airflow metadata database (SimpleAuthManager, two users with known passwords):

- the canary's approval gate is answered Approve by alice with a bare ``PATCH .../hitlDetails`` (bearer token
  from ``POST /auth/token``), found through ``GET /api/v2/dags/~/dagRuns/~/hitlDetails``;
- the next gate is listed with `kvfleet gate list --json` and answered Reject with `kvfleet gate respond` as bob
  (AIRFLOW_API_URL, AIRFLOW_API_USER, AIRFLOW_API_PASSWORD): the CLI never touches Airflow's database;
- the run ends aborted in the history (Airflow: failed), and `kvfleet audit gates --json` names alice and bob;
- the inventory is edited while the canary's gate waits (alpha-docs' replicas changed, alpha-rag deleted): the
  later waves apply the inventory the run pinned when it planned (alpha-docs keeps 2 replicas, alpha-rag is
  marked aborted, no KeyError), and `kvfleet audit runs --json` shows that inventory's digest.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.fleet import constants as C
from kvfleet.fleet.inventory import InventoryWarning
from kvfleet.fleet.pinning import pin

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
KUBECTL = Path(__file__).resolve().parents[3] / ".tools" / "bin" / "kubectl"
# dag_test: the triggering user of a run started by dag.test() (airflow.sdk's DAG.test), a user here so that it
# can try to answer its own run's gate
USERS = {"alice": "alice-pw-7Qx", "bob": "bob-pw-9Lm", "dag_test": "dag-test-pw-3Kv"}
JWT_SECRET = "kvfleet-gate-rest-test-" + "0123456789abcdef" * 3
# One kyverno-mode cluster, one LOB, three endpoints, wave size 1: canary [chat] -> gate_0 -> [docs] -> gate_1 ->
# [rag]. Kyverno mode needs no operator pause, so the waves are quick.
FLEET = """
settings: {wave_size: 1}
lobs: [{name: alpha}]
clusters:
  - name: c-kyverno
    region: us-west-2
    gpu_nodes: {count: 6, instance_type: ml.g5.4xlarge}
    l2_injection: kyverno
    addons:  # the operator's role and TLS bucket, which the rollout's preflight checks (the twin creates both)
      amazon-sagemaker-hyperpod-inference:
        configuration:
          executionRoleArn: arn:aws:iam::123456789012:role/hyperpod-inference-exec
          tlsCertificateS3Bucket: hyperpod-tls-c-kyverno
    curvine: {worker: {replicas: 2, size: 100Gi}}
endpoints:
  - {name: alpha-chat, namespace: alpha, lob: alpha, cluster: c-kyverno, model: qwen2-7b, instance_type: ml.g5.4xlarge}
  - {name: alpha-docs, namespace: alpha, lob: alpha, cluster: c-kyverno, model: qwen2-7b, instance_type: ml.g5.4xlarge}
  - {name: alpha-rag, namespace: alpha, lob: alpha, cluster: c-kyverno, model: qwen2-7b, instance_type: ml.g5.4xlarge}
"""


@pytest.fixture
def small_fleet(tmp_path: Path) -> Path:
    """Overrides the conftest's fleet: the sandbox_process fixture starts the twin from this one."""
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def api_server(airflow_db: bool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `airflow api-server` on 127.0.0.1 on the session's metadata database (its own process group,
    stopped by its PID afterwards)."""
    tmp = tmp_path_factory.mktemp("gate-api-server")
    passwords = tmp / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    port = _free_port()
    env = {**os.environ,
           "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager."
                                          "SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:user" for u in USERS),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
           "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET,
           "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port),
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/"}
    log = (tmp / "api-server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--host", "127.0.0.1", "--port",
                             str(port), "--workers", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (tmp / "api-server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "api-server did not answer in 240 s"
                time.sleep(1)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def rest(base: str, method: str, path: str, body: dict[str, Any] | None = None, token: str | None = None) -> Any:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(base + path, method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def kvfleet(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvfleet.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def edited(fleet: str) -> str:
    """The fleet as a platform team changes it while the canary's gate waits: alpha-docs gets 4 replicas (the 2
    GPUs alpha-rag frees), and alpha-rag is deleted."""
    doc = yaml.safe_load(fleet)
    doc["endpoints"] = [{**e, "replicas": 4} if e["name"] == "alpha-docs" else e for e in doc["endpoints"]
                        if e["name"] != "alpha-rag"]
    return yaml.safe_dump(doc)


class Responder(threading.Thread):
    """Answers the run's two approval gates as they come: gate_0 by a bare REST PATCH as alice, after editing the
    inventory file (``edited``), gate_1 with the kvfleet CLI as bob. Records what it saw for the test's
    assertions."""

    def __init__(self, base: str, fleet: Path) -> None:
        super().__init__(daemon=True)
        self.base, self.fleet, self.done = base, fleet, threading.Event()
        self.seen: dict[str, Any] = {}
        self.alice = rest(base, "POST", "/auth/token", {"username": "alice", "password": USERS["alice"]})[
            "access_token"]
        # the CLI as a user runs it: no Airflow settings at all, only the API's URL and bob's credentials
        self.cli_env = {**{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
                        "AIRFLOW_API_URL": base, "AIRFLOW_API_USER": "bob", "AIRFLOW_API_PASSWORD": USERS["bob"]}

    def run(self) -> None:
        while not self.done.wait(0.5) and len(self.seen) < 2:
            try:
                self.answer_pending()
            except Exception as exc:  # reported through self.seen, asserted by the test
                self.seen.setdefault("errors", []).append(repr(exc))

    def answer_pending(self) -> None:
        listing = rest(self.base, "GET", "/api/v2/dags/~/dagRuns/~/hitlDetails?response_received=false",
                       token=self.alice)
        for d in listing["hitl_details"]:
            ti = d["task_instance"]
            if ti["state"] != "awaiting_input" or ti["task_id"] in self.seen:
                continue
            if ti["task_id"] == "cluster.gate_0":
                self.fleet.write_text(edited(self.fleet.read_text()))
                path = (f"/api/v2/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}/"
                        f"{ti['map_index']}/hitlDetails")
                self.seen[ti["task_id"]] = rest(self.base, "PATCH", path,
                                                {"chosen_options": ["Approve"], "params_input": {}}, self.alice)
            elif ti["task_id"] == "cluster.gate_1":
                listed = kvfleet("gate", "list", "--json", env=self.cli_env)
                answered = kvfleet("gate", "respond", "--index", "0", "--option", "Reject", env=self.cli_env)
                self.seen[ti["task_id"]] = {"list": listed, "respond": answered}


def test_gates_answered_through_the_rest_api_are_audited_with_the_users_names(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, api_server) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InventoryWarning)
        planned = pin(small_fleet)  # what the plan task pins: the file before the edit
    responder = Responder(api_server, small_fleet)
    responder.start()
    try:
        dr = dagbag.get_dag("kvfleet_rollout").test(run_conf={
            "fleet": str(small_fleet), "lobs": [], "clusters": [], "endpoints": [], "dry_run": False,
            "wave_size": 1, "max_parallel_clusters": 4, "canary": True, "bake_minutes": 0, "gate": "none",
            "approval": "every_wave", "remediate_drift": False, "prompt_tokens": 2000,
            "lock_wait_minutes": 10})
    finally:
        responder.done.set()
        responder.join(timeout=30)
    seen = responder.seen
    assert "errors" not in seen, seen.get("errors")
    assert seen["cluster.gate_0"]["responded_by"]["name"] == "alice", seen
    listed, answered = seen["cluster.gate_1"]["list"], seen["cluster.gate_1"]["respond"]
    assert listed.returncode == 0, listed.stderr
    (pending,) = json.loads(listed.stdout)  # JSON alone on stdout
    assert pending["task_id"] == "cluster.gate_1" and pending["options"] == ["Approve", "Reject"], pending
    assert answered.returncode == 0 and "as bob" in answered.stdout, (answered.stdout, answered.stderr)

    # Airflow: failed (the finish task raises on an abort); the history: aborted, never running or success
    assert dr.state == "failed"
    run_key = f"kvfleet_rollout/{dr.run_id}"
    run = history.runs.get(run_key)
    assert run is not None and run["status"] == "aborted", run
    outcomes = {(s["endpoint"], s["outcome"]) for s in history.runs.steps(run_key) if s["endpoint"]}
    assert ("alpha/alpha-rag", "aborted") in outcomes, outcomes  # deleted from the file, still in the pinned plan

    # the pinned inventory was applied: alpha-docs has the replicas of the planned revision, not of the edit
    assert "alpha-rag" not in small_fleet.read_text()
    docs = subprocess.run([str(KUBECTL), "--context", "c-kyverno", "-n", "alpha", "get",
                           f"{C.IEC_PLURAL}.{C.IEC_GROUP}", "alpha-docs", "-o", "jsonpath={.spec.replicas}"],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert (docs.returncode, docs.stdout) == (0, "2"), docs.stderr
    runs = kvfleet("audit", "runs", "--json", env=dict(os.environ))
    assert runs.returncode == 0, runs.stderr
    (row,) = [r for r in json.loads(runs.stdout) if r["run_key"] == run_key]
    assert row["inventory_sha256"] == planned.sha256 and row["inventory_commit"] is None, row

    proc = kvfleet("audit", "gates", "--run", run_key, "--json", env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    decisions = {g["gate"]: g for g in json.loads(proc.stdout)}
    assert (decisions["cluster.gate_0"]["chosen"], decisions["cluster.gate_0"]["answered_by"],
            decisions["cluster.gate_0"]["decision"]) == ("Approve", "alice", "continue"), decisions
    assert (decisions["cluster.gate_1"]["chosen"], decisions["cluster.gate_1"]["answered_by"],
            decisions["cluster.gate_1"]["decision"]) == ("Reject", "bob", "abort"), decisions
    assert not decisions["cluster.gate_0"]["timed_out"] and decisions["cluster.gate_0"]["waited_s"] is not None


# ---- four eyes and assigned responders (lobs[].policy) --------------------------------------------------------


def _policy_fleet(path: Path, policy: dict[str, Any]) -> None:
    """The small fleet with two endpoints (a canary, then one wave) and ``policy`` on its one LOB."""
    doc = yaml.safe_load(FLEET)
    doc["lobs"] = [{"name": "alpha", "policy": policy}]
    doc["endpoints"] = doc["endpoints"][:2]
    path.write_text(yaml.safe_dump(doc))


def _patch(base: str, user: str, ti: dict[str, Any], option: str) -> tuple[int, Any]:
    token = rest(base, "POST", "/auth/token", {"username": user, "password": USERS[user]})["access_token"]
    path = (f"/api/v2/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}/"
            f"{ti['map_index']}/hitlDetails")
    try:
        return 200, rest(base, "PATCH", path, {"chosen_options": [option], "params_input": {}}, token)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class Tries(threading.Thread):
    """Answers the canary's gate by each (user, option) in turn, recording Airflow's answer to each."""

    def __init__(self, base: str, tries: list[tuple[str, str]]) -> None:
        super().__init__(daemon=True)
        self.base, self.tries, self.done = base, tries, threading.Event()
        self.seen: list[tuple[str, int, Any]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.done.wait(0.5) and not self.seen:
            try:
                token = rest(self.base, "POST", "/auth/token", {"username": "alice", "password": USERS["alice"]})[
                    "access_token"]
                listing = rest(self.base, "GET", "/api/v2/dags/~/dagRuns/~/hitlDetails?response_received=false",
                               token=token)
                for d in listing["hitl_details"]:
                    if d["task_instance"]["state"] == "awaiting_input" and not self.seen:
                        self.seen = [(user, *_patch(self.base, user, d["task_instance"], option))
                                     for user, option in self.tries]
                        self.seen.append(("assigned", 0, d.get("assigned_users")))
            except Exception as exc:  # reported through self.errors, asserted by the test
                self.errors.append(repr(exc))


def _run(dagbag: Any, base: str, fleet: Path, tries: list[tuple[str, str]]) -> tuple[Any, Tries]:
    answering = Tries(base, tries)
    answering.start()
    try:
        dr = dagbag.get_dag("kvfleet_rollout").test(run_conf={
            "fleet": str(fleet), "dry_run": False, "wave_size": 1, "canary": True, "bake_minutes": 0, "gate": "none",
            "approval": "after_canary", "remediate_drift": False, "prompt_tokens": 2000, "lock_wait_minutes": 10})
    finally:
        answering.done.set()
        answering.join(timeout=30)
    assert not answering.errors, answering.errors
    return dr, answering


def test_only_an_assigned_responder_other_than_the_trigger_answers(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, api_server) -> None:
    """lobs.alpha.policy: four eyes, responders dag_test and alice. The run is triggered by dag_test: Airflow's REST
    API refuses (403) an answer from dag_test (it triggered the run) and from bob (not a responder), and takes
    alice's; the run goes on and succeeds."""
    _policy_fleet(small_fleet, {"approval": "after_canary", "four_eyes": True, "responders": ["dag_test", "alice"]})
    dr, answering = _run(dagbag, api_server, small_fleet,
                         [("dag_test", "Approve"), ("bob", "Approve"), ("alice", "Approve")])
    (_, own, said), (_, other, said_other), (_, by_alice, answer), (_, _, assigned) = answering.seen
    assert (own, other, by_alice) == (403, 403, 200), answering.seen
    assert "User=dag_test (id=dag_test) is not a respondent" in said and "User=bob" in said_other
    assert answer["responded_by"]["name"] == "alice" and assigned == [{"id": "alice", "name": "alice"}]
    assert dr.state == "success"
    run_key = f"kvfleet_rollout/{dr.run_id}"
    assert history.runs.get(run_key)["status"] == "success"
    [gate] = [s for s in history.runs.steps(run_key) if s["step"].startswith("gate_response:")]
    assert (gate["detail"]["responded_by"]["name"], gate["outcome"], gate["detail"]["chosen"]) == (
        "alice", "continue", "Approve"), gate


def test_under_four_eyes_the_triggers_own_answer_does_not_count(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, api_server) -> None:
    """lobs.alpha.policy: four eyes, no responders named. Airflow lets anyone answer, dag_test (who triggered the
    run) approves, and kvfleet does not count it: the gate takes its safe default (Reject), the later wave is not
    rolled, and the history says why."""
    _policy_fleet(small_fleet, {"approval": "after_canary", "four_eyes": True})
    dr, answering = _run(dagbag, api_server, small_fleet, [("dag_test", "Approve")])
    assert answering.seen[0][1] == 200 and not answering.seen[1][2], answering.seen  # no one assigned
    assert dr.state == "failed"
    run_key = f"kvfleet_rollout/{dr.run_id}"
    assert history.runs.get(run_key)["status"] == "aborted"
    [gate] = [s for s in history.runs.steps(run_key) if s["step"].startswith("gate_response:")]
    assert (gate["detail"]["responded_by"]["name"], gate["outcome"], gate["detail"]["chosen"]) == (
        "dag_test", "abort", "Reject"), gate
    assert gate["detail"]["refused"].startswith("dag_test triggered this run and answered its gate, and four eyes "
                                                "apply"), gate
    outcomes = {(s["endpoint"], s["outcome"]) for s in history.runs.steps(run_key) if s["endpoint"]}
    assert ("alpha/alpha-docs", "aborted") in outcomes, outcomes


# ---- the emergency stop of a run waiting at a gate ------------------------------------------------------------


def test_kvfleet_stop_ends_a_run_waiting_at_a_gate(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, api_server) -> None:
    """`kvfleet stop --run R` while R waits at its canary's approval: with Airflow's REST API configured, the CLI
    answers the gate with its safe option (Reject) as its API user; the gate sees the stop, no later wave starts,
    the later endpoint is recorded stopped and the run ends stopped (not aborted)."""
    _policy_fleet(small_fleet, {})
    cli_env = {**os.environ, "AIRFLOW_API_URL": api_server, "AIRFLOW_API_USER": "bob",
               "AIRFLOW_API_PASSWORD": USERS["bob"], "KVFLEET_USER": "oncall"}
    cli_env.pop("AIRFLOW_API_TOKEN", None)
    done, seen = threading.Event(), []

    def stop_when_waiting() -> None:
        from kvfleet.airflow import hitl

        while not done.wait(0.3) and not seen:
            for gate in hitl.pending():
                seen.append(kvfleet("stop", "--run", f"{gate.dag_id}/{gate.run_id}", "--reason", "INC-9: bad image",
                                    "--fleet", str(small_fleet), env=cli_env))

    stopper = threading.Thread(target=stop_when_waiting, daemon=True)
    stopper.start()
    try:
        dr = dagbag.get_dag("kvfleet_rollout").test(run_conf={
            "fleet": str(small_fleet), "dry_run": False, "wave_size": 1, "canary": True, "bake_minutes": 0,
            "gate": "none", "approval": "after_canary", "remediate_drift": False, "prompt_tokens": 2000,
            "lock_wait_minutes": 10})
    finally:
        done.set()
        stopper.join(timeout=60)
    [stopped] = seen
    assert stopped.returncode == 0 and "answered Reject on kvfleet_rollout/" in stopped.stdout, (
        stopped.stdout, stopped.stderr)
    run_key = f"kvfleet_rollout/{dr.run_id}"
    run = history.runs.get(run_key)
    assert run["status"] == "stopped" and "INC-9: bad image" in (run["reason"] or ""), run
    outcomes = {(s["endpoint"], s["outcome"]) for s in history.runs.steps(run_key) if s["endpoint"]}
    assert outcomes == {("alpha/alpha-chat", "changed"), ("alpha/alpha-docs", "stopped")}, outcomes
    [gate] = [s for s in history.runs.steps(run_key) if s["step"].startswith("gate_response:")]
    assert (gate["outcome"], gate["detail"]["chosen"], gate["detail"]["responded_by"]["name"]) == (
        "halt", "Reject", "bob"), gate
