"""The simulated HyperPod Inference Operator through boto3 (EKS add-ons), the official Kubernetes client and kubectl:
installation and add-on order, rendering, the reconcile loop that overwrites patches, the pause-and-restore sequence of
docs/reference/hyperpod.md#what-the-operator-renders, a CR change dropping the patch, the conversion webhook while
paused, an operator version change and deletion."""

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
from kubernetes.client.exceptions import ApiException

from kvfleet.fleet.constants import (
    ADDON_ORDER,
    OPERATOR_ADDON,
    OPERATOR_DEPLOYMENT,
    OPERATOR_L2_URL,
    OPERATOR_NAMESPACE,
)
from kvfleet_sandbox.runtime import Sandbox

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
CLUSTER = "op-1"
EKS = f"{CLUSTER}-eks"
FLEET = f"""
clusters:
  - name: {CLUSTER}
    region: us-east-1
    gpu_nodes: {{count: 3, instance_type: ml.g5.4xlarge}}
"""
FAST = {"time_scale": 0.01, "pod_startup_s": 10.0, "cluster_update_delay_s": 5.0, "operator_resync_s": 15.0}
IEC = ("inference.sagemaker.aws.amazon.com", "v1", "default", "inferenceendpointconfigs")
FS_URL = "fs://localhost:0/mnt/curvine/l2cache/"


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60.0) -> Any:
    # A bound on something that must happen (no assertion on how fast): wide enough for a loaded 2-core machine.
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.03)
    raise AssertionError(f"timed out waiting for {what}")


def iec(name: str, *, image: str = "lmcache/vllm-openai:v0.3.7", replicas: int = 2) -> dict[str, Any]:
    return {"apiVersion": "inference.sagemaker.aws.amazon.com/v1", "kind": "InferenceEndpointConfig",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"app.kubernetes.io/managed-by": "kvfleet", "kvfleet.io/lob": "retail",
                                    "tiered-kv/l2": "curvine"}},
            "spec": {"modelName": "qwen2-7b", "instanceType": "ml.g5.4xlarge", "replicas": replicas,
                     "modelSourceConfig": {"modelSourceType": "huggingface"},
                     "kvCacheSpec": {"enableL1Cache": True, "enableL2Cache": True,
                                     "l2CacheSpec": {"l2CacheBackend": "tieredstorage"}},
                     "worker": {"image": image, "resources": {"limits": {"nvidia.com/gpu": 1}},
                                "modelInvocationPort": {"containerPort": 8000},
                                "modelVolumeMount": {"name": "model", "mountPath": "/opt/ml/model"},
                                "environmentVariables": [{"name": "PYTHONHASHSEED", "value": "0"},
                                                         {"name": "LMCACHE_REMOTE_SERDE", "value": "naive"}]}}}


