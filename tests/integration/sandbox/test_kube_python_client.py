"""The official Python ``kubernetes`` client against the Kubernetes emulator: selectors, paging, conflicts,
dry-run, watch, the CR scale subresource, pod logs and the streaming pod proxy; plus the store hooks
(admission, subscribe, mutate) the simulated controllers rely on."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
import yaml
from kube_manifests import IEC_CRD, TOKEN, admin_authenticator, iec
from kubernetes import client, watch

from kvfleet_sandbox.kube import ApiError, ProxyResponse

pytestmark = pytest.mark.integration
IEC = ("inference.sagemaker.aws.amazon.com", "v1", "inferenceendpointconfigs")


@pytest.fixture
def api(kube):
    _, server = kube
    cfg = client.Configuration()
    cfg.host = server.url
    cfg.api_key = {"authorization": f"Bearer {TOKEN}"}
    with client.ApiClient(cfg) as api_client:
        yield api_client


def _pod(name: str, labels: dict[str, str], node: str = "n1", phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "vllm",
                                                       "ports": [{"containerPort": 8000}]},
                                                      {"name": "sidecar", "image": "busybox"}]},
            "status": {"phase": phase}}


def test_list_with_label_and_field_selectors_and_paging(kube, api):
    store, _ = kube
    store.create("", "pods", _pod("a", {"app": "vllm", "tier": "gpu"}, node="n1"))
    store.create("", "pods", _pod("b", {"app": "vllm"}, node="n2", phase="Pending"))
    store.create("", "pods", _pod("c", {"app": "curvine"}, node="n1"))
    core = client.CoreV1Api(api)

    def names(**kw):
        return [p.metadata.name for p in core.list_namespaced_pod("default", **kw).items]

    assert names(label_selector="app=vllm") == ["a", "b"]
    assert names(label_selector="app in (vllm,curvine),tier") == ["a"]
    assert names(label_selector="app notin (vllm),!tier") == ["c"]
    assert names(label_selector="app!=vllm") == ["c"]
    assert names(field_selector="spec.nodeName=n1") == ["a", "c"]
    assert names(field_selector="status.phase=Pending,metadata.name=b") == ["b"]
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(label_selector="app==vllm").items] == ["a", "b"]

    first = core.list_namespaced_pod("default", limit=2)
    assert [p.metadata.name for p in first.items] == ["a", "b"] and first.metadata.remaining_item_count == 1
    rest = core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["c"] and not rest.metadata._continue
    assert store.request_counts()[("list", "pods")] == 9


def test_stale_resource_version_is_a_409(api):
    core = client.CoreV1Api(api)
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}, "data": {"k": "1"}})
    cm.data = {"k": "2"}
    updated = core.replace_namespaced_config_map("cm", "default", cm)
    assert int(updated.metadata.resource_version) > int(cm.metadata.resource_version)
    cm.data = {"k": "3"}  # still carries the old resourceVersion
    with pytest.raises(client.ApiException) as exc:
        core.replace_namespaced_config_map("cm", "default", cm)
    assert exc.value.status == 409 and "the object has been modified" in exc.value.body
    with pytest.raises(client.ApiException) as exc:
        core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    assert exc.value.status == 409 and "AlreadyExists" in exc.value.body


def test_generation_tracks_spec_not_metadata(api):
    apps = client.AppsV1Api(api)
    body = yaml.safe_load(open_manifest())
    dep = apps.create_namespaced_deployment("default", body)
    assert dep.metadata.generation == 1
    dep = apps.patch_namespaced_deployment("web", "default", {"metadata": {"labels": {"x": "y"}}})
    assert dep.metadata.generation == 1
    dep = apps.patch_namespaced_deployment("web", "default", [{"op": "replace", "path": "/spec/replicas",
                                                              "value": 5}])
    assert dep.metadata.generation == 2 and dep.spec.replicas == 5
    scale = apps.read_namespaced_deployment_scale("web", "default")
    assert scale.spec.replicas == 5 and scale.status.selector == "app=web"


def open_manifest() -> str:
    from kube_manifests import DEPLOYMENT
    return DEPLOYMENT


def test_server_dry_run_validates_and_stores_nothing(kube, api):
    store, _ = kube
    core = client.CoreV1Api(api)
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "dry"}}, dry_run="All")
    assert created.metadata.uid and store.get("", "configmaps", "dry", "default") is None
    with pytest.raises(client.ApiException) as exc:
        core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "x"}]}},
                                   dry_run="All")
    assert exc.value.status == 422 and "spec.containers[0].image: Required value" in exc.value.body


def test_custom_resource_scale_subresource_and_validation(kube, api):
    store, _ = kube
    ext = client.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition(yaml.safe_load(IEC_CRD.read_text()))
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(*IEC[:2], "default", IEC[2], yaml.safe_load(iec("e1", "ml.g5.8xlarge")))
    scale = custom.patch_namespaced_custom_object_scale(*IEC[:2], "default", IEC[2], "e1",
                                                        {"spec": {"replicas": 0}})
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 0
    assert store.get(IEC[0], IEC[2], "e1", "default")["spec"]["replicas"] == 0
    store.mutate(IEC[0], IEC[2], "e1", "default",
                 lambda o: {**o, "status": {"replicas": 2, "selector": "app=e1"}})
    scale = custom.get_namespaced_custom_object_scale(*IEC[:2], "default", IEC[2], "e1")
    assert scale["status"] == {"replicas": 2, "selector": "app=e1"}
    with pytest.raises(client.ApiException) as exc:
        custom.patch_namespaced_custom_object(*IEC[:2], "default", IEC[2], "e1",
                                              {"spec": {"replicas": "three"}})
    assert exc.value.status == 422 and "spec.replicas" in exc.value.body and "integer" in exc.value.body


def test_watch_streams_events_after_a_list(kube, api):
    store, _ = kube
    core = client.CoreV1Api(api)
    listed = core.list_namespaced_config_map("default")
    seen: list[tuple[str, str]] = []
    watchers_before = len(store._watchers)
    unwatched: list[str] = []

    def produce():
        # change the config maps once the server holds the watch open (not after a fixed time): live events
        deadline = time.monotonic() + 30
        while len(store._watchers) <= watchers_before:
            if time.monotonic() > deadline:
                unwatched.append("the watch never reached the server in 30 s")
                return
            time.sleep(0.01)
        store.create("", "configmaps", {"metadata": {"name": "w1", "namespace": "default"}})
        store.patch("", "configmaps", "w1", "default", {"data": {"a": "b"}}, "application/merge-patch+json")
        store.delete("", "configmaps", "w1", "default")

    producer = threading.Thread(target=produce)
    producer.start()
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_config_map, "default", timeout_seconds=60,  # a hang guard
                          resource_version=listed.metadata.resource_version):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 3:
            w.stop()
    producer.join(30)
    assert not unwatched, unwatched
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


def test_pod_logs_honour_since_time_and_tail(kube, api):
    store, _ = kube
    store.create("", "pods", _pod("vllm-0", {"app": "vllm"}))
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    lines = [(base + dt.timedelta(minutes=i), f"line {i} LMCache hit\n") for i in range(5)]
    calls = []

    def source(namespace, pod, container, since_time, since_seconds, tail_lines):
        calls.append((namespace, pod, container, since_time, since_seconds, tail_lines))
        return "".join(text for ts, text in lines if since_time is None or ts >= since_time)

    store.register_log_source(source)
    core = client.CoreV1Api(api)
    # The generated client has no sinceTime argument (the API has); product code goes through call_api.
    resp = api.call_api("/api/v1/namespaces/{namespace}/pods/{name}/log", "GET",
                        {"namespace": "default", "name": "vllm-0"},
                        [("container", "vllm"), ("sinceTime", "2026-01-01T00:03:00Z")],
                        {"Accept": "*/*"}, auth_settings=["BearerToken"], _preload_content=False)
    assert resp.data.decode() == "line 3 LMCache hit\nline 4 LMCache hit\n"
    assert calls[-1][:4] == ("default", "vllm-0", "vllm", base + dt.timedelta(minutes=3))
    # kubernetes 36 returns str(bytes) for text bodies unless the content is read raw.
    tail = core.read_namespaced_pod_log("vllm-0", "default", container="vllm", tail_lines=1,
                                        _preload_content=False)
    assert tail.data.decode() == "line 4 LMCache hit\n"
    with pytest.raises(client.ApiException) as exc:
        core.read_namespaced_pod_log("vllm-0", "default", container="nope")
    assert exc.value.status == 400


def test_pod_proxy_streams_chunks_as_they_are_produced(kube, api):
    store, _ = kube
    store.create("", "pods", _pod("vllm-0", {"app": "vllm"}))
    produced_last = threading.Event()
    first_read = threading.Event()
    received = []

    def handler(namespace, pod, port, method, path, query, headers, body):
        if (pod, port, path) != ("vllm-0", 8000, "/v1/completions"):
            return None

        def chunks():
            yield f"data: {method} {query} {body.decode()}\n\n".encode()
            # the last chunk only once the client holds the first: a proxy that buffered the whole body would
            # hold the first back, and the client would see the last produced before it (a hang guard of 30 s)
            first_read.wait(30)
            produced_last.set()
            yield b"data: [DONE]\n\n"
        return ProxyResponse(200, {"Content-Type": "text/event-stream"}, chunks())

    store.register_pod_proxy(handler)
    resp = client.CoreV1Api(api).connect_post_namespaced_pod_proxy_with_path(
        "vllm-0:8000", "default", "v1/completions", _preload_content=False)
    stream = resp.stream(64)
    first = next(stream)
    received.append(produced_last.is_set())
    first_read.set()
    rest = b"".join(stream)
    assert first.startswith(b"data: POST") and received == [False]
    assert rest.endswith(b"data: [DONE]\n\n")

    # Query string and body pass through; without a port the first container port (8000) is used.
    resp = api.call_api("/api/v1/namespaces/{namespace}/pods/{name}/proxy/v1/completions", "POST",
                        {"namespace": "default", "name": "vllm-0"}, [("stream", "true")],
                        {"Content-Type": "application/json"}, body={"prompt": "hi"},
                        auth_settings=["BearerToken"], _preload_content=False)
    assert resp.data.startswith(b'data: POST stream=true {"prompt": "hi"}')
    # No handler answers for this path → 503 with a Status body.
    with pytest.raises(client.ApiException) as exc:
        client.CoreV1Api(api).connect_get_namespaced_pod_proxy_with_path("vllm-0", "default", "other")
    assert exc.value.status == 503
    assert store.request_counts()[("create", "pods/proxy")] == 2


def test_stop_ends_open_watches_and_closes_the_port(api):
    import socket

    from kvfleet_sandbox.kube import KubeApiServer, KubeStore
    store = KubeStore("other")
    server = KubeApiServer(store, authenticator=admin_authenticator())
    server.start()
    cfg = client.Configuration()
    cfg.host = server.url
    cfg.api_key = {"authorization": f"Bearer {TOKEN}"}
    ended = threading.Event()
    failure: list[BaseException] = []

    def watch_forever():
        try:
            with client.ApiClient(cfg) as c:
                # its own timeout is far beyond every bound below: only the server's stop can end it in time
                for _ in watch.Watch().stream(client.CoreV1Api(c).list_namespace, timeout_seconds=3600):
                    pass
        except BaseException as exc:  # recorded: the assertion below names it
            failure.append(exc)
        finally:
            ended.set()

    watcher = threading.Thread(target=watch_forever, daemon=True)
    watcher.start()
    # Stop only once the server holds the watch open: a fixed sleep raced a slow CI worker,
    # which stopped the server before the watch connected (connection refused, not a watch ended).
    deadline = time.monotonic() + 30
    while not store._watchers and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store._watchers, "the watch never reached the server"
    stopper = threading.Thread(target=server.stop, daemon=True)
    stopper.start()
    stopper.join(60)  # a hang guard, not a timing: stop() ends the watch rather than waiting for it
    assert not stopper.is_alive(), "server.stop() did not return: it waits on the open watch instead of ending it"
    assert ended.wait(60), "the watch did not end when the server stopped"
    assert not failure, f"the watch ended with an error instead of cleanly: {failure!r}"
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=1):
        pass


def test_invalid_or_missing_token_is_a_401(kube):
    store, server = kube
    cfg = client.Configuration()
    cfg.host = server.url
    cfg.api_key = {"authorization": "Bearer not-an-eks-token"}
    with client.ApiClient(cfg) as bad, pytest.raises(client.ApiException) as exc:
        client.CoreV1Api(bad).list_namespace()
    assert exc.value.status == 401
    assert [r.verb for r in store.request_log] == ["unauthorized"] and not store.request_counts()
    cfg.api_key = {}
    with client.ApiClient(cfg) as anon, pytest.raises(client.ApiException) as exc:
        client.CoreV1Api(anon).list_namespace()
    assert exc.value.status == 401


def test_fault_injection_returns_a_status(kube, api):
    _, server = kube
    server.error_rate = 1.0
    with pytest.raises(client.ApiException) as exc:
        client.CoreV1Api(api).list_namespace()
    assert exc.value.status in (500, 503) and "injected fault" in exc.value.body


def test_admission_hooks_run_for_api_and_store_writes_but_not_mutate(kube, api):
    store, _ = kube
    events = []
    store.subscribe(lambda kind, group, resource, obj: events.append((kind, resource, obj["metadata"]["name"])))

    def kyverno(op, group, resource, new, old):
        if resource == "configmaps":
            if (new.get("data") or {}).get("forbidden"):
                raise ApiError(400, "BadRequest", "admission webhook denied the request: forbidden key")
            new.setdefault("metadata", {}).setdefault("labels", {})["mutated-by"] = "kyverno"
        return new

    store.add_admission(kyverno)
    cm = client.CoreV1Api(api).create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    assert cm.metadata.labels == {"mutated-by": "kyverno"}
    store.create("", "configmaps", {"metadata": {"name": "b", "namespace": "default"}})
    assert store.get("", "configmaps", "b", "default")["metadata"]["labels"] == {"mutated-by": "kyverno"}
    with pytest.raises(ApiError) as exc:
        store.update("", "configmaps", {"metadata": {"name": "b", "namespace": "default"},
                                        "data": {"forbidden": "1"}})
    assert exc.value.code == 400
    store.mutate("", "configmaps", "b", "default", lambda o: {**o, "metadata": {**o["metadata"], "labels": {}}})
    assert store.get("", "configmaps", "b", "default")["metadata"]["labels"] == {}
    assert events == [("ADDED", "configmaps", "a"), ("ADDED", "configmaps", "b"), ("MODIFIED", "configmaps", "b")]
