"""Simulated Kyverno through kubectl and the official client: a ClusterPolicy's patchStrategicMerge injects the Curvine
L2 URL, volume and mount into the operator's Deployment, replacing the operator's URL in place, and the injection
survives a forced re-render (the blog's production recommendation, docs/reference/kyverno.md); plus anchors, selectors,
auto-gen from Pod rules, and refusal of an invalid policy."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from kubernetes import client

from kvfleet.fleet.constants import OPERATOR_ADDON
from kvfleet_sandbox.runtime import Sandbox

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
CLUSTER = "ky-1"
FLEET = f"""
clusters:
  - name: {CLUSTER}
    region: us-east-1
    gpu_nodes: {{count: 3, instance_type: ml.g5.4xlarge}}
"""
FAST = {"time_scale": 0.01, "pod_startup_s": 10.0, "cluster_update_delay_s": 5.0, "operator_resync_s": 15.0}
FS_URL = "fs://localhost:0/mnt/curvine/l2cache/"
POLICY = """apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: curvine-l2-inject
spec:
  rules:
  - name: curvine-l2
    match:
      any:
      - resources:
          kinds: [Deployment]
          selector:
            matchLabels:
              tiered-kv/l2: curvine
    mutate:
      patchStrategicMerge:
        spec:
          template:
            spec:
              containers:
              - (name): "{container}"
                env:
                - name: LMCACHE_REMOTE_URL
                  value: fs://localhost:0/mnt/curvine/l2cache/
                - name: PYTHONHASHSEED
                  value: "0"
                volumeMounts:
                - name: curvine-cache
                  mountPath: /mnt/curvine/l2cache
              volumes:
              - name: curvine-cache
                persistentVolumeClaim:
                  claimName: curvine-pvc
"""


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.03)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def sb(sandbox_factory) -> Sandbox:
    return sandbox_factory(FLEET, controllers=("workloads", "operator", "kyverno"), **FAST)


@pytest.fixture
def kubectl(sb: Sandbox) -> Callable[..., subprocess.CompletedProcess[str]]:
    if not KUBECTL.exists():
        pytest.skip("kubectl missing: run tools/fetch-k8s-binaries.sh")

    def run(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(sb.kubeconfig), "--context", CLUSTER, *args],
                              capture_output=True, text=True, timeout=60, input=stdin)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc
    return run


@pytest.fixture
def apps(sb: Sandbox, kube_api) -> client.AppsV1Api:
    return client.AppsV1Api(kube_api(sb, CLUSTER))


def deployment(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": name, **labels}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, **labels}}, "spec": {"containers": [
                         {"name": name, "image": "vllm", "env": [
                             {"name": "A", "value": "1"},
                             {"name": "LMCACHE_REMOTE_URL", "value": "sagemaker-hyperpod://$(NODE_IP):9200"},
                             {"name": "B", "value": "2"}]},
                         {"name": "reverse-proxy", "image": "proxy"}]}}}}


def container_env(dep: Any, index: int = 0) -> list[tuple[str, str]]:
    return [(e.name, e.value) for e in dep.spec.template.spec.containers[index].env or []]


def test_policy_replaces_the_url_in_place_and_targets_only_the_anchored_container(sb, kubectl, apps) -> None:
    kubectl("apply", "-f", "-", stdin=POLICY.format(container="ep"))
    assert kubectl("get", "cpol", "curvine-l2-inject", "-o", "jsonpath={.status.ready}").stdout == "true"
    apps.create_namespaced_deployment("default", deployment("ep", {"tiered-kv/l2": "curvine"}))
    dep = apps.read_namespaced_deployment("ep", "default")
    assert container_env(dep) == [("A", "1"), ("LMCACHE_REMOTE_URL", FS_URL), ("B", "2"), ("PYTHONHASHSEED", "0")]
    assert [(m.name, m.mount_path) for m in dep.spec.template.spec.containers[0].volume_mounts] == \
        [("curvine-cache", "/mnt/curvine/l2cache")]
    assert dep.spec.template.spec.containers[1].env is None  # the sidecar is not the anchored container
    assert [v.persistent_volume_claim.claim_name for v in dep.spec.template.spec.volumes] == ["curvine-pvc"]
    apps.create_namespaced_deployment("default", deployment("plain", {"tiered-kv/l2": "none"}))
    plain = apps.read_namespaced_deployment("plain", "default")
    assert ("LMCACHE_REMOTE_URL", "sagemaker-hyperpod://$(NODE_IP):9200") in container_env(plain)
    assert plain.spec.template.spec.volumes is None
    # The same policy applies on every update: a kubectl patch putting the operator URL back is re-mutated.
    kubectl("set", "env", "deployment/ep", "-c", "ep", "LMCACHE_REMOTE_URL=sagemaker-hyperpod://$(NODE_IP):9200")
    assert dict(container_env(apps.read_namespaced_deployment("ep", "default")))["LMCACHE_REMOTE_URL"] == FS_URL


def test_wildcard_anchor_mutates_every_container_and_pod_rules_autogen_to_deployments(sb, kubectl, apps) -> None:
    kubectl("apply", "-f", "-", stdin=POLICY.format(container="?*"))
    apps.create_namespaced_deployment("default", deployment("all", {"tiered-kv/l2": "curvine"}))
    dep = apps.read_namespaced_deployment("all", "default")
    assert dict(container_env(dep, 1)) == {"LMCACHE_REMOTE_URL": FS_URL, "PYTHONHASHSEED": "0"}
    kubectl("apply", "-f", "-", stdin="""apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {name: pod-seed}
