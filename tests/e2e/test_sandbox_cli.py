"""`kvfleet sandbox up|status|down` as a user runs them: a detached sandbox that real kubectl and boto3 reach
through the files it writes, and a `down` that leaves no process and no listening port."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from kvfleet.fleet.inventory import load_inventory
from kvfleet_sandbox.runtime import port_refuses

pytestmark = [pytest.mark.e2e, pytest.mark.process]

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "tests" / "fleets" / "twin.yaml"


def kvfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvfleet.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def read_env(path: Path) -> dict[str, str]:
    pairs = [shlex.split(line)[1] for line in path.read_text().splitlines() if line.startswith("export ")]
    return dict(pair.split("=", 1) for pair in pairs)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def test_up_status_down(tmp_path: Path) -> None:
    state = tmp_path / "sandbox"
    inventory = load_inventory(FLEET)
    try:
        up = kvfleet("sandbox", "up", "--fleet", str(FLEET), "--state-dir", str(state))
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"source {state / 'env'}" in up.stdout
        assert str(state / "kubeconfig") in up.stdout
        pid = int((state / "sandbox.pid").read_text())
        assert (state / "ready").exists()
        ports = json.loads((state / "ports.json").read_text())["ports"]
        env = read_env(state / "env")

        for cluster in inventory.clusters:
            got = subprocess.run(["bash", "-c", f"source {state / 'env'} && kubectl --context {cluster.name} "
                                  "get nodes -o name"], capture_output=True, text=True, timeout=30)
            assert got.returncode == 0, got.stderr
            assert len(got.stdout.split()) == cluster.gpu_nodes.count
            sagemaker = boto3.client("sagemaker", region_name=cluster.region, endpoint_url=env["AWS_ENDPOINT_URL"],
                                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
            described = sagemaker.describe_cluster(ClusterName=cluster.name)
            assert described["Orchestrator"]["Eks"]["ClusterArn"].endswith(f":cluster/{cluster.name}-eks")

        again = kvfleet("sandbox", "up", "--state-dir", str(state))
        assert again.returncode == 0 and "already running" in again.stdout

        status = kvfleet("sandbox", "status", "--state-dir", str(state), "--json")
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["running"] and report["answering"] and report["pid"] == pid
        assert set(report["clusters"]) == {c.name for c in inventory.clusters}
        text = kvfleet("sandbox", "status", "--state-dir", str(state))
        assert f"pid {pid}" in text.stdout and "ml-prod-use1" in text.stdout
    finally:
        down = kvfleet("sandbox", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stdout + down.stderr
    assert gone(pid)
    assert all(port_refuses(p) for p in ports)
    assert not (state / "sandbox.pid").exists() and not (state / "ready").exists()
    stopped = kvfleet("sandbox", "status", "--state-dir", str(state))
    assert stopped.returncode == 3 and "not running" in stopped.stdout
    assert kvfleet("sandbox", "down", "--state-dir", str(state)).returncode == 0  # idempotent


def test_up_fails_fast_on_a_broken_inventory(tmp_path: Path) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text(FLEET.read_text().replace("memory_percent: 25", "memory_percent: 15"))
    proc = kvfleet("sandbox", "up", "--fleet", str(bad), "--state-dir", str(tmp_path / "sb"))
    assert proc.returncode == 2
    assert "memory_percent: 15 is below 20" in proc.stderr
    assert not (tmp_path / "sb" / "sandbox.pid").exists()


def test_foreground_stops_on_sigterm(tmp_path: Path) -> None:
    state = tmp_path / "fg"
    proc = subprocess.Popen([sys.executable, "-m", "kvfleet.cli", "sandbox", "up", "--foreground",
                             "--fleet", str(FLEET), "--state-dir", str(state)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (state / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (state / "ready").exists()
        assert int((state / "sandbox.pid").read_text()) == proc.pid
        ports = json.loads((state / "ports.json").read_text())["ports"]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "Ctrl-C stops it" in out and "sandbox stopped" in out
    assert all(port_refuses(p) for p in ports)
    assert not (state / "ready").exists()


def test_down_refuses_to_signal_a_process_that_is_not_the_sandbox(tmp_path: Path) -> None:
    state = tmp_path / "sb"
    state.mkdir()
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (state / "sandbox.pid").write_text(f"{bystander.pid}\n")
        proc = kvfleet("sandbox", "down", "--state-dir", str(state))
        assert proc.returncode == 1
        assert "not a sandbox" in proc.stderr
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
