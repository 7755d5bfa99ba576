"""DAG-level end-to-end tests: the sandbox runs in its own process (`kvfleet sandbox up`), as in the demo, so the
task code under dag.test() and the simulated fleet do not share a Python interpreter (and its GIL): TTFT measured
through the pod proxy stays meaningful. Faults and request counters go through the sandbox's admin endpoint."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SMALL_FLEET = """
settings: {wave_size: 1}
lobs: [{name: alpha}, {name: beta}]
clusters:
  - name: c-patch
    region: us-east-1
    gpu_nodes: {count: 8, instance_type: ml.g5.4xlarge}
    l2_injection: patch
    addons:  # the operator's role and TLS bucket, which the rollout's preflight checks (the twin creates both)
      amazon-sagemaker-hyperpod-inference:
        configuration:
          executionRoleArn: arn:aws:iam::123456789012:role/hyperpod-inference-exec
          tlsCertificateS3Bucket: hyperpod-tls-c-patch
    curvine: {worker: {replicas: 2, size: 100Gi}}
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
  - {name: alpha-chat, namespace: alpha, lob: alpha, cluster: c-patch, model: qwen2-7b, instance_type: ml.g5.4xlarge}
  - {name: beta-rag, namespace: beta, lob: beta, cluster: c-patch, model: qwen2-7b, instance_type: ml.g5.4xlarge}
  - {name: alpha-docs, namespace: alpha, lob: alpha, cluster: c-patch, model: qwen2-7b, instance_type: ml.g5.4xlarge}
  - {name: alpha-chat, namespace: alpha, lob: alpha, cluster: c-kyverno, model: qwen2-7b, instance_type: ml.g5.4xlarge}
  - {name: beta-rag, namespace: beta, lob: beta, cluster: c-kyverno, model: qwen2-7b, instance_type: ml.g5.4xlarge}
"""


class SandboxProcess:
    def __init__(self, state: Path, fleet: Path) -> None:
        self.state, self.fleet = state, fleet
        self.env: dict[str, str] = {}

    def up(self) -> SandboxProcess:
        subprocess.run([sys.executable, "-m", "kvfleet.cli", "sandbox", "up", "--fleet", str(self.fleet),
                        "--state-dir", str(self.state), "--time-scale", "0.005"], check=True, timeout=120,
                       capture_output=True)
        for line in (self.state / "env").read_text().splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export "):].partition("=")
                self.env[key] = shlex.split(value)[0] if value else ""
        return self

    def down(self) -> None:
        subprocess.run([sys.executable, "-m", "kvfleet.cli", "sandbox", "down", "--state-dir", str(self.state)],
                       timeout=120, capture_output=True)

    def admin(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.env["KVFLEET_SANDBOX_ADMIN"].rstrip("/") + path, data=data,
                                     method="POST" if data is not None else "GET",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")


@pytest.fixture
def small_fleet(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(SMALL_FLEET)
    return path


@pytest.fixture
def sandbox_process(tmp_path: Path, small_fleet: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SandboxProcess]:
    sb = SandboxProcess(tmp_path / "sandbox", small_fleet).up()
    try:
        for key, value in sb.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("KVFLEET_POLL_SECONDS", "0.1")
        monkeypatch.setenv("PATH", str(Path(__file__).resolve().parents[3] / ".tools" / "bin") + os.pathsep
                           + os.environ["PATH"])
        yield sb
    finally:
        sb.down()


def mutating_requests(sb: SandboxProcess) -> dict[str, Any]:
    counts = sb.admin("/requests")
    k8s = {c: {k: n for k, n in v["counts"].items() if k.split(" ", 1)[0] in ("create", "update", "patch", "delete")}
           for c, v in counts["clusters"].items()}
    aws = [op for op in counts["aws"]["operations"]
           if op.split(":", 1)[-1] in ("UpdateCluster", "CreateAddon", "UpdateAddon", "DeleteAddon")]
    return {"k8s": {c: v for c, v in k8s.items() if v}, "aws": aws}


@pytest.fixture(autouse=True)
def gate_watchdog() -> Iterator[None]:
    """No test may hang on a human gate it did not expect: a gate pending for more than 60 s is answered with its
    safe default (Abort / Reject), so the test fails on its assertions instead of waiting forever."""
    import threading
    import time

    from kvfleet.airflow import hitl

    done = threading.Event()
    first_seen: dict[tuple[str, str, int], float] = {}

    def watch() -> None:
        while not done.wait(1.0):
            try:
                for stranded in hitl.resume_stranded():  # dag.test's lost resume (hitl.resume_stranded)
                    print(f"gate_watchdog: resumed {stranded}, answered but left parked by dag.test")
                for gate in hitl.pending():
                    key = (gate.run_id, gate.task_id, gate.map_index)
                    if time.monotonic() - first_seen.setdefault(key, time.monotonic()) > 60:
                        safe = "Abort" if "Abort" in gate.options else "Reject"
                        print(f"gate_watchdog: answering {safe} to an unexpected gate {key}: {gate.subject}")
                        hitl.respond(gate, safe, "gate-watchdog")
            except Exception as exc:  # the metadata DB may not be initialised yet
                print(f"gate_watchdog: {exc}")

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    yield
    done.set()
    thread.join(timeout=5)