spec:
  rules:
  - name: seed
    match: {any: [{resources: {kinds: [Pod], namespaces: [team-*]}}]}
    mutate:
      patchStrategicMerge:
        spec:
          containers:
          - (name): "*"
            env:
            - {name: SEED_FROM_POD_RULE, value: "yes"}
""")
    kubectl("create", "namespace", "team-a")
    body = deployment("t", {})
    body["metadata"]["namespace"] = "team-a"
    apps.create_namespaced_deployment("team-a", body)
    made = apps.read_namespaced_deployment("t", "team-a")
    assert all(dict(container_env(made, i)).get("SEED_FROM_POD_RULE") == "yes" for i in (0, 1))
    untouched = apps.read_namespaced_deployment("all", "default")  # policies apply to later writes only
    assert "SEED_FROM_POD_RULE" not in dict(container_env(untouched))


def test_an_invalid_policy_is_refused(sb, kubectl) -> None:
    out = kubectl("apply", "-f", "-", check=False, stdin="""apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {name: broken}
spec:
  rules:
  - mutate: {patchStrategicMerge: {spec: {}}}
""")
    assert out.returncode != 0
    assert "spec.rules[0].name: Required value" in out.stderr and "spec.rules[0].match: Required value" in out.stderr


def test_policy_injection_survives_a_forced_operator_rerender(sb, kubectl, apps, kube_api) -> None:
    twin = sb.twin(CLUSTER)
    env = sb.exports()
    eks = boto3.client("eks", region_name="us-east-1", endpoint_url=env["AWS_ENDPOINT_URL"],
                       aws_access_key_id="sandbox", aws_secret_access_key="sandbox")
    for name in ("aws-mountpoint-s3-csi-driver", "aws-fsx-csi-driver", "metrics-server", "cert-manager",
                 OPERATOR_ADDON):
        eks.create_addon(clusterName=f"{CLUSTER}-eks", addonName=name)
        wait_for(name, lambda n=name: twin.aws.addon_status(f"{CLUSTER}-eks", n) == "ACTIVE")
    operator = twin.services["operator"]
    wait_for("operator ready", operator.controller_ready)
    twin.services["curvine"] = type("MasterUp", (), {"master_running": staticmethod(lambda: True)})()
    kubectl("apply", "-f", "-", stdin="""apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: curvine-sc}
