"""Conformance: how the twin's vLLM pods time a request (facts/vllm_ttft_model.yaml). The upstream facts name
their sources; the modelled ones are checked against the twin: the model's clock starts at the ``received`` the pod
proxy passes (the API server's stamp), no request header moves it, and plain pod-proxy handlers still work. No
server is started here (tests/integration/sandbox/test_vllm_sim.py drives the same path through the real API server
with a busy handler)."""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet_sandbox.controllers import vllm
from kvfleet_sandbox.kube.store import KubeStore, ProxyResponse
from kvfleet_sandbox.twin import Clock, ClusterTwin, SandboxSettings

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "vllm_ttft_model.yaml").read_text())
NS, APP = "default", "qwen2-7b-instruct"


def test_every_upstream_fact_names_its_source() -> None:
    up = FACTS["upstream"]
    sources = [up["client_ttft"]["source"], up["server_ttft_metric"]["arrival"]["source"],
               up["server_ttft_metric"]["first_token_latency"]["source"]]
    for src in sources:
        assert src["repo"] == "vllm-project/vllm" and src["path"].endswith(".py") and len(src["commit"]) == 40
    assert up["headers_for_timing"] == []


def test_the_sheet_calls_the_clock_start_a_modelling_choice() -> None:
    start = FACTS["modelled"]["clock_start"]
    assert "received" in start["rule"] and start["not_upstream"] and "NOT something vLLM" in (
        Path(__file__).parent / "facts" / "vllm_ttft_model.yaml").read_text()


def test_kvfleet_times_probes_on_the_benchmarks_clock_and_the_model_clock_is_the_twins_only() -> None:
    """Production stage 5 measures as vLLM's benchmark does (time.perf_counter, upstream.client_ttft); the twin's
    model clock is a modelling choice a test hands in, never kvfleet's default."""

    from kvfleet.clients.inference import stream_completion
    from kvfleet.stages.base import StageContext

    assert "time.perf_counter()" in FACTS["upstream"]["client_ttft"]["start"]
    assert StageContext.probe_clock is time.perf_counter
    assert inspect.signature(stream_completion).parameters["clock"].default is time.perf_counter
    model = FACTS["modelled"]["model_clock"]
    assert "StageContext.probe_clock" in model["rule"] and model["not_upstream"]


@pytest.fixture
def twin() -> Iterator[ClusterTwin]:
    tw = ClusterTwin(name="c1", eks_name="c1-eks", region="us-west-2", store=KubeStore("c1"), aws=None,  # type: ignore[arg-type]
                     clock=Clock(0.02), settings=SandboxSettings(), gpu_instance_type="ml.g5.4xlarge",
                     gpu_nodes=["gpu-a"])
    tw.controllers.append(vllm.attach(tw))
    tw.store.create("", "pods", {
        "metadata": {"name": "ep-a", "namespace": NS, "labels": {"app": APP}},
        "spec": {"nodeName": "gpu-a", "containers": [{"name": APP, "image": "vllm", "ports": [{"containerPort": 8000}],
                                                       "env": [{"name": "PYTHONHASHSEED", "value": "0"}]}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    try:
        yield tw
    finally:
        tw.stop()


def _arrivals(twin: ClusterTwin, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    sim = twin.services["vllm"]
    seen: list[float] = []
    admit = sim.admit

    def spy(*args: Any) -> Any:
        plan = admit(*args)
        seen.append(plan.arrived)
        return plan

    monkeypatch.setattr(sim, "admit", spy)
    return seen


def _complete(twin: ClusterTwin, headers: dict[str, str], **kw: Any) -> ProxyResponse | None:
    body = b'{"model": "%s", "prompt": "%s", "max_tokens": 1}' % (APP.encode(), uuid.uuid4().hex.encode())
    return twin.store.pod_proxy(NS, "ep-a", 8000, "POST", "/v1/completions", "", headers, body, **kw)


@pytest.mark.parametrize("headers", [{}, {"X-Request-Id": "r-1"}, {"X-Kvfleet-Sent-At": "0", "Date": "Thu, 01 Jan 1970"}])
def test_the_clock_starts_at_the_api_servers_stamp_whatever_the_headers(twin: ClusterTwin,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        headers: dict[str, str]) -> None:
    arrivals = _arrivals(twin, monkeypatch)
    received = time.monotonic() - 3600  # long past: the first token is due at once, nothing is waited
    resp = _complete(twin, headers, received=received)
    assert resp is not None and resp.status == 200
    assert arrivals == [received]


def test_without_a_stamp_the_clock_starts_when_the_handler_is_called(twin: ClusterTwin,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    arrivals = _arrivals(twin, monkeypatch)
    before = time.monotonic()
    resp = _complete(twin, {})
    assert resp is not None and resp.status == 200
    assert len(arrivals) == 1 and before <= arrivals[0] <= time.monotonic()


def test_a_plain_handler_without_the_keyword_is_still_called() -> None:
    store = KubeStore("c1")
    calls: list[tuple[Any, ...]] = []

    def plain(namespace: str, pod: str, port: int, method: str, path: str, query: str, headers: dict[str, str],
              body: Any) -> ProxyResponse:
        calls.append((namespace, pod, port))
        return ProxyResponse(200, {}, b"ok")

    store.register_pod_proxy(plain)
    assert store.pod_proxy(NS, "p", 80, "GET", "/", "", {}, b"", received=1.0) is not None
    assert calls == [(NS, "p", 80)]
