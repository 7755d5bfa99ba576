"""Fixtures for the Kubernetes emulator tests: a fresh store + server per test (TLS, the admin's token), a
kubeconfig for it (client-go sends a token only over TLS), and runners for the real kubectl and helm binaries
(fetched by tools/fetch-k8s-binaries.sh)."""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kube_manifests import TLS, TOKEN, TOOLS, admin_authenticator

from kvfleet_sandbox.kube import KubeApiServer, KubeStore


@pytest.fixture
def kube() -> Iterator[tuple[KubeStore, KubeApiServer]]:
    store = KubeStore("test-cluster")
    server = KubeApiServer(store, tls=TLS, authenticator=admin_authenticator())
    server.start()
    try:
        yield store, server
    finally:
        server.stop()


@pytest.fixture
def kubeconfig(kube: tuple[KubeStore, KubeApiServer], tmp_path: Path) -> Path:
    _, server = kube
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: sandbox
  cluster: {{server: "{server.https_url}", certificate-authority-data: {base64.b64encode(TLS.ca_pem.encode()).decode()}}}
users:
- name: sandbox
  user: {{token: {TOKEN}}}
contexts:
- name: sandbox
  context: {{cluster: sandbox, user: sandbox, namespace: default}}
current-context: sandbox
""")
    return path


Runner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run(kubeconfig: Path, tmp_path: Path) -> Runner:
    """run("kubectl", "get", "nodes") → CompletedProcess; check=False keeps failures for assertions."""
    if not (TOOLS / "kubectl").exists():
        pytest.skip("kubectl/helm missing: run tools/fetch-k8s-binaries.sh")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path),
           "HELM_CACHE_HOME": str(tmp_path / "helm-cache"), "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
           "HELM_DATA_HOME": str(tmp_path / "helm-data")}

    def _run(tool: str, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(TOOLS / tool), *args], env=env, capture_output=True, text=True, timeout=60,
                              input=stdin)
        if check and proc.returncode != 0:
            raise AssertionError(f"{tool} {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    return _run
