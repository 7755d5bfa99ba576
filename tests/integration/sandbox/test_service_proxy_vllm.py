"""Completions through the apiserver's Service proxy to the simulated vLLM, driven with the official Kubernetes
client (``connect_post_namespaced_service_proxy_with_path``): the Service spreads requests over its Ready pods,
a pod that stops being Ready or is deleted takes no new request, and no Ready pod at all is a 503 from the
apiserver, not from vLLM. Routing rules and their sources: tests/conformance/test_service_proxy.py."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_manifests import TOKEN
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvfleet_sandbox.controllers import vllm
from kvfleet_sandbox.twin import Clock, ClusterTwin, SandboxSettings

pytestmark = pytest.mark.integration
NS = "default"
APP = "qwen2-7b-instruct"


@pytest.fixture
def twin(kube: Any) -> Iterator[ClusterTwin]:
    store, _ = kube
    twin = ClusterTwin(name="c1", eks_name="c1-eks", region="us-west-2", store=store, aws=None,  # type: ignore[arg-type]
                       clock=Clock(0.02), settings=SandboxSettings(), gpu_instance_type="ml.g5.4xlarge",
                       gpu_nodes=["gpu-a", "gpu-b"])
    twin.controllers.append(vllm.attach(twin))
    for i, node in enumerate(twin.gpu_nodes):
        store.create("", "nodes", {"metadata": {"name": node, "labels": {
            "node.kubernetes.io/instance-type": "ml.g5.4xlarge"}},
            "status": {"addresses": [{"type": "InternalIP", "address": f"10.0.0.{i + 10}"}]}})
    # What the simulated operator renders per endpoint (controllers/inference_operator.py).
    store.create("", "services", {"metadata": {"name": APP, "namespace": NS}, "spec": {
        "type": "ClusterIP", "selector": {"app": APP},
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP", "targetPort": 8000}]}})
    try:
        yield twin
    finally:
        twin.stop()


@pytest.fixture
def core(kube: Any) -> Iterator[client.CoreV1Api]:
    _, server = kube
    cfg = client.Configuration()
    cfg.host = server.url
    cfg.api_key = {"authorization": f"Bearer {TOKEN}"}
    with client.ApiClient(cfg) as api_client:
        yield client.CoreV1Api(api_client)


def vllm_pod(twin: ClusterTwin, name: str, node: str, *, ready: bool = True) -> None:
    twin.store.create("", "pods", {
        "metadata": {"name": name, "namespace": NS, "labels": {"app": APP}},
        "spec": {"nodeName": node, "containers": [
            {"name": APP, "image": "vllm", "ports": [{"name": "http", "containerPort": 8000}]},
            {"name": "reverse-proxy", "image": "proxy", "ports": [{"containerPort": 8080}]}]},
        "status": {"phase": "Running", "hostIP": "10.0.0.10", "podIP": f"10.1.0.{len(name)}",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def set_ready(twin: ClusterTwin, name: str, ready: bool) -> None:
    def flip(pod: dict[str, Any]) -> dict[str, Any]:
        for cond in pod["status"]["conditions"]:
            if cond["type"] == "Ready":
                cond["status"] = "True" if ready else "False"
        return pod
    twin.store.mutate("", "pods", name, NS, flip)


def complete(core: client.CoreV1Api) -> dict[str, Any]:
    resp = core.api_client.call_api(
        "/api/v1/namespaces/{namespace}/services/{name}/proxy/v1/completions", "POST",
        {"namespace": NS, "name": f"{APP}:8000"}, [], {"Content-Type": "application/json"},
        body={"model": APP, "prompt": "hello there", "max_tokens": 2}, auth_settings=["BearerToken"],
        _preload_content=False)
    return dict(json.loads(resp[0].data if isinstance(resp, tuple) else resp.data))


def served_by(twin: ClusterTwin) -> dict[str, int]:
    """Completions served per Ready pod, from each simulated vLLM's own ``vllm:request_success`` counter."""
    counts: dict[str, int] = {}
    for pod in twin.store.list("", "pods", NS):
        name = pod["metadata"]["name"]
        resp = twin.store.pod_proxy(NS, name, 8000, "GET", "/metrics", "", {}, b"")
        assert resp is not None and resp.status == 200 and isinstance(resp.body, bytes)
        match = re.search(r"^vllm:request_success(?:_total)?\{[^}]*\} ([0-9.]+)$", resp.body.decode(), re.M)
        counts[name] = int(float(match.group(1))) if match else 0
    return counts


