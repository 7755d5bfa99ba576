"""Scenario tests of the simulated vLLM + LMCache pods, driven only through the official Kubernetes client: the
API-server pod proxy (streaming, like vLLM's benchmark) and ``pods/log`` with ``sinceTime``/``sinceSeconds``.

The twin is built by hand (store + the vLLM controller, pods created directly with the env and mounts each
scenario needs), so these tests pin the vLLM simulation alone; the full sandbox runs it beside the other
controllers."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid

import pytest
from kube_manifests import TOKEN
from kubernetes import client

from kvfleet.fleet import lmcache_log
from kvfleet.fleet.constants import L2_URL, OPERATOR_L2_URL
from kvfleet_sandbox.controllers import vllm
from kvfleet_sandbox.kube.store import KubeStore
from kvfleet_sandbox.twin import Clock, ClusterTwin, SandboxSettings

pytestmark = pytest.mark.integration
NS = "default"
APP = "qwen2-7b-instruct-kvcache"
BLOG_ENV = [{"name": "LMCACHE_REMOTE_URL", "value": L2_URL}, {"name": "LMCACHE_REMOTE_SERDE", "value": "naive"},
            {"name": "PYTHONHASHSEED", "value": "0"}]
HIT = re.compile(r"Reqid: (?P<req>[^,]+), Total tokens (?P<total>\d+),(?: Inference Engine computed tokens: "
                 r"(?P<computed>\d+),)? LMCache hit tokens: (?P<hit>\d+), need to load: (?P<load>-?\d+)")
STORE = re.compile(r"(?:\[req_id=(?P<req>[^\]]+)\] )?Stored (?P<stored>\d+) out of total (?P<total>\d+) tokens\. "
                   r"size: (?P<gb>[\d.]+) (?:gb|GB), cost (?P<ms>[\d.]+) ms")
RETRIEVE = re.compile(r"Retrieved (?P<got>\d+) out of (?P<req>\d+) required tokens \(from (?P<total>\d+) total "
                      r"tokens\)\. size: (?P<gb>[\d.]+) gb, cost (?P<ms>[\d.]+) ms, throughput: (?P<tp>[\d.]+) GB/s;")


# --- a hand-built twin ------------------------------------------------------------------------------------------

@pytest.fixture
def twin_factory(kube):
    store, _ = kube
    made = []

    def make(version: str = "0.3.9", instance_type: str = "ml.g5.4xlarge") -> ClusterTwin:
        twin = ClusterTwin(name="c1", eks_name="c1-eks", region="us-west-2", store=store, aws=None,  # type: ignore[arg-type]
                           clock=Clock(0.02), settings=SandboxSettings(lmcache_version=version),
                           gpu_instance_type=instance_type, gpu_nodes=["gpu-a", "gpu-b"])
        twin.controllers.append(vllm.attach(twin))
        for i, node in enumerate(twin.gpu_nodes):
            store.create("", "nodes", {"metadata": {"name": node, "labels": {
                "node.kubernetes.io/instance-type": instance_type}},
                "status": {"addresses": [{"type": "InternalIP", "address": f"10.0.0.{i + 10}"}]}})
        pv = f"pvc-{uuid.uuid4()}"
        store.create("", "persistentvolumes", {"metadata": {"name": pv}, "spec": {
            "capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "curvine-sc",
            "csi": {"driver": "curvine", "volumeHandle": f"curvine-cluster@/l2cache@{pv}"}}})
        store.create("", "persistentvolumeclaims", {"metadata": {"name": "curvine-pvc", "namespace": NS}, "spec": {
            "accessModes": ["ReadWriteMany"], "storageClassName": "curvine-sc", "volumeName": pv,
            "resources": {"requests": {"storage": "100Gi"}}}, "status": {"phase": "Bound"}})
        twin.pv_name = pv  # type: ignore[attr-defined]
        made.append(twin)
        return twin

    yield make
    for twin in made:
        twin.stop()


def vllm_pod(twin: ClusterTwin, name: str, node: str, env: list[dict], *, mount: bool = True,
             ready: bool = True, image: str = "vllm") -> str:
    container = {"name": APP, "image": image, "ports": [{"containerPort": 8000}], "env": env}
    volumes = []
    if mount:
        container["volumeMounts"] = [{"name": "curvine-cache", "mountPath": "/mnt/curvine"}]
        volumes = [{"name": "curvine-cache", "persistentVolumeClaim": {"claimName": "curvine-pvc"}}]
    twin.store.create("", "pods", {
        "metadata": {"name": name, "namespace": NS, "labels": {"app": APP}},
        "spec": {"nodeName": node, "volumes": volumes, "containers": [
            container, {"name": "reverse-proxy", "image": "proxy", "ports": [{"containerPort": 8080}]},
            {"name": "otel-collector", "image": "otel"}]},
        "status": {"phase": "Running", "hostIP": "10.0.0.10", "podIP": "10.1.0.5",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})
    return name


@pytest.fixture
def api(kube):
    _, server = kube
    cfg = client.Configuration()
    cfg.host = server.url
    cfg.api_key = {"authorization": f"Bearer {TOKEN}"}
    with client.ApiClient(cfg) as api_client:
        yield api_client


# --- the client side, as stage 5 does it ------------------------------------------------------------------------

def prompt(tokens: int) -> str:
    nonce = uuid.uuid4().hex
    return " ".join([nonce] + [f"w{i % 97}" for i in range(tokens - 1)])


def stream_completion(api, pod: str, text: str, *, chat: bool = False, max_tokens: int = 4,
                      clock=time.perf_counter) -> dict:
    """POST through the pod proxy with streaming; TTFT = first SSE message with ``choices`` (vLLM's benchmark),
    timed on ``clock``."""
    path = "v1/chat/completions" if chat else "v1/completions"
    body = {"model": APP, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
    start = clock()
    resp = api.call_api(f"/api/v1/namespaces/{{namespace}}/pods/{{name}}/proxy/{path}", "POST",
                        {"namespace": NS, "name": f"{pod}:8000"}, [], {"Content-Type": "application/json"},
                        body=body, auth_settings=["BearerToken"], _preload_content=False)
    out: dict = {"ttft": None, "chunks": [], "times": [], "usage": None, "id": None}
    buffer = b""
    for raw in resp.stream(256):
        buffer += raw
        while b"\n\n" in buffer:
            message, buffer = buffer.split(b"\n\n", 1)
            data = message.decode().removeprefix("data: ").strip()
            if not data or data.startswith(":"):
                continue
            now = clock() - start
            if data == "[DONE]":
                out["done"] = now
                continue
            payload = json.loads(data)
            out["id"] = payload["id"]
            if payload.get("choices"):
                out["ttft"] = out["ttft"] if out["ttft"] is not None else now
                out["chunks"].append(payload)
                out["times"].append(now)
            elif payload.get("usage"):
                out["usage"] = payload["usage"]
    return out


def pod_log(api, pod: str, since: dt.datetime) -> str:
    resp = api.call_api("/api/v1/namespaces/{namespace}/pods/{name}/log", "GET", {"namespace": NS, "name": pod},
                        [("container", APP), ("sinceTime", since.strftime("%Y-%m-%dT%H:%M:%SZ"))],
                        {"Accept": "*/*"}, auth_settings=["BearerToken"], _preload_content=False)
    return resp.data.decode()


def lines_for(log: str, req_id: str) -> dict:
    """The LMCache lines of one client request (its SSE id): the lookup whose engine id joins it (kvfleet's join
    rule); store/retrieve are the lines that follow it. Colour codes are stripped first, as stage 5 does."""
    found: dict = {}
    following = False
    for line in lmcache_log.strip_ansi(log).splitlines():
        m = HIT.search(line)
        if m:
            following = lmcache_log.joins(req_id, m["req"])
            if following:
                found["engine_id"] = m["req"]
            if following:
                found["hit"] = m
            continue
        if following and (s := STORE.search(line)):
            found["store"] = s
        if following and (r := RETRIEVE.search(line)):
            found["retrieve"] = r
        if following and "LMCache ERROR" in line:
            found.setdefault("errors", []).append(line)
    return found


def since_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def cross_pod(api, twin, env_a, env_b, *, tokens: int = 2000, node_b: str = "gpu-b", mount: bool = True):
    a = vllm_pod(twin, "ep-a", "gpu-a", env_a, mount=mount)
    b = vllm_pod(twin, "ep-b", node_b, env_b, mount=mount)
    text = prompt(tokens)
    since = since_now()
    cold = stream_completion(api, a, text)
    warm = stream_completion(api, b, text)
    return (cold, lines_for(pod_log(api, a, since), cold["id"]),
            warm, lines_for(pod_log(api, b, since), warm["id"]))


# --- scenarios ----------------------------------------------------------------------------------------------

def test_blog_env_on_two_nodes_gives_a_full_cross_pod_hit(twin_factory, api):
    twin = twin_factory()
    cold, log_a, warm, log_b = cross_pod(api, twin, BLOG_ENV, BLOG_ENV)
    assert cold["id"].startswith("cmpl-") and cold["usage"]["prompt_tokens"] == 2000
    assert (int(log_a["hit"]["total"]), int(log_a["hit"]["hit"]), int(log_a["hit"]["load"])) == (2000, 0, 0)
    assert (int(log_a["store"]["stored"]), int(log_a["store"]["total"])) == (2000, 2000)
    # The second pod, on another node, reads everything through the shared Curvine mount.
    assert (int(log_b["hit"]["hit"]), int(log_b["hit"]["load"])) == (2000, 1999)
    assert int(log_b["retrieve"]["got"]) == 2000 and "store" not in log_b
    assert warm["ttft"] < cold["ttft"]
    # Files live at <fs-path>/pvc-<uid>/<rest of the URL path>/<key>.data, keyed the 0.3.9 way.
    files = twin.l2.list(f"/l2cache/{twin.pv_name}/l2cache/")
    assert len(files) == 8 and all(re.search(r"/vllm@-opt-ml-model@1@0@[0-9a-f]+@bfloat16\.data$", f) for f in files)


def test_without_pythonhashseed_cross_pod_hits_are_zero(twin_factory, api):
    twin = twin_factory()
    env = [e for e in BLOG_ENV if e["name"] != "PYTHONHASHSEED"]
    _, log_a, _, log_b = cross_pod(api, twin, env, env)
    assert int(log_a["store"]["stored"]) == 2000  # written, under keys nobody else computes
    assert int(log_b["hit"]["hit"]) == 0
    assert "PYTHONHASHSEED not set" in pod_log(api, "ep-b", since_now() - dt.timedelta(minutes=1))


def test_operator_url_is_node_local_so_no_cross_node_hits(twin_factory, api):
    twin = twin_factory()
    env = [{"name": "LMCACHE_REMOTE_URL", "value": OPERATOR_L2_URL}, *BLOG_ENV[1:]]
    _, log_a, _, log_b = cross_pod(api, twin, env, env, mount=False)
    assert int(log_a["store"]["stored"]) == 2000
    assert int(log_b["hit"]["hit"]) == 0
    assert twin.node_l2("gpu-a").file_count() == 8 and twin.l2.file_count() == 0
    # The same node's daemon does serve a second pod on that node.
    vllm_pod(twin, "ep-c", "gpu-a", env, mount=False)
    text = prompt(600)
    since = since_now()
    stream_completion(api, "ep-a", text)
    res = stream_completion(api, "ep-c", text)
    assert int(lines_for(pod_log(api, "ep-c", since), res["id"])["hit"]["hit"]) == 600


def test_duplicate_url_entries_last_one_wins(twin_factory, api):
    twin = twin_factory()
    env = [{"name": "LMCACHE_REMOTE_URL", "value": OPERATOR_L2_URL}, *BLOG_ENV]  # the blog's value comes last
    _, _, _, log_b = cross_pod(api, twin, env, env)
    assert int(log_b["hit"]["hit"]) == 2000
    env_wrong = [*BLOG_ENV, {"name": "LMCACHE_REMOTE_URL", "value": OPERATOR_L2_URL}]
    vllm_pod(twin, "ep-c", "gpu-a", env_wrong)
    vllm_pod(twin, "ep-d", "gpu-b", env_wrong)
    text = prompt(1000)
    since = since_now()
    stream_completion(api, "ep-c", text)
    res = stream_completion(api, "ep-d", text)
    assert int(lines_for(pod_log(api, "ep-d", since), res["id"])["hit"]["hit"]) == 0


def test_fs_path_off_the_curvine_mount_is_private_to_the_pod(twin_factory, api):
    twin = twin_factory()
    _, log_a, _, log_b = cross_pod(api, twin, BLOG_ENV, BLOG_ENV, mount=False)
    assert int(log_a["store"]["stored"]) == 2000 and int(log_b["hit"]["hit"]) == 0
    assert twin.l2.file_count() == 0


def test_cachegen_serde_logs_an_error_and_stores_nothing(twin_factory, api):
    twin = twin_factory()
    env = [BLOG_ENV[0], {"name": "LMCACHE_REMOTE_SERDE", "value": "cachegen"}, BLOG_ENV[2]]
    _, log_a, _, log_b = cross_pod(api, twin, env, env)
    assert "store" not in log_a and log_a["errors"]
    assert len(log_a["errors"]) == 8  # one per chunk file: the zip bug of the cachegen serde
    assert all("LMCache ERROR: Failed to write file /l2cache/" in e and "zip" in e for e in log_a["errors"])
    assert twin.l2.file_count() == 0 and int(log_b["hit"]["hit"]) == 0


def test_a_200_token_prompt_writes_nothing_to_l2(twin_factory, api):
    twin = twin_factory()
    vllm_pod(twin, "ep-a", "gpu-a", BLOG_ENV)
    since = since_now()
    res = stream_completion(api, "ep-a", prompt(200))
    found = lines_for(pod_log(api, "ep-a", since), res["id"])
    assert int(found["hit"]["total"]) == 200 and "store" not in found
    assert twin.l2.file_count() == 0


def test_logs_in_the_0_5_6_format(twin_factory, api):
    twin = twin_factory(version="0.5.6")
    cold, _, warm, log_b = cross_pod(api, twin, BLOG_ENV, BLOG_ENV)
    since = since_now() - dt.timedelta(minutes=1)
    text_a = lmcache_log.strip_ansi(pod_log(api, "ep-a", since))
    text_b = lmcache_log.strip_ansi(pod_log(api, "ep-b", since))
    cold_engine = re.escape(cold["id"]) + "-0-[0-9a-f]{8}"
    assert re.search(f"Reqid: {cold_engine}, Total tokens 2000, Inference Engine computed tokens: 0, LMCache hit "
                     "tokens: 0, need to load: 0", text_a)
    # 0.5.6 does not save the partial tail chunk: 7 × 256 = 1,792 tokens.
    assert re.search(rf"\[req_id={cold_engine}\] Stored 1792 out of total 2000 tokens\. size: [\d.]+ GB, cost ", text_a)
    assert log_b["hit"]["hit"] == "1792"
    assert re.search(rf"\[req_id={re.escape(warm['id'])}-0-[0-9a-f]{{8}}\] Retrieved 1792 out of 1792", text_b)
    files = twin.l2.list("/l2cache/")
    assert files and all(re.search(r"/-SEP-opt-SEP-ml-SEP-model@1@0@[0-9a-f]+@bfloat16\.data$", f) for f in files)


def test_streaming_delivers_the_first_chunk_before_the_last(twin_factory, api):
    twin = twin_factory()
    vllm_pod(twin, "ep-a", "gpu-a", BLOG_ENV)
    res = stream_completion(api, "ep-a", prompt(1500), chat=True, max_tokens=8)
    assert res["id"].startswith("chatcmpl-")
    assert res["chunks"][0]["choices"][0]["delta"]["role"] == "assistant"
    assert len(res["chunks"]) == 9 and res["usage"]["completion_tokens"] == 8
    # Seven inter-token gaps of the profile's 30 ms separate the first token from the last.
    assert res["times"][-1] - res["times"][0] > 0.15
    assert res["ttft"] > 0.3  # a cold 1,500-token prefill on ml.g5.4xlarge


def test_log_source_honours_since_seconds_and_tail(twin_factory, api):
    twin = twin_factory()
    vllm_pod(twin, "ep-a", "gpu-a", BLOG_ENV)
    res = stream_completion(api, "ep-a", prompt(600))
    core = client.CoreV1Api(api)
    recent = core.read_namespaced_pod_log("ep-a", NS, container=APP, since_seconds=30, _preload_content=False)
    assert res["id"] in recent.data.decode()
    tail = core.read_namespaced_pod_log("ep-a", NS, container=APP, tail_lines=1, _preload_content=False)
    assert tail.data.decode().count("\n") == 1 and "Stored 600 out of total 600" in tail.data.decode()
    assert pod_log(api, "ep-a", since_now() + dt.timedelta(minutes=5)) == ""
    # vLLM's engine-core prefix, then LMCache's coloured level prefix (tests/conformance/facts/lmcache_vllm_logs.yaml)
    assert re.match(r"^\(EngineCore_DP0 pid=\d+\) \x1b\[32;20m\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] LMCache INFO:"
                    r"\x1b\[0m ", recent.data.decode())


def test_the_twin_logs_engine_ids_with_colour_codes_never_the_client_id(twin_factory, api):
    twin = twin_factory()
    vllm_pod(twin, "ep-a", "gpu-a", BLOG_ENV)
    since = since_now()
    res = stream_completion(api, "ep-a", prompt(600))
    chat = stream_completion(api, "ep-a", prompt(600), chat=True)
    raw = pod_log(api, "ep-a", since)
    lookups = [line for line in raw.splitlines() if "Reqid: " in line]
    assert len(lookups) == 2 and all(line.startswith("(EngineCore_DP0 pid=") for line in lookups)
    assert all("\x1b[32;20m[" in line and "LMCache INFO:\x1b[0m Reqid: " in line for line in lookups)
    assert all(re.search(r" \x1b\[3m\(vllm_v1_adapter\.py:\d+:lmcache\.integration\.vllm\.vllm_v1_adapter\)\x1b\[0m$",
                         line) for line in lookups)
    # Completion: prompt index 0 and 8 random hex; chat: the id plus 8 random hex. Never the bare client id.
    assert re.search(rf"Reqid: {re.escape(res['id'])}-0-[0-9a-f]{{8}}, Total tokens 600,", lookups[0])
    assert re.search(rf"Reqid: {re.escape(chat['id'])}-[0-9a-f]{{8}}, Total tokens", lookups[1])
    assert f"Reqid: {res['id']}," not in raw and f"Reqid: {chat['id']}," not in raw
    scan = lmcache_log.parse(raw)  # and kvfleet's parser joins both back to the client ids
    assert scan.lookup_for(res["id"]).total == 600 and scan.stored_tokens(res["id"]) == 600
    assert scan.lookup_for(chat["id"]) is not None and scan.lookup_for(res["id"][:-1]) is None


@pytest.mark.parametrize(("image", "version"), [("lmcache/vllm-openai:v0.5.6", "0.5.6"),
                                                ("lmcache/vllm-openai:v0.3.9", "0.3.9"),
                                                ("lmcache/vllm-openai:latest", "0.3.9")])
def test_the_log_format_follows_the_pod_image_tag(twin_factory, api, image, version):
    twin = twin_factory()  # the twin's default format is 0.3.9; the image tag decides
    vllm_pod(twin, "ep-a", "gpu-a", BLOG_ENV, image=image)
    since = since_now()
    res = stream_completion(api, "ep-a", prompt(600))
    text = lmcache_log.strip_ansi(pod_log(api, "ep-a", since))
    assert twin.services["vllm"].pod_cache_stats(NS, "ep-a")["version"] == version
    assert ("Inference Engine computed tokens" in text) == (version == "0.5.6")
    assert (f"[req_id={res['id']}-0-" in text) == (version == "0.5.6")
    assert lmcache_log.parse(text).stored_tokens(res["id"]) == (512 if version == "0.5.6" else 600)


def test_api_surface_metrics_health_models_and_errors(twin_factory, api):
    twin = twin_factory()
    vllm_pod(twin, "ep-a", "gpu-a", BLOG_ENV)
    vllm_pod(twin, "ep-b", "gpu-b", BLOG_ENV, ready=False)
    core = client.CoreV1Api(api)
    text = prompt(1000)
    stream_completion(api, "ep-a", text)
    stream_completion(api, "ep-a", text)  # same pod: vLLM's own prefix cache + LMCache's L1
    metrics = core.connect_get_namespaced_pod_proxy_with_path("ep-a:8000", NS, "metrics",
                                                              _preload_content=False).data.decode()
    assert f'vllm:prefix_cache_queries_total{{engine="0",model_name="{APP}"}} 2000.0' in metrics
    assert f'vllm:prefix_cache_hits_total{{engine="0",model_name="{APP}"}} 768.0' in metrics
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="' in metrics
    assert f'lmcache:num_hit_tokens_total{{model_name="{APP}",worker_id="0"}} 1000.0' in metrics
    assert f'lmcache:retrieve_hit_rate{{model_name="{APP}",worker_id="0"}} 0.5' in metrics
    health = core.connect_get_namespaced_pod_proxy_with_path("ep-a:8000", NS, "health", _preload_content=False)
    assert health.status == 200
    models = json.loads(core.connect_get_namespaced_pod_proxy_with_path("ep-a:8000", NS, "v1/models",
                                                                        _preload_content=False).data)
    assert models["data"][0]["id"] == APP
    with pytest.raises(client.ApiException) as exc:
        core.connect_get_namespaced_pod_proxy_with_path("ep-b:8000", NS, "health")
    assert exc.value.status == 503
    with pytest.raises(client.ApiException) as exc:
        stream_completion(api, "ep-a", prompt(32768))
    assert exc.value.status == 400 and "maximum context length is 32768" in str(exc.value.body)
    whole = api.call_api("/api/v1/namespaces/{namespace}/pods/{name}/proxy/v1/chat/completions", "POST",
                         {"namespace": NS, "name": "ep-a:8000"}, [], {"Content-Type": "application/json"},
                         body={"model": APP, "max_tokens": 3, "messages": [{"role": "user", "content": "hi there"}]},
                         auth_settings=["BearerToken"], _preload_content=False)
    reply = json.loads(whole.data)
    # Qwen2 template: "<|im_start|>user", "hi", "there<|im_end|>", "<|im_start|>assistant" → 4 tokens.
    assert reply["usage"]["prompt_tokens"] == 4 and reply["choices"][0]["message"]["role"] == "assistant"
    stats = twin.services["vllm"].pod_cache_stats(NS, "ep-a")
    assert stats["l2"]["kind"] == "curvine" and stats["requests"] == 3


# --- TTFT on the model's schedule (deterministic TTFT under test) ------------------------------------------------

def _admit(twin: ClusterTwin, pod: str, text: str, arrived: float):  # type: ignore[no-untyped-def]
    sim = twin.services["vllm"]
    engine = sim.engine_of(twin.store.get("", "pods", pod, NS))
    return sim, engine, sim.admit(engine, f"cmpl-{uuid.uuid4().hex}-0-abcd1234", text.split(), 1, arrived)


class _FakeTime:
    """The engine's ``time`` module with a clock that only ``sleep`` moves (no real waiting, no timing)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds

    time = staticmethod(time.time)


def test_phases_end_at_deadlines_from_arrival_so_the_twins_own_delay_is_not_added(twin_factory, monkeypatch):
    twin = twin_factory()
    vllm_pod(twin, "ep-a", "gpu-a", BLOG_ENV)
    fake = _FakeTime()
    monkeypatch.setattr(vllm.engine, "time", fake)
    # Just arrived: the first token comes exactly the model TTFT after arrival.
    sim, engine, plan = _admit(twin, "ep-a", prompt(2000), fake.now)
    sim.until_first_token(engine, plan)
    assert fake.slept == pytest.approx(plan.cost.ttft_ms / 1000, abs=1e-9) and engine.metrics.lm_stored == 2000
    # The twin was busy for 0.2 s after arrival: only the rest of the model time is waited, not all of it again.
    fake.slept = 0.0
    sim, engine, plan = _admit(twin, "ep-a", prompt(2000), fake.now - 0.2)
    sim.until_first_token(engine, plan)
    assert fake.slept == pytest.approx(plan.cost.ttft_ms / 1000 - 0.2, abs=1e-9)
    # Busier than the whole model time: no wait at all, and the store still lands before the first token.
    fake.slept, stored = 0.0, engine.metrics.lm_stored
    sim, engine, plan = _admit(twin, "ep-a", prompt(2000), fake.now - 60)
    sim.until_first_token(engine, plan)
    assert fake.slept == 0.0 and engine.metrics.lm_stored == stored + 2000


def test_a_requests_model_ttft_is_seeded_by_the_request_not_by_thread_order():
    text = prompt(2000)
    factors = []
    for draws_before in (0, 7):  # other threads (pod names, hash roots) drawing from the twin's shared generator
        twin = ClusterTwin(name="c1", eks_name="c1-eks", region="us-west-2", store=KubeStore("c1"),
                           aws=None, clock=Clock(0.02), settings=SandboxSettings(),  # type: ignore[arg-type]
                           gpu_instance_type="ml.g5.4xlarge", gpu_nodes=["gpu-a"])
        twin.controllers.append(vllm.attach(twin))
        try:
            vllm_pod(twin, "ep-a", "gpu-a", [{"name": "PYTHONHASHSEED", "value": "0"}], mount=False)
            for _ in range(draws_before):
                twin.rng.random()
            _, _, plan = _admit(twin, "ep-a", text, time.monotonic() + 3600)  # never waited for
            factors.append(plan.cost.noise_factor)
        finally:
            twin.stop()
    assert factors[0] != 1.0 and factors[0] == factors[1]


@pytest.mark.parametrize("busy_s", [0.0, 0.3, 5.0])
def test_model_ttft_counts_from_when_the_api_server_read_the_request_not_from_when_a_busy_thread_got_to_it(
        twin_factory, kube, api, monkeypatch, busy_s):
    """Through the real API server and pod proxy: the handler thread is held ``busy_s`` after reading the request
    line (in authentication, before routing, the body and the pod). The first token still comes exactly the model
    TTFT after the API server read the request: the twin's delay is inside the model time, never added to it. One
    fake clock, moved only by sleeps, drives the server's stamp and the engine (no real waiting, no timing); 5 s is
    longer than the whole model TTFT, so the first token is then due at once. Fails if the stamp is ignored (the
    first token would come ``busy_s`` late)."""
    from kvfleet_sandbox.kube import server as kube_server

    _, server = kube
    twin = twin_factory()
    vllm_pod(twin, "ep-a", "gpu-a", BLOG_ENV)
    fake = _FakeTime()
    for module in (kube_server, vllm.engine, vllm.openai_http):
        monkeypatch.setattr(module, "time", fake)
    authenticate = server.authenticator.authenticate

    def busy_then_authenticate(header):  # type: ignore[no-untyped-def]
        fake.sleep(busy_s)  # the thread is busy elsewhere: the clock moves on
        return authenticate(header)

    monkeypatch.setattr(server.authenticator, "authenticate", busy_then_authenticate)
    sim = twin.services["vllm"]
    seen: dict = {}
    admit, until_first_token = sim.admit, sim.until_first_token

    def admit_spy(*args):  # type: ignore[no-untyped-def]
        seen["admitted_at"] = fake.now
        seen["plan"] = admit(*args)
        return seen["plan"]

    def first_token_spy(engine, plan):  # type: ignore[no-untyped-def]
        until_first_token(engine, plan)
        seen["first_token_at"] = fake.now

    monkeypatch.setattr(sim, "admit", admit_spy)
    monkeypatch.setattr(sim, "until_first_token", first_token_spy)
    read_at = fake.now  # nothing else moves the fake clock: the server stamps this value
    out = stream_completion(api, "ep-a", prompt(2000), max_tokens=1)
    assert out["ttft"] is not None and len(out["chunks"]) == 1
    plan = seen["plan"]
    assert seen["admitted_at"] == pytest.approx(read_at + busy_s)  # the delay did happen before the pod saw it
    assert plan.arrived == pytest.approx(read_at)
    assert seen["first_token_at"] - read_at == pytest.approx(max(plan.cost.ttft_ms / 1000, busy_s), abs=1e-9)


def test_the_model_clock_times_requests_by_the_model_whatever_the_machine_does(twin_factory, api, monkeypatch):
    """A test that judges a speedup reads the twin's model clock (``VllmSimulation.model_clock``): a request timed
    on it takes exactly its model TTFT, even when the machine stalls the twin for longer than the whole model time;
    only a first token moves it (the rest of a stream does not, so a client that reads late still reads the first
    token's time), the next request starts where it stands, and it never goes back. The machine's clock is a fake
    one that only sleeps move (as above): the stall is one second of it, not of waiting."""
    from kvfleet_sandbox.kube import server as kube_server

    twin = twin_factory()
    sim = twin.services["vllm"]
    a = vllm_pod(twin, "ep-a", "gpu-a", BLOG_ENV)
    b = vllm_pod(twin, "ep-b", "gpu-b", BLOG_ENV)
    fake = _FakeTime()
    for module in (kube_server, vllm.engine, vllm.openai_http):
        monkeypatch.setattr(module, "time", fake)
    costs, busy = [], []
    real = sim.until_first_token

    def stalled(engine, plan):  # type: ignore[no-untyped-def]
        costs.append(plan.cost)
        fake.sleep(1.0)  # a machine busy for longer than the cold model TTFT (~0.4 s)
        busy.append(fake.monotonic() - plan.arrived)  # how long after arrival the pod got to the first token
        real(engine, plan)

    monkeypatch.setattr(sim, "until_first_token", stalled)
    text = prompt(2000)
    cold = stream_completion(api, a, text, max_tokens=16, clock=sim.model_clock)
    after_cold = sim.model_clock()
    warm = stream_completion(api, b, text, max_tokens=16, clock=sim.model_clock)
    cold_cost, warm_cost = costs
    assert busy[0] > cold_cost.ttft_ms / 1000  # the stall outlasted the whole cold model TTFT
    assert cold["ttft"] == pytest.approx(cold_cost.ttft_ms / 1000, abs=1e-9)
    assert warm["ttft"] == pytest.approx(warm_cost.ttft_ms / 1000, abs=1e-9)
    assert after_cold == pytest.approx(cold_cost.ttft_ms / 1000, abs=1e-9)  # 15 more tokens did not move it
    assert sim.model_clock() == pytest.approx(after_cold + warm_cost.ttft_ms / 1000, abs=1e-9)
    assert warm["ttft"] < cold["ttft"]  # the L2 hit, judged by the model alone
    sim.model_clock.advance_to(0.0)
    assert sim.model_clock() == pytest.approx(after_cold + warm_cost.ttft_ms / 1000, abs=1e-9)  # never backwards
