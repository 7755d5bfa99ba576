"""The real helm 4 against the Kubernetes emulator: install (server-side apply and client-side), upgrade with
--reuse-values, get values, history, rollback and uninstall, with releases stored as helm.sh/release.v1 Secrets."""

from __future__ import annotations

import json

import pytest
from kube_manifests import CHARTS

pytestmark = pytest.mark.integration
CHART = str(CHARTS / "tiny")


def _replicas(store, name: str) -> int:
    return store.get("apps", "deployments", name, "default")["spec"]["replicas"]


def test_install_defaults_to_server_side_apply(kube, run):
    store, _ = kube
    run("helm", "install", "ssa", CHART, "--set", "greeting=hi")
    counts = store.request_counts()
    assert counts[("patch", "deployments")] == 1 and counts[("create", "deployments")] == 0
    assert store.get("", "configmaps", "ssa-config", "default")["data"] == {"greeting": "hi"}
    release = store.get("", "secrets", "sh.helm.release.v1.ssa.v1", "default")
    assert release["type"] == "helm.sh/release.v1"
    assert release["metadata"]["labels"]["owner"] == "helm"


def test_install_client_side(kube, run):
    store, _ = kube
    run("helm", "install", "csa", CHART, "--server-side=false")
    assert store.request_counts()[("create", "deployments")] == 1
    assert _replicas(store, "csa") == 1


def test_upgrade_values_history_rollback_uninstall(kube, run):
    store, _ = kube
    run("helm", "install", "r1", CHART, "--set", "greeting=hi")
    run("helm", "upgrade", "r1", CHART, "--reuse-values", "--set", "replicas=3")
    assert json.loads(run("helm", "get", "values", "r1", "-o", "json").stdout) == {"greeting": "hi", "replicas": 3}
    assert _replicas(store, "r1") == 3
    env = store.get("apps", "deployments", "r1", "default")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "GREETING", "value": "hi"}]

    run("helm", "rollback", "r1", "1")
    assert _replicas(store, "r1") == 1
    history = json.loads(run("helm", "history", "r1", "-o", "json").stdout)
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "superseded"),
                                                               (3, "deployed")]
    secrets = {s["metadata"]["name"] for s in store.list("", "secrets", "default", label_selector="owner=helm")}
    assert secrets == {f"sh.helm.release.v1.r1.v{i}" for i in (1, 2, 3)}

    run("helm", "uninstall", "r1")
    assert store.list("", "secrets", "default", label_selector="owner=helm,name=r1") == []
    assert store.get("apps", "deployments", "r1", "default") is None
    assert store.get("", "services", "r1", "default") is None


def test_server_side_upgrade_removes_what_the_chart_no_longer_renders(kube, run, tmp_path):
    """A value dropped from the chart (here an env var) must disappear from the live object, or a removed
    format flag would survive a helm upgrade."""
    import shutil
    store, _ = kube
    chart = tmp_path / "tiny"
    shutil.copytree(CHARTS / "tiny", chart)
    template = chart / "templates" / "deployment.yaml"
    template.write_text(template.read_text().replace(
        "          ports:", "            - name: FORMAT\n              value: \"true\"\n          ports:"))
    run("helm", "install", "fmt", str(chart))
    env = store.get("apps", "deployments", "fmt", "default")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["GREETING", "FORMAT"]
    run("helm", "upgrade", "fmt", CHART)
    env = store.get("apps", "deployments", "fmt", "default")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["GREETING"]