def test_completions_through_the_service_reach_every_ready_pod(twin: ClusterTwin, core: client.CoreV1Api) -> None:
    vllm_pod(twin, "qwen-a", "gpu-a")
    vllm_pod(twin, "qwen-b", "gpu-b")
    for _ in range(20):
        out = complete(core)
        assert out["object"] == "text_completion" and out["choices"]
    counts = served_by(twin)
    assert counts["qwen-a"] > 0 and counts["qwen-b"] > 0 and sum(counts.values()) == 20


def test_a_pod_that_is_not_ready_or_deleted_takes_no_new_request(twin: ClusterTwin, core: client.CoreV1Api) -> None:
    vllm_pod(twin, "qwen-a", "gpu-a")
    vllm_pod(twin, "qwen-b", "gpu-b")
    before = served_by(twin)
    set_ready(twin, "qwen-a", False)
    for _ in range(10):
        complete(core)
    set_ready(twin, "qwen-a", True)
    after = served_by(twin)
    assert after == {"qwen-a": before["qwen-a"], "qwen-b": before["qwen-b"] + 10}

    twin.store.delete("", "pods", "qwen-b", NS)
    for _ in range(5):
        complete(core)
    assert served_by(twin) == {"qwen-a": after["qwen-a"] + 5}


def test_no_ready_pod_is_the_apiservers_503(twin: ClusterTwin, core: client.CoreV1Api) -> None:
    vllm_pod(twin, "qwen-a", "gpu-a", ready=False)
    with pytest.raises(ApiException) as err:
        core.connect_get_namespaced_service_proxy_with_path(f"{APP}:8000", NS, "v1/models")
    assert err.value.status == 503
    assert json.loads(err.value.body)["message"] == f'no endpoints available for service "{APP}:8000"'
    set_ready(twin, "qwen-a", True)
    models = json.loads(core.connect_get_namespaced_service_proxy_with_path(f"{APP}:8000", NS, "v1/models",
                                                                            _preload_content=False).data)
    assert models["object"] == "list"


def test_the_load_generator_counts_what_the_service_answers(twin: ClusterTwin, kubeconfig: Any) -> None:
    """bench/loadgen.py through the same proxy, with the kubeconfig a user would have (TLS, bearer token)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from loadgen import LoadGenerator, Target

    vllm_pod(twin, "qwen-a", "gpu-a")
    target = Target("sandbox", NS, APP)
    gen = LoadGenerator(kubeconfig, [target], rate=50)
    gen.start()

    def until_sent(n: int, what: str) -> None:  # a bound, not a timing: fails naming what it waited for
        deadline = time.monotonic() + 60
        while gen.stats[target.ref].sent < n:
            if time.monotonic() > deadline:
                gen.stop()
                raise AssertionError(f"the load generator did not send {what} within 60 s")
            time.sleep(0.02)

    until_sent(5, "5 requests to the Ready pod")
    set_ready(twin, "qwen-a", False)  # from now on the apiserver answers 503: no Ready endpoint
    failed_from = gen.stats[target.ref].sent
    until_sent(failed_from + 5, "5 requests after the pod went unready")
    stats = gen.stop()[target.ref]
    assert stats.failed >= 4 and stats.sent - stats.failed >= 4
    assert set(stats.errors) == {"HTTP 503: no endpoints available for service"}
    assert len(stats.successes) == stats.sent - stats.failed == len(stats.latencies_s)
    summary = stats.summary()
    assert summary["endpoint"] == f"sandbox:{NS}/{APP}" and summary["failed"] == stats.failed
