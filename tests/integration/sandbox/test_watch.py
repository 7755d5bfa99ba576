"""Watch on the Kubernetes emulator (facts: tests/conformance/facts/kube_watch.yaml): the real kubectl's
``rollout status`` and ``wait --for=condition=Available`` against a running twin, each in a subprocess with a
bounded timeout, and the raw protocol (resourceVersion replay, bookmarks, 410 as an ERROR event, timeoutSeconds,
objects entering and leaving a selector) over HTTP."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_manifests import TOKEN

from kvfleet_sandbox.kube import KubeApiServer, KubeStore
from kvfleet_sandbox.kube import store as store_module
from kvfleet_sandbox.runtime import Sandbox

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
FACTS = yaml.safe_load((ROOT / "tests" / "conformance" / "facts" / "kube_watch.yaml").read_text())
CLUSTER = "wl-1"
FLEET = f"""
clusters:
  - name: {CLUSTER}
    region: us-east-1
    gpu_nodes: {{count: 2, instance_type: ml.g5.4xlarge}}
"""
# 100 model seconds of pod start-up = 1 s of wall time: kubectl has to wait and follow MODIFIED events.
SLOW_START = {"time_scale": 0.01, "pod_startup_s": 100.0, "cluster_update_delay_s": 5.0}
KubectlRun = Callable[..., subprocess.CompletedProcess[str]]


def deployment(name: str, replicas: int, env: str = "v1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, **spec,
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{
                         "name": "vllm", "image": "vllm/vllm-openai:v0.11.1", "env": [{"name": "V", "value": env}],
                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


@pytest.fixture
def sb(sandbox_factory: Any) -> Sandbox:
    return sandbox_factory(FLEET, controllers=("workloads",), **SLOW_START)  # type: ignore[no-any-return]


@pytest.fixture
def kubectl(sb: Sandbox) -> KubectlRun:
    if not KUBECTL.exists():
        pytest.skip("kubectl missing: run tools/fetch-k8s-binaries.sh")

    def run(*args: str, stdin: str | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(KUBECTL), "--kubeconfig", str(sb.kubeconfig), "--context", CLUSTER, *args],
                              capture_output=True, text=True, timeout=timeout, input=stdin)
    return run


# --- the real kubectl --------------------------------------------------------------------------------------------


def test_rollout_status_follows_a_rollout_to_its_end(kubectl: KubectlRun) -> None:
    assert kubectl("apply", "-f", "-", stdin=json.dumps(deployment("web", 1))).returncode == 0
    done = kubectl("rollout", "status", "deployment/web", "--timeout=60s")
    assert done.returncode == 0, done.stderr
    assert 'deployment "web" successfully rolled out' in done.stdout

    # A template change: a new ReplicaSet, a surge pod that starts in 1 s, then the old pod goes.
    assert kubectl("apply", "-f", "-", stdin=json.dumps(deployment("web", 1, env="v2"))).returncode == 0
    rolled = kubectl("rollout", "status", "deployment/web", "--timeout=60s")
    assert rolled.returncode == 0, rolled.stderr
    assert "Waiting for deployment" in rolled.stdout and "successfully rolled out" in rolled.stdout


def test_rollout_status_reports_a_rollout_stuck_past_its_progress_deadline(kubectl: KubectlRun) -> None:
    # Three replicas on two GPUs: one pod never schedules, and the Deployment reports ProgressDeadlineExceeded.
    stuck = deployment("stuck", 3, progressDeadlineSeconds=100)
    assert kubectl("apply", "-f", "-", stdin=json.dumps(stuck)).returncode == 0
    out = kubectl("rollout", "status", "deployment/stuck", "--timeout=60s")
    assert out.returncode != 0
    assert 'deployment "stuck" exceeded its progress deadline' in out.stderr


def test_wait_for_condition_available(kubectl: KubectlRun) -> None:
    assert kubectl("apply", "-f", "-", stdin=json.dumps(deployment("web", 2))).returncode == 0
    out = kubectl("wait", "--for=condition=Available", "deployment/web", "--timeout=60s")
    assert out.returncode == 0, out.stderr
    assert "deployment.apps/web condition met" in out.stdout


def test_wait_times_out_when_the_condition_never_holds(kubectl: KubectlRun) -> None:
    assert kubectl("apply", "-f", "-", stdin=json.dumps(deployment("big", 3))).returncode == 0
    out = kubectl("wait", "--for=condition=Available", "deployment/big", "--timeout=3s")
    assert out.returncode != 0 and "timed out waiting for the condition" in out.stderr


# --- the protocol ------------------------------------------------------------------------------------------------


def watch(server: KubeApiServer, query: str, path: str = "/api/v1/namespaces/default/configmaps"
          ) -> tuple[int, list[dict[str, Any]]]:
    """One watch request to its end (every test passes a short timeoutSeconds): status and events."""
    req = urllib.request.Request(f"{server.url}{path}?watch=1&{query}", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    except urllib.error.HTTPError as err:
        return err.code, [json.loads(err.read() or b"{}")]


def configmap(store: KubeStore, name: str, **labels: str) -> dict[str, Any]:
    return store.create("", "configmaps", {"metadata": {"name": name, "namespace": "default", "labels": labels},
                                           "data": {"k": "v"}})


def relabel(store: KubeStore, name: str, **labels: str) -> None:
    store.mutate("", "configmaps", name, "default",
                 lambda o: {**o, "metadata": {**o["metadata"], "labels": labels}})


def test_resource_version_replays_changes_after_it(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    rv = configmap(store, "a")["metadata"]["resourceVersion"]
    configmap(store, "b")
    relabel(store, "a", x="1")
    code, events = watch(server, f"resourceVersion={rv}&timeoutSeconds=1")
    assert code == 200
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b"), ("MODIFIED", "a")]
    code, events = watch(server, "resourceVersion=0&timeoutSeconds=1")
    assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in events) == [("ADDED", "a"), ("ADDED", "b")]


def test_a_too_old_resource_version_is_an_error_event_with_410(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    rv = int(configmap(store, "a")["metadata"]["resourceVersion"])
    for i in range(store_module.HISTORY_LIMIT + 5):
        relabel(store, "a", n=str(i))
    code, events = watch(server, f"resourceVersion={rv}&timeoutSeconds=1")
    facts = FACTS["too_old_resource_version"]
    assert code == facts["http_status"] == 200
    (event,) = events
    assert event["type"] == facts["event_type"] == "ERROR"
    assert event["object"]["code"] == facts["status_code"] == 410
    assert event["object"]["reason"] == "Expired"
    assert event["object"]["message"].startswith("too old resource version: ")


def test_bookmarks_carry_the_current_resource_version(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    # Every 0.3 s until 2 s before the deadline (the pre-timeout bookmark), then none: a 3 s watch gets several.
    server.bookmark_interval_s = 0.3
    configmap(store, "a")
    latest = configmap(store, "b")["metadata"]["resourceVersion"]
    code, events = watch(server, f"resourceVersion={latest}&allowWatchBookmarks=true&timeoutSeconds=3")
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert code == 200 and len(bookmarks) >= 2
    assert all(b["object"]["kind"] == "ConfigMap" and b["object"]["metadata"]["resourceVersion"] == latest
               for b in bookmarks)
    # Without allowWatchBookmarks, none.
    assert watch(server, f"resourceVersion={latest}&timeoutSeconds=1")[1] == []


def test_send_initial_events_ends_with_the_initial_events_end_bookmark(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    configmap(store, "a")
    _, events = watch(server, "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
                              "&timeoutSeconds=1")
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "a"
    end = events[1]
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"]["annotations"] == {FACTS["watch_list"]["end_annotation"]: "true"}


def test_objects_entering_and_leaving_a_selector_are_added_and_deleted(kube: tuple[KubeStore, KubeApiServer]
                                                                       ) -> None:
    store, server = kube
    rv = configmap(store, "a", team="x")["metadata"]["resourceVersion"]
    relabel(store, "a", team="y")   # leaves team=x
    relabel(store, "a", team="x")   # enters again
    configmap(store, "other", team="y")
    _, events = watch(server, f"resourceVersion={rv}&labelSelector=team%3Dx&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "a"), ("ADDED", "a")]


@pytest.mark.parametrize("value", ["soon", "-1", "1.5"])
def test_timeout_seconds_must_be_a_whole_number(kube: tuple[KubeStore, KubeApiServer], value: str) -> None:
    _, server = kube
    code, (status,) = watch(server, f"timeoutSeconds={value}")
    assert code == 400 and "timeoutSeconds" in status["message"]
