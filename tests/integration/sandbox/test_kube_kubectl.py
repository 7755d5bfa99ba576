"""The real kubectl against the Kubernetes emulator: discovery, apply, strategic patches, scale, delete, CRDs."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml
from kube_manifests import DEPLOYMENT, IEC_CRD, TOOLS, iec

pytestmark = pytest.mark.integration


def test_get_nodes_lists_a_node_created_through_the_store(kube, run):
    store, _ = kube
    store.create("", "nodes", {"metadata": {"name": "gpu-node-1", "labels": {"nvidia.com/gpu.present": "true"}},
                               "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    store.reset_request_log()
    out = run("kubectl", "get", "nodes").stdout
    assert "gpu-node-1" in out and "Ready" in out
    # Discovery is logged but kept out of the per-resource counts.
    assert dict(store.request_counts()) == {("list", "nodes"): 1}
    assert any(r.verb == "discovery" and r.user_agent.startswith("kubectl/") for r in store.request_log)
    names = run("kubectl", "get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", "name").stdout.split()
    assert names == ["node/gpu-node-1"]
    assert run("kubectl", "get", "nodes", "-l", "nvidia.com/gpu.present!=true", "-o", "name").stdout == ""


def test_apply_patch_scale_delete_a_deployment(kube, run):
    store, _ = kube
    assert "deployment.apps/web created" in run("kubectl", "apply", "-f", "-", stdin=DEPLOYMENT).stdout
    assert "unchanged" in run("kubectl", "apply", "-f", "-", stdin=DEPLOYMENT).stdout
    assert "web" in run("kubectl", "get", "deployment", "web").stdout
    generation = store.get("apps", "deployments", "web", "default")["metadata"]["generation"]

    patch = {"spec": {"template": {"spec": {
        "containers": [{"name": "main", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}],
                        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
        "volumes": [{"name": "cache", "emptyDir": {}}]}}}}
    run("kubectl", "patch", "deployment", "web", "--type=strategic", "-p", json.dumps(patch))
    run("kubectl", "scale", "deployment", "web", "--replicas=3")

    live = yaml.safe_load(run("kubectl", "get", "deployment", "web", "-o", "yaml").stdout)
    pod = live["spec"]["template"]["spec"]
    main, side = pod["containers"]
    assert side["name"] == "side"  # merged by name, not replaced
    assert main["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}]
    assert [m["mountPath"] for m in main["volumeMounts"]] == ["/data", "/cache"]
    assert [v["name"] for v in pod["volumes"]] == ["data", "cache"]
    assert live["spec"]["replicas"] == 3
    assert live["metadata"]["generation"] == generation + 2

    delete_env = {"spec": {"template": {"spec": {"containers": [
        {"name": "main", "env": [{"name": "A", "$patch": "delete"}]}]}}}}
    run("kubectl", "patch", "deployment", "web", "--type=strategic", "-p", json.dumps(delete_env))
    env = store.get("apps", "deployments", "web", "default")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["B", "C"]

    assert "deleted" in run("kubectl", "delete", "deployment", "web").stdout
    assert store.get("apps", "deployments", "web", "default") is None
    assert "NotFound" in run("kubectl", "get", "deployment", "web", check=False).stderr


def test_server_dry_run_stores_nothing(kube, run):
    store, _ = kube
    out = run("kubectl", "apply", "--dry-run=server", "-f", "-", stdin=DEPLOYMENT).stdout
    assert "(server dry run)" in out
    assert store.get("apps", "deployments", "web", "default") is None
    assert any(r.dry_run and r.resource == "deployments" for r in store.request_log)


def test_invalid_deployment_is_refused_with_a_status(kube, run):
    bad = DEPLOYMENT.replace("        image: nginx:1\n", "")
    proc = run("kubectl", "apply", "-f", "-", stdin=bad, check=False)
    assert proc.returncode != 0
    assert "spec.template.spec.containers[0].image: Required value" in proc.stderr


def test_namespace_must_exist(kube, run):
    proc = run("kubectl", "apply", "-n", "nowhere", "-f", "-", stdin=DEPLOYMENT.replace("  namespace: default\n", ""),
               check=False)
    assert 'namespaces "nowhere" not found' in proc.stderr


def test_real_iec_crd_validates_custom_resources(kube, run):
    store, _ = kube
    run("kubectl", "apply", "-f", str(IEC_CRD))
    assert "inferenceendpointconfigs" in run("kubectl", "api-resources").stdout

    run("kubectl", "apply", "-f", "-", stdin=iec("good", "ml.g5.xlarge"))
    live = store.get("inference.sagemaker.aws.amazon.com", "inferenceendpointconfigs", "good", "default")
    assert live["spec"]["invocationEndpoint"] == "invocations"  # schema default applied

    proc = run("kubectl", "apply", "-f", "-", stdin=iec("bad", "g5"), check=False)
    assert proc.returncode != 0
    assert ('The InferenceEndpointConfig "bad" is invalid: spec.instanceType: Invalid value: "g5": '
            "spec.instanceType in body should match '^ml\\..*'") in proc.stderr
    assert store.get("inference.sagemaker.aws.amazon.com", "inferenceendpointconfigs", "bad", "default") is None

    proc = run("kubectl", "patch", "inferenceendpointconfig", "good", "--type=strategic", "-p",
               '{"spec":{"replicas":1}}', check=False)
    assert "UnsupportedMediaType" in proc.stderr or "not supported" in proc.stderr

    run("kubectl", "scale", "inferenceendpointconfig", "good", "--replicas=4")
    scale = json.loads(run("kubectl", "get", "--raw",
                           "/apis/inference.sagemaker.aws.amazon.com/v1/namespaces/default/"
                           "inferenceendpointconfigs/good/scale").stdout)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 4
    alpha = run("kubectl", "get", "inferenceendpointconfigs.v1alpha1.inference.sagemaker.aws.amazon.com", "good",
                "-o", "jsonpath={.apiVersion}").stdout
    assert alpha == "inference.sagemaker.aws.amazon.com/v1alpha1"


def test_get_watch_streams_changes(kube, run, kubeconfig):
    store, _ = kube
    store.create("", "configmaps", {"metadata": {"name": "a", "namespace": "default"}, "data": {"k": "1"}})
    watchers_before = len(store._watchers)
    proc = subprocess.Popen([str(TOOLS / "kubectl"), "get", "configmaps", "-w", "--request-timeout=5s",
                             "-o", "name"], env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "configmap/a"
        # b is created once kubectl's watch is open on the server (not after a fixed time): a live event
        deadline = time.monotonic() + 30
        while len(store._watchers) <= watchers_before:
            assert proc.poll() is None, f"kubectl ended before it watched: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "kubectl's watch never reached the server in 30 s"
            time.sleep(0.01)
        store.create("", "configmaps", {"metadata": {"name": "b", "namespace": "default"}})
        assert proc.stdout.readline().strip() == "configmap/b"
    finally:
        proc.kill()
        proc.wait()


def test_create_generators_send_protobuf_that_the_emulator_decodes(kube, run):
    import base64
    store, _ = kube
    run("kubectl", "create", "namespace", "team")
    run("kubectl", "-n", "team", "create", "secret", "generic", "s", "--from-literal=token=abc")
    run("kubectl", "-n", "team", "label", "secret", "s", "tier=gpu")
    secret = store.get("", "secrets", "s", "team")
    assert base64.b64decode(secret["data"]["token"]) == b"abc" and secret["type"] == "Opaque"
    assert secret["metadata"]["labels"] == {"tier": "gpu"}
    run("kubectl", "delete", "namespace", "team")
    assert store.get("", "secrets", "s", "team") is None
