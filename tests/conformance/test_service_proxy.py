"""The emulator's Service proxy follows kube-apiserver's ResourceLocation and the endpoints controller's readiness
rule (facts: tests/conformance/facts/service_proxy.yaml).

Each test starts one emulator on 127.0.0.1 with an admin token and a pod-proxy handler that answers with the pod
and port it was reached on, so the routing decision is visible in every response; the simulated vLLM sits behind
the same hook in the sandbox (tests/integration/sandbox/test_service_proxy_vllm.py).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet_sandbox.kube import KubeApiServer, KubeStore, ProxyResponse
from kvfleet_sandbox.kube.auth import Authenticator, UserInfo
from kvfleet_sandbox.kube.services import endpoints_of, split_scheme_name_port
from kvfleet_sandbox.kube.store import now_rfc3339

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "service_proxy.yaml").read_text())
TOKEN = "admin.service-proxy"
NS = "team-a"


@pytest.fixture
def kube() -> Iterator[tuple[KubeStore, KubeApiServer]]:
    store = KubeStore("conformance")
    server = KubeApiServer(store, authenticator=Authenticator(
        static_tokens={TOKEN: UserInfo("admin", ("system:masters",))}))

    def echo(namespace: str, pod: str, port: int, method: str, path: str, query: str, headers: dict[str, str],
             body: Any) -> ProxyResponse | None:
        if store.get("", "pods", pod, namespace) is None:
            return None
        if pod.startswith("vanishing-"):  # deleted while the request is on its way (the twin deletes at once)
            store.delete("", "pods", pod, namespace)
            return None
        return ProxyResponse(200, {"Content-Type": "application/json"},
                             json.dumps({"pod": pod, "port": port, "method": method, "path": path}).encode())

    store.register_pod_proxy(echo)
    store.create("", "namespaces", {"metadata": {"name": NS}})
    server.start()
    try:
        yield store, server
    finally:
        server.stop()


def call(server: KubeApiServer, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def pod(store: KubeStore, name: str, *, ready: bool = True, phase: str = "Running", ip: str | None = "10.1.0.5",
        terminating: bool = False, app: str = "qwen") -> None:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": {"app": app}}
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip:
        status["podIP"] = ip
    store.create("", "pods", {"metadata": meta, "spec": {"containers": [
        {"name": app, "image": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}]}, "status": status})
    if terminating:  # what a graceful delete sets first (the create path drops it, as the apiserver does)
        store.mutate("", "pods", name, NS, lambda p: {**p, "metadata": {**p["metadata"],
                                                                        "deletionTimestamp": now_rfc3339()}})


def service(store: KubeStore, name: str = "qwen", *, port_name: str = "http", target: Any = 8000,
            kind: str = "ClusterIP") -> None:
    store.create("", "services", {"metadata": {"name": name, "namespace": NS}, "spec": {
        "type": kind, "selector": {"app": "qwen"},
        "ports": [{"name": port_name, "port": 8000, "protocol": "TCP", "targetPort": target}]}})


def proxy(server: KubeApiServer, service_id: str, path: str = "v1/models", method: str = "GET",
          body: Any = None) -> tuple[int, dict[str, Any]]:
    return call(server, method, f"/api/v1/namespaces/{NS}/services/{service_id}/proxy/{path}", body)


# --- the id ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("service_id", "expected"), [
    ("qwen", ("", "qwen", "")), ("qwen:8000", ("", "qwen", "8000")), ("qwen:http", ("", "qwen", "http")),
    ("http:qwen:8000", ("http", "qwen", "8000")), ("https:qwen:http", ("https", "qwen", "http"))])
def test_id_forms_are_name_name_port_and_scheme_name_port(service_id: str, expected: tuple[str, str, str]) -> None:
    assert FACTS["resource_location"]["id_forms"] == ["name", "name:port", "scheme:name:port"]
    assert split_scheme_name_port(service_id) == expected


@pytest.mark.parametrize("service_id", ["ftp:qwen:8000", "a:b:c:d", ":8000"])
def test_an_invalid_id_is_400(kube: tuple[KubeStore, KubeApiServer], service_id: str) -> None:
    store, server = kube
    service(store)
    code, status = proxy(server, service_id)
    assert code == FACTS["resource_location"]["invalid_id"]["code"] == 400
    assert status["message"] == f'invalid service request "{service_id}"'


@pytest.mark.parametrize("service_id", ["qwen:8000", "qwen:http", "http:qwen:8000", "http:qwen:http"])
def test_every_id_form_reaches_a_ready_pod_on_the_target_port(kube: tuple[KubeStore, KubeApiServer],
                                                              service_id: str) -> None:
    store, server = kube
    service(store, target="http")  # a named targetPort resolves to the container port of that name
    pod(store, "qwen-a")
    code, body = proxy(server, service_id, "v1/completions", "POST", {"prompt": "hi"})
    assert code == 200
    assert body == {"pod": "qwen-a", "port": 8000, "method": "POST", "path": "/v1/completions"}


def test_a_bare_name_matches_only_an_unnamed_service_port(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    service(store, port_name="http")
    pod(store, "qwen-a")
    code, status = proxy(server, "qwen")
    assert (code, status["message"]) == (503, 'no endpoints available for service "qwen"')
    store.delete("", "services", "qwen", NS)
    service(store, port_name="")
    assert proxy(server, "qwen")[1]["pod"] == "qwen-a"


def test_an_undeclared_port_number_is_503(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    service(store)
    pod(store, "qwen-a")
    code, status = proxy(server, "qwen:9000")
    assert code == FACTS["resource_location"]["port_number_not_declared"]["code"] == 503
    assert status["message"] == 'no service port 9000 found for service "qwen"'


def test_an_unknown_service_is_404(kube: tuple[KubeStore, KubeApiServer]) -> None:
    _, server = kube
    assert proxy(server, "nope:8000")[0] == 404


def test_external_name_services_are_not_proxied(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    service(store, kind="ExternalName")
    pod(store, "qwen-a")
    assert "ExternalName" not in FACTS["resource_location"]["proxyable_types"]
    assert proxy(server, "qwen:8000")[0] == 503


# --- readiness -------------------------------------------------------------------------------------------------


def test_only_ready_pods_that_are_not_terminating_take_requests(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    service(store)
    pod(store, "qwen-ready")
    pod(store, "qwen-starting", ready=False)
    pod(store, "qwen-terminating", terminating=True)
    pod(store, "qwen-failed", phase="Failed")
    pod(store, "qwen-no-ip", ip=None)
    pod(store, "other", app="other")
    reached = {proxy(server, "qwen:8000")[1]["pod"] for _ in range(30)}
    assert reached == {"qwen-ready"}

    (subset,) = endpoints_of(store, store.get("", "services", "qwen", NS) or {})["subsets"]
    assert [a["targetRef"]["name"] for a in subset["addresses"]] == ["qwen-ready"]
    assert [a["targetRef"]["name"] for a in subset["notReadyAddresses"]] == ["qwen-starting"]
    assert subset["ports"] == [{"name": "http", "port": 8000, "protocol": "TCP"}]


def test_no_ready_pod_is_503_no_endpoints_available(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    service(store)
    code, status = proxy(server, "qwen:8000")
    assert (code, status["message"]) == (503, 'no endpoints available for service "qwen"')
    pod(store, "qwen-starting", ready=False)
    code, status = proxy(server, "qwen:8000")
    assert (code, status["reason"]) == (503, "ServiceUnavailable")
    assert status["message"] == 'no endpoints available for service "qwen:8000"'


def test_requests_spread_over_every_ready_pod_and_leave_a_deleted_one(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    service(store)
    for name in ("qwen-a", "qwen-b"):
        pod(store, name)
    assert {proxy(server, "qwen:8000")[1]["pod"] for _ in range(40)} == {"qwen-a", "qwen-b"}
    store.delete("", "pods", "qwen-a", NS)
    assert {proxy(server, "qwen:8000")[1]["pod"] for _ in range(10)} == {"qwen-b"}


def test_patch_is_not_a_proxied_method(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    service(store)
    pod(store, "qwen-a")
    assert "PATCH" not in FACTS["proxy_path"]["methods"]
    assert proxy(server, "qwen:8000", method="PATCH", body={})[0] == 405


def test_a_pod_deleted_while_a_request_is_on_its_way_does_not_fail_it(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    service(store)
    pod(store, "vanishing-a")
    pod(store, "qwen-b")
    assert "grace period" in FACTS["endpoints_readiness"]["emulator_deleted_in_flight"]
    answers = [proxy(server, "qwen:8000") for _ in range(10)]
    assert {code for code, _ in answers} == {200} and {body["pod"] for _, body in answers} == {"qwen-b"}
    assert store.get("", "pods", "vanishing-a", NS) is None