provisioner: curvine
parameters: {master-addrs: "curvine-master-0.curvine:8995", fs-path: /l2cache}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: curvine-pvc, namespace: default}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: curvine-sc
  resources: {requests: {storage: 100Gi}}
""")
    kubectl("apply", "-f", "-", stdin=POLICY.format(container="qwen"))
    iec = {"apiVersion": "inference.sagemaker.aws.amazon.com/v1", "kind": "InferenceEndpointConfig",
           "metadata": {"name": "qwen", "namespace": "default", "labels": {"tiered-kv/l2": "curvine"}},
           "spec": {"modelName": "qwen2-7b", "instanceType": "ml.g5.4xlarge", "replicas": 2,
                    "modelSourceConfig": {"modelSourceType": "huggingface"},
                    "kvCacheSpec": {"enableL1Cache": True, "enableL2Cache": True},
                    "worker": {"image": "lmcache/vllm-openai:v0.3.7", "resources": {},
                               "modelInvocationPort": {"containerPort": 8000},
                               "modelVolumeMount": {"name": "model", "mountPath": "/opt/ml/model"}}}}
    custom = client.CustomObjectsApi(kube_api(sb, CLUSTER))
    group = ("inference.sagemaker.aws.amazon.com", "v1", "default", "inferenceendpointconfigs")
    custom.create_namespaced_custom_object(*group, iec)

    def state() -> str:
        return (custom.get_namespaced_custom_object(*group, "qwen").get("status") or {}).get("state", "")

    wait_for("DeploymentComplete", lambda: state() == "DeploymentComplete")

    def injected() -> bool:
        dep = apps.read_namespaced_deployment("qwen", "default")
        urls = [v for n, v in container_env(dep) if n == "LMCACHE_REMOTE_URL"]
        return urls == [FS_URL] and any(v.name == "curvine-cache" for v in dep.spec.template.spec.volumes)

    assert injected()
    kyverno = twin.services["kyverno"]
    applied = kyverno.applied[("curvine-l2-inject", "curvine-l2")]
    assert operator.rerender_now() == [("default", "qwen")]
    wait_for("the forced re-render went through admission",
             lambda: kyverno.applied[("curvine-l2-inject", "curvine-l2")] > applied)
    assert injected()
    eks.update_addon(clusterName=f"{CLUSTER}-eks", addonName=OPERATOR_ADDON, addonVersion="v2.0.0-eksbuild.2")
    wait_for("re-rendered by the new operator", lambda: apps.read_namespaced_deployment("qwen", "default")
             .metadata.annotations.get("inference.sagemaker.aws.amazon.com/operator-version") == "v2.0.0-eksbuild.2")
    assert injected()
    wait_for("DeploymentComplete again", lambda: state() == "DeploymentComplete")
    pods = client.CoreV1Api(kube_api(sb, CLUSTER)).list_namespaced_pod("default", label_selector="app=qwen").items
    assert len(pods) == 2
    for pod in pods:
        env_vars = [(e.name, e.value) for e in pod.spec.containers[0].env]
        assert [v for n, v in env_vars if n == "LMCACHE_REMOTE_URL"] == [FS_URL]
    assert json.loads(kubectl("get", "deployment", "qwen", "-o", "json").stdout)["metadata"]["labels"] == \
        {"app": "qwen", "tiered-kv/l2": "curvine"}


def test_without_policies_writes_pass_unchanged(sb, apps) -> None:
    body = deployment("bare", {"tiered-kv/l2": "curvine"})
    apps.create_namespaced_deployment("default", body)
    dep = apps.read_namespaced_deployment("bare", "default")
    assert container_env(dep) == [(e["name"], e["value"]) for e in body["spec"]["template"]["spec"]["containers"][0]
                                  ["env"]]
    assert sb.twin(CLUSTER).services["kyverno"].applied == {}