class Env:
    """One sandbox cluster with workloads + operator, and the clients a platform team would use."""

    def __init__(self, sb: Sandbox, api: Any) -> None:
        self.sb = sb
        self.twin = sb.twin(CLUSTER)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        env = sb.exports()
        # The platform admin's key: this test installs, deletes and reinstalls add-ons itself (eks:DeleteAddon is
        # not kvfleet's), and the twin authorizes kvfleet's key with k8s/iam/kvfleet-policy.json.
        admin = sb.aws.admin_key()
        self.eks = boto3.client("eks", region_name="us-east-1", endpoint_url=env["AWS_ENDPOINT_URL"],
                                aws_access_key_id=admin, aws_secret_access_key=admin)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if not KUBECTL.exists():
            pytest.skip("kubectl missing: run tools/fetch-k8s-binaries.sh")
        proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.sb.kubeconfig), "--context", CLUSTER, *args],
                              capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc

    def addon(self, name: str) -> dict[str, Any]:
        return self.eks.describe_addon(clusterName=EKS, addonName=name)["addon"]

    def settle(self, name: str) -> dict[str, Any]:
        return wait_for(f"{name} settled", lambda: (a := self.addon(name))["status"] not in
                        ("CREATING", "UPDATING", "DELETING") and a)

    def reconciled(self, model_s: float) -> None:
        """The twin's clock moved ``model_s`` model seconds and the operator then finished two passes, so at least
        one periodic reconcile ran entirely after that moment (a fixed sleep proves nothing on a busy machine:
        the loop may not have run at all)."""
        clock = self.sb.clock
        until = clock.now() + model_s
        while clock.now() < until:
            time.sleep(max(0.001, clock.real(until - clock.now())))
        loop = self.twin.services["operator"]._loop  # the operator's ReconcileLoop (_objects), which counts passes
        assert loop.wait_passes(loop.passes + 2, 30), "the operator did not reconcile"

    def install_dependencies(self) -> None:
        for name in ADDON_ORDER[:-1]:
            self.eks.create_addon(clusterName=EKS, addonName=name)
        for name in ADDON_ORDER[:-1]:
            assert self.settle(name)["status"] == "ACTIVE"

    def install_operator(self) -> None:
        self.install_dependencies()
        self.eks.create_addon(clusterName=EKS, addonName=OPERATOR_ADDON, addonVersion="v1.0.0-eksbuild.1")
        assert self.settle(OPERATOR_ADDON)["status"] == "ACTIVE"
        self.wait_operator_ready()

    def operator_ready(self) -> int:
        status = self.apps.read_namespaced_deployment(OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE).status
        return (status.ready_replicas or 0) if status else 0

    def wait_operator_ready(self) -> None:
        wait_for("operator ready", lambda: self.operator_ready() >= 1
                 and self.twin.services["operator"].controller_ready())

    def get_iec(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(*IEC[:3], IEC[3], name)

    def complete(self, name: str) -> dict[str, Any]:
        return wait_for(f"{name} DeploymentComplete", lambda: (o := self.get_iec(name)).get("status", {})
                        .get("state") == "DeploymentComplete"
                        and o["status"].get("observedGeneration") == o["metadata"]["generation"] and o)

    def env(self, name: str) -> list[tuple[str, str | None]]:
        dep = self.apps.read_namespaced_deployment(name, "default")
        return [(e.name, e.value) for e in dep.spec.template.spec.containers[0].env]

    def urls(self, name: str) -> list[str | None]:
        return [v for n, v in self.env(name) if n == "LMCACHE_REMOTE_URL"]

    def fully_available(self, name: str, replicas: int = 2) -> bool:
        d = self.apps.read_namespaced_deployment(name, "default")
        s = d.status
        return s is not None and s.observed_generation == d.metadata.generation and \
            (s.updated_replicas, s.available_replicas, s.replicas) == (replicas, replicas, replicas)

    def curvine_pvc(self) -> None:
        """A Bound RWX claim in a Curvine class (a stub stands in for the Curvine master)."""
        self.twin.services["curvine"] = type("MasterUp", (), {"master_running": staticmethod(lambda: True)})()
        client.StorageV1Api(self.custom.api_client).create_storage_class({
            "metadata": {"name": "curvine-sc"}, "provisioner": "curvine",
            "parameters": {"master-addrs": "curvine-master-0.curvine:8995", "fs-path": "/l2cache"}})
        self.core.create_namespaced_persistent_volume_claim("default", {
            "metadata": {"name": "curvine-pvc"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "curvine-sc",
                     "resources": {"requests": {"storage": "100Gi"}}}})
        wait_for("curvine-pvc Bound", lambda: getattr(self.core.read_namespaced_persistent_volume_claim(
            "curvine-pvc", "default").status, "phase", "") == "Bound")

    def patch_to_curvine(self, name: str) -> None:
        """The blog's one JSON patch: replace the operator URL in place, add the volume and its mount."""
        index = [n for n, _ in self.env(name)].index("LMCACHE_REMOTE_URL")
        ops = [{"op": "replace", "path": f"/spec/template/spec/containers/0/env/{index}/value", "value": FS_URL},
               {"op": "add", "path": "/spec/template/spec/volumes/-",
                "value": {"name": "curvine-cache", "persistentVolumeClaim": {"claimName": "curvine-pvc"}}},
               {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
                "value": {"name": "curvine-cache", "mountPath": "/mnt/curvine/l2cache"}}]
        self.kubectl("patch", "deployment", name, "--type=json", "-p", json.dumps(ops))


@pytest.fixture
def env(sandbox_factory, kube_api) -> Env:
    sb = sandbox_factory(FLEET, controllers=("workloads", "operator"), **FAST)
    return Env(sb, kube_api(sb, CLUSTER))


@pytest.fixture
def running(env: Env) -> Env:
    env.install_operator()
    env.custom.create_namespaced_custom_object(*IEC[:3], IEC[3], iec("qwen"))
    env.complete("qwen")
    return env


def test_inference_addon_fails_before_cert_manager_and_installs_controller_and_crd_after(env: Env) -> None:
    env.eks.create_addon(clusterName=EKS, addonName=OPERATOR_ADDON, addonVersion="v1.0.0-eksbuild.1")
    failed = env.settle(OPERATOR_ADDON)
    assert failed["status"] == "CREATE_FAILED"
    assert "cert-manager (not installed)" in failed["health"]["issues"][0]["message"]
    assert OPERATOR_NAMESPACE not in {n.metadata.name for n in env.core.list_namespace().items}
    env.install_dependencies()
    env.eks.delete_addon(clusterName=EKS, addonName=OPERATOR_ADDON)
    wait_for("add-on deleted", lambda: OPERATOR_ADDON not in env.eks.list_addons(clusterName=EKS)["addons"])
    env.eks.create_addon(clusterName=EKS, addonName=OPERATOR_ADDON, addonVersion="v1.0.0-eksbuild.1")
    assert env.settle(OPERATOR_ADDON)["status"] == "ACTIVE"
    dep = env.apps.read_namespaced_deployment(OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE)
    assert dep.spec.replicas == 1 and dep.spec.template.spec.containers[0].name == "manager"
    assert dep.metadata.labels["control-plane"] == OPERATOR_DEPLOYMENT
    env.core.read_namespaced_service("hyperpod-inference-conversion-webhook", OPERATOR_NAMESPACE)
    crd = client.ApiextensionsV1Api(env.custom.api_client).read_custom_resource_definition(
        "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com")
    assert crd.spec.conversion.webhook.client_config.service.name == "hyperpod-inference-conversion-webhook"
    env.wait_operator_ready()  # its pod needs no GPU


def test_endpoint_renders_one_operator_url_sidecars_service_and_completes(running: Env) -> None:
    env = running
    status = env.get_iec("qwen")["status"]
    assert status["selector"] == "app=qwen" and status["replicas"] == 2
    assert status["deploymentStatus"]["name"] == "qwen"
    assert status["deploymentStatus"]["status"] == {"availableReplicas": 2, "readyReplicas": 2, "replicas": 2,
                                                    "updatedReplicas": 2}
    dep = env.apps.read_namespaced_deployment("qwen", "default")
    assert dep.metadata.labels == {"app": "qwen", "app.kubernetes.io/managed-by": "kvfleet",
                                   "kvfleet.io/lob": "retail", "tiered-kv/l2": "curvine"}
    assert dep.spec.template.metadata.labels == dep.metadata.labels
    assert dep.metadata.owner_references[0].kind == "InferenceEndpointConfig"
    assert dep.spec.strategy.type == "RollingUpdate"
    containers = dep.spec.template.spec.containers
    assert [c.name for c in containers] == ["qwen", "reverse-proxy", "otel-collector"]
    assert containers[0].ports[0].container_port == 8000
    names = [n for n, _ in env.env("qwen")]
    assert env.urls("qwen") == [OPERATOR_L2_URL]
    position = names.index("LMCACHE_REMOTE_URL")
    assert 0 < position < len(names) - 1  # in the middle: the index is not a stable contract
    assert names[0] == "NODE_IP" and containers[0].env[0].value_from.field_ref.field_path == "status.hostIP"
    assert {"LMCACHE_LOCAL_CPU", "LMCACHE_MAX_LOCAL_CPU_SIZE", "PYTHONHASHSEED"} <= set(names)
    svc = env.core.read_namespaced_service("qwen", "default")
    assert svc.spec.selector == {"app": "qwen"} and svc.spec.ports[0].port == 8000
    pods = env.core.list_namespaced_pod("default", label_selector="app=qwen").items
    assert len({p.spec.node_name for p in pods}) == 2 and all(p.status.phase == "Running" for p in pods)


def test_a_manual_patch_while_the_operator_runs_is_overwritten(running: Env) -> None:
    env = running
    env.patch_to_curvine("qwen")
    wait_for("the operator's URL back", lambda: env.urls("qwen") == [OPERATOR_L2_URL]
             and env.fully_available("qwen"))
    dep = env.apps.read_namespaced_deployment("qwen", "default")
    assert not [v for v in dep.spec.template.spec.volumes or [] if v.name == "curvine-cache"]
    pods = env.core.list_namespaced_pod("default", label_selector="app=qwen").items
    assert all(dict((e.name, e.value) for e in p.spec.containers[0].env)["LMCACHE_REMOTE_URL"] == OPERATOR_L2_URL
               for p in pods)


def test_the_patch_survives_pause_and_restore_until_the_cr_changes(running: Env) -> None:
    env = running
    env.curvine_pvc()
    env.kubectl("scale", "deployment", OPERATOR_DEPLOYMENT, "-n", OPERATOR_NAMESPACE, "--replicas=0")
    wait_for("operator paused", lambda: not env.twin.services["operator"].controller_ready())
    with pytest.raises(ApiException) as refused:  # the conversion webhook is served by the paused controller
        env.custom.create_namespaced_custom_object(*IEC[:3], IEC[3], iec("other"))
    assert refused.value.status == 500
    status = json.loads(refused.value.body)
    assert status["reason"] == "InternalError"
    assert status["message"].startswith("conversion webhook for inference.sagemaker.aws.amazon.com/v1, "
                                        "Kind=InferenceEndpointConfig failed: Post")
    assert status["message"].endswith('no endpoints available for service "hyperpod-inference-conversion-webhook"')
    env.kubectl("scale", "deployment", "qwen", "--replicas=0")
    wait_for("no model pods", lambda: not env.core.list_namespaced_pod("default", label_selector="app=qwen").items)
    env.patch_to_curvine("qwen")
    assert env.urls("qwen") == [FS_URL]
    env.kubectl("scale", "deployment", "qwen", "--replicas=2")
    wait_for("patched pods Ready", lambda: env.fully_available("qwen"))
    pods = env.core.list_namespaced_pod("default", label_selector="app=qwen").items
    assert all(any(m.mount_path == "/mnt/curvine/l2cache" for m in p.spec.containers[0].volume_mounts) for p in pods)
    env.kubectl("scale", "deployment", OPERATOR_DEPLOYMENT, "-n", OPERATOR_NAMESPACE, "--replicas=1")
    env.wait_operator_ready()
    env.reconciled(2 * FAST["operator_resync_s"])  # periodic reconciles of the running operator
    assert env.urls("qwen") == [FS_URL]
    assert env.get_iec("qwen")["status"]["state"] == "DeploymentComplete"
    env.custom.patch_namespaced_custom_object(*IEC[:3], IEC[3], "qwen",
                                              {"spec": {"worker": {"image": "lmcache/vllm-openai:v0.3.8"}}})
    wait_for("re-rendered without the patch", lambda: env.urls("qwen") == [OPERATOR_L2_URL])
    dep = env.apps.read_namespaced_deployment("qwen", "default")
    assert dep.spec.template.spec.containers[0].image == "lmcache/vllm-openai:v0.3.8"
    assert not [v for v in dep.spec.template.spec.volumes or [] if v.name == "curvine-cache"]
    env.complete("qwen")


def test_an_operator_upgrade_rerenders_and_moves_the_url(running: Env) -> None:
    env = running
    env.patch_to_curvine("qwen")  # overwritten at once, since the operator runs
    wait_for("stable", lambda: env.urls("qwen") == [OPERATOR_L2_URL] and env.fully_available("qwen"))
    before = [n for n, _ in env.env("qwen")].index("LMCACHE_REMOTE_URL")
    versions = ["v1.1.0-eksbuild.1", "v1.2.0-eksbuild.1", "v2.0.0-eksbuild.2"]
    for version in versions:
        env.eks.update_addon(clusterName=EKS, addonName=OPERATOR_ADDON, addonVersion=version)
        assert env.settle(OPERATOR_ADDON)["status"] == "ACTIVE"
        assert env.twin.services["operator"].version == version
        wait_for("re-rendered", lambda v=version: env.apps.read_namespaced_deployment("qwen", "default")
                 .metadata.annotations["inference.sagemaker.aws.amazon.com/operator-version"] == v)
        assert env.urls("qwen") == [OPERATOR_L2_URL]
        if [n for n, _ in env.env("qwen")].index("LMCACHE_REMOTE_URL") != before:
            break
    else:
        raise AssertionError("the L2 URL never moved across operator versions")
    env.complete("qwen")


def test_rerender_now_and_deleting_the_endpoint(running: Env) -> None:
    env = running
    operator = env.twin.services["operator"]
    env.kubectl("annotate", "deployment", "qwen", "team/note=kept-until-rerender")
    env.kubectl("label", "deployment", "qwen", "extra=manual")
    env.reconciled(FAST["operator_resync_s"])
    assert env.apps.read_namespaced_deployment("qwen", "default").metadata.labels.get("extra") == "manual"
    assert operator.rerender_now("default", "qwen") == [("default", "qwen")]
    wait_for("labels re-rendered", lambda: "extra" not in env.apps.read_namespaced_deployment("qwen", "default")
             .metadata.labels)
    env.custom.delete_namespaced_custom_object(*IEC[:3], IEC[3], "qwen")
    wait_for("deployment, service and pods gone", lambda: not env.apps.list_namespaced_deployment("default").items
             and not [s for s in env.core.list_namespaced_service("default").items if s.metadata.name == "qwen"]
             and not env.core.list_namespaced_pod("default", label_selector="app=qwen").items)


def test_the_rendered_service_serves_completions_through_the_api_server(sandbox_factory, kube_api) -> None:  # type: ignore[no-untyped-def]
    """The Service the operator renders (name = the endpoint, port 8000 named http; an assumption, see
    tests/conformance/facts/service_proxy.yaml) reaches the simulated vLLM through the Service proxy."""
    sb = sandbox_factory(FLEET, controllers=("workloads", "operator", "vllm"), **FAST)
    env = Env(sb, kube_api(sb, CLUSTER))
    env.install_operator()
    env.custom.create_namespaced_custom_object(*IEC[:3], IEC[3], iec("qwen"))
    env.complete("qwen")
    svc = env.core.read_namespaced_service("qwen", "default")
    assert [(p.name, p.port, p.target_port) for p in svc.spec.ports] == [("http", 8000, 8000)]
    resp = env.core.api_client.call_api(
        "/api/v1/namespaces/{namespace}/services/{name}/proxy/v1/completions", "POST",
        {"namespace": "default", "name": "qwen:8000"}, [], {"Content-Type": "application/json"},
        body={"prompt": "hello", "max_tokens": 2}, auth_settings=["BearerToken"], _preload_content=False)
    raw = resp[0] if isinstance(resp, tuple) else resp
    assert raw.status == 200 and json.loads(raw.data)["choices"]
