"""Store-level behaviour the simulated controllers depend on: strategic-merge directives, the status
subresource, namespace and CRD deletion, and ``mutate`` bookkeeping. Driven through the official client where
an API path exists, through the store where only controllers would call it."""

from __future__ import annotations

import pytest
import yaml
from kube_manifests import DEPLOYMENT, IEC_CRD, TOKEN, iec
from kubernetes import client

from kvfleet_sandbox.kube import ApiError, KubeStore

pytestmark = pytest.mark.integration
SMP = "application/strategic-merge-patch+json"


def _deployment(store: KubeStore) -> dict:
    return store.create("apps", "deployments", yaml.safe_load(DEPLOYMENT))


def test_strategic_merge_directives():
    store = KubeStore("c")
    _deployment(store)
    spec = {"tolerations": [{"key": "gpu", "operator": "Exists"}],
            "containers": [{"name": "main", "ports": [{"containerPort": 80}, {"containerPort": 81}]}]}
    store.patch("apps", "deployments", "web", "default", {"spec": {"template": {"spec": spec}}}, SMP)
    patch = {"spec": {"template": {"spec": {
        "tolerations": [{"key": "other", "operator": "Exists"}],  # no merge key: replaced
        "$setElementOrder/containers": [{"name": "main"}, {"name": "side"}],
        "containers": [{"name": "main", "ports": [{"containerPort": 81, "protocol": "TCP"}]},
                       {"name": "side", "$patch": "delete"}],
        "volumes": [{"$patch": "replace"}, {"name": "only", "emptyDir": {}}]}}}}
    live = store.patch("apps", "deployments", "web", "default", patch, SMP)
    pod = live["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "other", "operator": "Exists"}]
    assert [c["name"] for c in pod["containers"]] == ["main"]
    assert pod["containers"][0]["ports"] == [{"containerPort": 80}, {"containerPort": 81, "protocol": "TCP"}]
    assert pod["volumes"] == [{"name": "only", "emptyDir": {}}]
    assert live["metadata"]["generation"] == 3


def test_status_subresource_is_separate_from_spec(kube):
    store, server = kube
    _deployment(store)
    cfg = client.Configuration()
    cfg.host = server.url
    cfg.api_key = {"authorization": f"Bearer {TOKEN}"}
    with client.ApiClient(cfg) as api:
        apps = client.AppsV1Api(api)
        dep = apps.patch_namespaced_deployment_status("web", "default", {"status": {"readyReplicas": 1},
                                                                         "spec": {"replicas": 9}})
        assert dep.status.ready_replicas == 1 and dep.spec.replicas == 1 and dep.metadata.generation == 1
        dep = apps.patch_namespaced_deployment("web", "default", {"status": {"readyReplicas": 7}})
        assert dep.status.ready_replicas == 1  # status written through the main resource is ignored


def test_namespace_and_crd_deletion_cascade():
    store = KubeStore("c")
    store.create("", "namespaces", {"metadata": {"name": "team"}})
    store.create("", "configmaps", {"metadata": {"name": "x", "namespace": "team"}})
    store.create("apiextensions.k8s.io", "customresourcedefinitions", yaml.safe_load(IEC_CRD.read_text()))
    store.create("inference.sagemaker.aws.amazon.com", "inferenceendpointconfigs",
                 {**yaml.safe_load(iec("e", "ml.g5.xlarge")), "metadata": {"name": "e", "namespace": "team"}})
    store.delete("", "namespaces", "team")
    assert store.get("", "configmaps", "x", "team") is None
    with pytest.raises(ApiError) as exc:
        store.create("", "configmaps", {"metadata": {"name": "x", "namespace": "team"}})
    assert exc.value.code == 404
    store.delete("apiextensions.k8s.io", "customresourcedefinitions",
                 "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com")
    with pytest.raises(ApiError) as exc:
        store.list("inference.sagemaker.aws.amazon.com", "inferenceendpointconfigs")
    assert exc.value.code == 404


def test_mutate_bookkeeping_and_optional_admission():
    store = KubeStore("c")
    created = _deployment(store)
    calls = []
    store.add_admission(lambda op, g, r, new, old: calls.append((op, r)) or new)
    unchanged = store.mutate("apps", "deployments", "web", "default", lambda o: None)
    assert unchanged["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]

    def scale_to_zero(obj):
        obj["spec"]["replicas"] = 0
        return obj

    after = store.mutate("apps", "deployments", "web", "default", scale_to_zero)
    assert after["metadata"]["generation"] == 2
    assert int(after["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert calls == []
    store.mutate("apps", "deployments", "web", "default", lambda o: {**o, "metadata": {**o["metadata"],
                                                                      "labels": {"a": "b"}}}, admission=True)
    assert calls == [("UPDATE", "deployments")]
    assert store.mutate("apps", "deployments", "absent", "default", scale_to_zero) is None
    assert store.request_counts() == {}


def test_the_store_hands_out_copies_that_share_nothing_with_what_it_holds():
    from kvfleet_sandbox.kube.documents import clone

    doc = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"items": [{"n": 1}, [2, 3]], "f": 1.5,
                                                                       "b": True, "z": None}}
    copied = clone(doc)
    assert copied == doc
    copied["metadata"]["labels"]["x"] = "2"
    copied["spec"]["items"][0]["n"] = 9
    copied["spec"]["items"][1].append(4)
    assert doc == {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"items": [{"n": 1}, [2, 3]], "f": 1.5,
                                                                               "b": True, "z": None}}
    odd = {"s": {1, 2}}  # not JSON: copied the slow, general way, still unshared
    assert clone(odd)["s"] is not odd["s"] and clone(odd) == odd

    store = KubeStore("c")
    store.create("", "configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": "c", "namespace": "default"}, "data": {"k": "v"}})
    listed = store.list("", "configmaps")
    listed[0]["data"]["k"] = "changed"
    got = store.get("", "configmaps", "c", "default")
    assert got["data"] == {"k": "v"}
    got["data"]["k"] = "changed"
    assert store.get("", "configmaps", "c", "default")["data"] == {"k": "v"}
