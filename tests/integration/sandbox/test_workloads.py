"""The workload controllers of the sandbox, driven through the official Kubernetes client, kubectl and boto3:
GPU scheduling and Pending-with-reason, the maxSurge deadlock and the scale-to-0 way out, stale pods, StatefulSet
and DaemonSet behaviour, node and pod loss, PVC binding (Curvine and EBS) and the ai-toolkit DaemonSet of stage 1."""

from __future__ import annotations

import subprocess
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from kubernetes import client

from kvfleet_sandbox.runtime import Sandbox

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
CLUSTER = "wl-1"
FLEET = f"""
clusters:
  - name: {CLUSTER}
    region: us-east-1
    gpu_nodes: {{count: 2, instance_type: ml.g5.4xlarge}}
"""
FAST = {"time_scale": 0.01, "pod_startup_s": 10.0, "cluster_update_delay_s": 5.0}


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
    return sandbox_factory(FLEET, controllers=("workloads",), **FAST)


@pytest.fixture
def core(sb: Sandbox, kube_api) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api(sb, CLUSTER))


@pytest.fixture
def apps(sb: Sandbox, kube_api) -> client.AppsV1Api:
    return client.AppsV1Api(kube_api(sb, CLUSTER))


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


def gpu_deployment(name: str, replicas: int, env_value: str = "v1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, **spec,
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{
                         "name": "vllm", "image": "vllm/vllm-openai:v0.11.1",
                         "env": [{"name": "LMCACHE_REMOTE_URL", "value": env_value}],
                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def pods_of(core: client.CoreV1Api, app: str) -> list[Any]:
    return core.list_namespaced_pod("default", label_selector=f"app={app}").items


def status_of(obj: Any) -> Any:
    """A workload's status; None until the controller first writes it, as on a real cluster."""
    return obj.status or types.SimpleNamespace(ready_replicas=None, number_ready=None)


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


def available(apps: client.AppsV1Api, name: str, replicas: int) -> bool:
    d = apps.read_namespaced_deployment(name, "default")
    s = d.status
    return s is not None and (s.observed_generation == d.metadata.generation and (s.updated_replicas or 0) == replicas
            and (s.available_replicas or 0) == replicas and (s.replicas or 0) == replicas)


def test_gpu_pods_bind_one_per_free_gpu_and_the_rest_stay_pending_with_the_reason(sb, core, apps) -> None:
    apps.create_namespaced_deployment("default", gpu_deployment("llm", 3))
    running = wait_for("two Running pods", lambda: [p for p in pods_of(core, "llm") if p.status.phase == "Running"]
                       if sum(p.status.phase == "Running" for p in pods_of(core, "llm")) == 2 else None)
    assert sorted(p.spec.node_name for p in running) == sorted(sb.twin(CLUSTER).gpu_nodes)
    for pod in running:
        ready = {c.type: c.status for c in pod.status.conditions}
        assert ready["Ready"] == "True" and pod.status.pod_ip and pod.status.host_ip
        assert pod.status.container_statuses[0].ready and pod.status.container_statuses[0].state.running.started_at
        assert pod.metadata.owner_references[0].kind == "ReplicaSet"
        assert pod.metadata.labels["pod-template-hash"]
    pending = [p for p in pods_of(core, "llm") if p.status.phase == "Pending"]
    assert len(pending) == 1 and pending[0].spec.node_name is None
    scheduled = next(c for c in pending[0].status.conditions if c.type == "PodScheduled")
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    assert scheduled.message.startswith("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={pending[0].metadata.name}")
    assert any(e.reason == "FailedScheduling" for e in events.items)
    status = wait_for("deployment status", lambda: (s := status_of(apps.read_namespaced_deployment("llm", "default")))
                      .ready_replicas == 2 and s)
    assert (status.replicas, status.updated_replicas, status.unavailable_replicas) == (3, 3, 1)
    conditions = {c.type: (c.status, c.reason) for c in status.conditions}
    assert conditions["Available"] == ("False", "MinimumReplicasUnavailable")  # maxUnavailable floor(25% of 3)=0


def test_template_change_with_every_gpu_taken_deadlocks_on_max_surge(sb, core, apps, kubectl) -> None:
    apps.create_namespaced_deployment("default", gpu_deployment("llm", 2, progressDeadlineSeconds=60))
    wait_for("rollout", lambda: available(apps, "llm", 2))
    old_pods = {p.metadata.name for p in pods_of(core, "llm")}
    kubectl("set", "env", "deployment/llm", "LMCACHE_REMOTE_URL=fs://localhost:0/mnt/curvine/l2cache/")
    surge = wait_for("the surge pod", lambda: [p for p in pods_of(core, "llm") if p.metadata.name not in old_pods])
    assert len(surge) == 1
    sb.twin(CLUSTER).services["workloads"].settle(30)  # three pod start-ups of the twin's clock: nothing moves
    pods = pods_of(core, "llm")
    assert {p.metadata.name for p in pods} == old_pods | {surge[0].metadata.name}
    assert next(p for p in pods if p.metadata.name == surge[0].metadata.name).status.phase == "Pending"
    for pod in pods:
        if pod.metadata.name in old_pods:  # stale: still the env they were created with
            assert pod.status.phase == "Running" and env_of(pod)["LMCACHE_REMOTE_URL"] == "v1"
    status = apps.read_namespaced_deployment("llm", "default").status
    assert (status.updated_replicas, status.ready_replicas, status.replicas) == (1, 2, 3)
    wait_for("ProgressDeadlineExceeded", lambda: any(
        c.reason == "ProgressDeadlineExceeded" and c.status == "False"
        for c in apps.read_namespaced_deployment("llm", "default").status.conditions))
    reason = kubectl("get", "deployment/llm", "-o",
                     'jsonpath={.status.conditions[?(@.type=="Progressing")].reason}').stdout
    assert reason == "ProgressDeadlineExceeded"


def test_scaling_to_zero_first_lets_the_same_patch_roll_out(sb, core, apps, kubectl) -> None:
    apps.create_namespaced_deployment("default", gpu_deployment("llm", 2))
    wait_for("rollout", lambda: available(apps, "llm", 2))
    kubectl("scale", "deployment/llm", "--replicas=0")
    wait_for("no pods", lambda: not pods_of(core, "llm"))
    kubectl("set", "env", "deployment/llm", "LMCACHE_REMOTE_URL=fs://localhost:0/mnt/curvine/l2cache/")
    kubectl("scale", "deployment/llm", "--replicas=2")
    wait_for("rollout", lambda: available(apps, "llm", 2))
    pods = pods_of(core, "llm")
    assert len(pods) == 2 and all(p.status.phase == "Running" for p in pods)
    assert {env_of(p)["LMCACHE_REMOTE_URL"] for p in pods} == {"fs://localhost:0/mnt/curvine/l2cache/"}
    progressing = next(c for c in apps.read_namespaced_deployment("llm", "default").status.conditions
                       if c.type == "Progressing")
    assert progressing.reason == "NewReplicaSetAvailable"


def test_with_a_free_gpu_the_rollout_completes_and_deleting_removes_everything(sb, core, apps) -> None:
    apps.create_namespaced_deployment("default", gpu_deployment("small", 1))
    wait_for("rollout", lambda: available(apps, "small", 1))
    first = pods_of(core, "small")[0].metadata.name
    apps.patch_namespaced_deployment("small", "default", {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "env": [{"name": "LMCACHE_REMOTE_URL", "value": "v2"}]}]}}}})
    wait_for("new pod replaces old", lambda: available(apps, "small", 1)
             and [p.metadata.name for p in pods_of(core, "small")] != [first])
    assert env_of(pods_of(core, "small")[0])["LMCACHE_REMOTE_URL"] == "v2"
    rs = apps.list_namespaced_replica_set("default", label_selector="app=small").items
    assert sorted(r.spec.replicas for r in rs) == [0, 1]
    apps.delete_namespaced_deployment("small", "default")
    wait_for("pods and ReplicaSets gone", lambda: not pods_of(core, "small")
             and not apps.list_namespaced_replica_set("default", label_selector="app=small").items)


def test_statefulset_pods_are_ordered_and_an_on_delete_pod_stays_stale_until_killed(sb, core, apps) -> None:
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "db", "namespace": "default"},
           "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                    "updateStrategy": {"type": "OnDelete"},
                    "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [
                        {"name": "db", "image": "db:1", "env": [{"name": "V", "value": "1"}]}]}}}}
    apps.create_namespaced_stateful_set("default", sts)
    seen: list[list[str]] = []

    def both_ready() -> bool:
        pods = pods_of(core, "db")
        seen.append(sorted(p.metadata.name for p in pods))
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)
    wait_for("db-0 and db-1", both_ready)
    assert ["db-1"] not in seen  # db-1 never came before db-0
    apps.patch_namespaced_stateful_set("db", "default", {"spec": {"template": {"spec": {"containers": [
        {"name": "db", "env": [{"name": "V", "value": "2"}]}]}}}})
    old_revision = core.read_namespaced_pod("db-0", "default").metadata.labels["controller-revision-hash"]
    wait_for("the controller saw the new template", lambda: apps.read_namespaced_stateful_set(
        "db", "default").status.update_revision not in (None, old_revision))
    sb.twin(CLUSTER).services["workloads"].settle(20)
    assert {env_of(p)["V"] for p in pods_of(core, "db")} == {"1"}  # OnDelete: stale until the pod goes
    old_uid = core.read_namespaced_pod("db-1", "default").metadata.uid
    assert sb.twin(CLUSTER).services["workloads"].kill_pod("default", "db-1")
    pod = wait_for("db-1 recreated", lambda: next((p for p in pods_of(core, "db") if p.metadata.name == "db-1"
                                                   and p.metadata.uid != old_uid and p.status.phase == "Running"),
                                                  None))
    assert env_of(pod)["V"] == "2" and env_of(core.read_namespaced_pod("db-0", "default"))["V"] == "1"
    status = apps.read_namespaced_stateful_set("db", "default").status
    assert (status.replicas, status.ready_replicas, status.updated_replicas) == (2, 2, 1)


def test_statefulset_rolling_update_replaces_pods_one_at_a_time(sb, core, apps) -> None:
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "kv", "namespace": "default"},
           "spec": {"replicas": 2, "serviceName": "kv", "selector": {"matchLabels": {"app": "kv"}},
                    "template": {"metadata": {"labels": {"app": "kv"}}, "spec": {"containers": [
                        {"name": "kv", "image": "kv:1"}]}}}}
    apps.create_namespaced_stateful_set("default", sts)
    wait_for("two ready", lambda: (status_of(apps.read_namespaced_stateful_set("kv", "default")).ready_replicas
                                   or 0) == 2)
    apps.patch_namespaced_stateful_set("kv", "default", {"spec": {"template": {"spec": {"containers": [
        {"name": "kv", "image": "kv:2"}]}}}})
    counts = []

    def done() -> bool:
        pods = pods_of(core, "kv")
        counts.append(len(pods))
        return len(pods) == 2 and all(p.spec.containers[0].image == "kv:2" and p.status.phase == "Running"
                                      for p in pods)
    wait_for("both pods on kv:2", done)
    assert min(counts) >= 1  # never both down at once
    status = apps.read_namespaced_stateful_set("kv", "default").status
    assert status.current_revision == status.update_revision and status.updated_replicas == 2


def test_daemonset_honours_node_selector(sb, core, apps, kubectl) -> None:
    nodes = sb.twin(CLUSTER).gpu_nodes
    kubectl("label", "node", nodes[0], "role=cache")
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "default"},
          "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
              "metadata": {"labels": {"app": "agent"}},
              "spec": {"nodeSelector": {"role": "cache"}, "containers": [{"name": "a", "image": "agent:1"}]}}}}
    apps.create_namespaced_daemon_set("default", ds)
    wait_for("one ready agent", lambda: (status_of(apps.read_namespaced_daemon_set("agent", "default")).number_ready
                                         or 0) == 1)
    assert [p.spec.node_name for p in pods_of(core, "agent")] == [nodes[0]]
    kubectl("label", "node", nodes[1], "role=cache")
    wait_for("two agents", lambda: status_of(apps.read_namespaced_daemon_set("agent", "default")).number_ready == 2)
    assert apps.read_namespaced_daemon_set("agent", "default").status.desired_number_scheduled == 2


def test_a_lost_node_fails_its_pods_and_they_reschedule_when_capacity_exists(sb, core, apps) -> None:
    twin = sb.twin(CLUSTER)
    faults = twin.services["workloads"]
    apps.create_namespaced_deployment("default", gpu_deployment("llm", 2))
    wait_for("rollout", lambda: available(apps, "llm", 2))
    victim_node = twin.gpu_nodes[0]
    victim = next(p.metadata.name for p in pods_of(core, "llm") if p.spec.node_name == victim_node)
    assert victim in faults.lose_node(victim_node)
    node = core.read_node(victim_node)
    assert next(c for c in node.status.conditions if c.type == "Ready").status == "Unknown"
    assert any(t.key == "node.kubernetes.io/unreachable" for t in node.spec.taints)
    replacement = wait_for("a Pending replacement", lambda: [
        p for p in pods_of(core, "llm") if p.metadata.name != victim and p.spec.node_name is None
        and p.status.conditions])  # created, and judged by the scheduler (its PodScheduled condition written)
    assert victim not in {p.metadata.name for p in pods_of(core, "llm")}
    message = next(c for c in replacement[0].status.conditions if c.type == "PodScheduled").message
    assert "1 Insufficient nvidia.com/gpu" in message and "untolerated taint {node.kubernetes.io/unreachable: }" \
        in message
    added = faults.add_nodes(1)
    assert added[0].startswith("hyperpod-i-") and added[0] in twin.gpu_nodes
    wait_for("back to 2 available", lambda: available(apps, "llm", 2))
    assert {p.spec.node_name for p in pods_of(core, "llm")} == {twin.gpu_nodes[1], added[0]}


class CurvineStub:
    """Stands in for the Curvine simulation: only what PVC binding asks."""

    def __init__(self) -> None:
        self.running = False

    def master_running(self) -> bool:
        return self.running


def test_curvine_pvc_binds_only_while_the_master_runs(sb, core, kube_api) -> None:
    twin = sb.twin(CLUSTER)
    stub = CurvineStub()
    twin.services["curvine"] = stub
    storage = client.StorageV1Api(kube_api(sb, CLUSTER))
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                  "metadata": {"name": "curvine-sc"}, "provisioner": "curvine",
                                  "parameters": {"master-addrs": "curvine-master-0.curvine:8995",
                                                 "fs-path": "/l2cache", "path-type": "DirectoryOrCreate"},
                                  "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"})
    core.create_namespaced_persistent_volume_claim("default", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "curvine-pvc"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "curvine-sc",
                 "resources": {"requests": {"storage": "100Gi"}}}})
    event = wait_for("a ProvisioningFailed event", lambda: [
        e for e in core.list_namespaced_event("default", field_selector="involvedObject.name=curvine-pvc").items
        if e.reason == "ProvisioningFailed"])
    assert "curvine master" in event[0].message and "not reachable" in event[0].message
    twin.services["workloads"].settle(20)  # more passes of the binder, the master still down
    assert core.read_namespaced_persistent_volume_claim("curvine-pvc", "default").status.phase == "Pending"
    stub.running = True
    twin.services["workloads"].wake()
    pvc = wait_for("Bound", lambda: getattr((c := core.read_namespaced_persistent_volume_claim(
        "curvine-pvc", "default")).status, "phase", "") == "Bound" and c)
    pv = core.read_persistent_volume(pvc.spec.volume_name)
    assert pvc.spec.volume_name == f"pvc-{pvc.metadata.uid}"
    assert pv.spec.csi.driver == "curvine"
    assert pv.spec.csi.volume_attributes["curvine-path"] == f"/l2cache/pvc-{pvc.metadata.uid}"
    assert pv.spec.csi.volume_handle.endswith(f"@/l2cache@pvc-{pvc.metadata.uid}")
    assert pv.spec.claim_ref.uid == pvc.metadata.uid and pv.status.phase == "Bound"
    assert pvc.status.access_modes == ["ReadWriteMany"] and pvc.status.capacity["storage"] == "100Gi"
    core.delete_namespaced_persistent_volume_claim("curvine-pvc", "default")
    wait_for("PV deleted with its claim", lambda: not core.list_persistent_volume().items)


def test_ebs_claims_bind_at_once_or_at_first_consumer(sb, core, kube_api) -> None:
    storage = client.StorageV1Api(kube_api(sb, CLUSTER))
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                  "metadata": {"name": "gp3-now"}, "provisioner": "ebs.csi.aws.com",
                                  "volumeBindingMode": "Immediate"})

    def claim(name: str, sc: str | None) -> None:
        spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}
        if sc:
            spec["storageClassName"] = sc
        core.create_namespaced_persistent_volume_claim("default", {"metadata": {"name": name}, "spec": spec})

    def phase(name: str) -> str:
        status = core.read_namespaced_persistent_volume_claim(name, "default").status
        return status.phase if status else ""

    claim("now", "gp3-now")
    wait_for("Immediate EBS claim bound", lambda: phase("now") == "Bound")
    claim("later", None)  # the default class: the sandbox's ebs-sc, WaitForFirstConsumer like EKS's gp3
    event = wait_for("WaitForFirstConsumer", lambda: [
        e for e in core.list_namespaced_event("default", field_selector="involvedObject.name=later").items
        if e.reason == "WaitForFirstConsumer"])
    assert event[0].type == "Normal" and phase("later") == "Pending"
    core.create_namespaced_pod("default", {"metadata": {"name": "user", "labels": {"app": "user"}}, "spec": {
        "containers": [{"name": "c", "image": "busybox"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "later"}}]}})
    wait_for("the consumer runs", lambda: getattr(core.read_namespaced_pod("user", "default").status, "phase", "")
             == "Running")
    pvc = core.read_namespaced_persistent_volume_claim("later", "default")
    assert pvc.status.phase == "Bound" and pvc.spec.storage_class_name == "ebs-sc"
    assert core.read_persistent_volume(pvc.spec.volume_name).spec.csi.volume_handle.startswith("vol-")
    core.create_namespaced_pod("default", {"metadata": {"name": "orphan"}, "spec": {
        "containers": [{"name": "c", "image": "busybox"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "missing"}}]}})
    cond = wait_for("unschedulable", lambda: [c for c in getattr(core.read_namespaced_pod("orphan", "default")
                                                                 .status, "conditions", None) or []
                                              if c.reason == "Unschedulable"])
    assert 'persistentvolumeclaim "missing" not found' in cond[0].message


def test_ai_toolkit_appears_on_enable_and_goes_on_disable(sb, core, apps) -> None:
    env = sb.exports()
    sagemaker = boto3.client("sagemaker", region_name="us-east-1", endpoint_url=env["AWS_ENDPOINT_URL"],
                             aws_access_key_id="sandbox", aws_secret_access_key="sandbox")

    def update(mode: str) -> None:
        config: dict[str, Any] = {"Mode": mode}
        if mode == "Enable":
            config["InstanceMemoryAllocationPercentage"] = 20
        sagemaker.update_cluster(ClusterName=CLUSTER, TieredStorageConfig=config, NodeRecovery="Automatic")

    update("Enable")
    ds = wait_for("ai-toolkit ready on every node", lambda: [
        d for d in apps.list_namespaced_daemon_set("aws-hyperpod").items
        if d.metadata.name == "ai-toolkit" and (status_of(d).number_ready or 0) == 2])
    assert ds[0].status.desired_number_scheduled == 2
    pods = core.list_namespaced_pod("aws-hyperpod", label_selector="app=ai-toolkit").items
    assert sorted(p.spec.node_name for p in pods) == sorted(sb.twin(CLUSTER).gpu_nodes)
    wait_for("InService", lambda: sagemaker.describe_cluster(ClusterName=CLUSTER)["ClusterStatus"] == "InService")
    update("Disable")
    wait_for("ai-toolkit gone", lambda: not apps.list_namespaced_daemon_set("aws-hyperpod").items
             and not core.list_namespaced_pod("aws-hyperpod").items)


def worker_set(name: str, replicas: int, anti: str | None, node_selector: dict[str, str] | None = None) -> dict:
    """A StatefulSet placed like the Curvine chart's workers (one per node by hostname anti-affinity)."""
    labels = {"app": name}
    term = {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
    affinity = {} if anti is None else {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [term]} if anti == "required" else {"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}}}
    spec: dict[str, Any] = {"containers": [{"name": "worker", "image": "ghcr.io/curvineio/curvine:v0.2.0"}]}
    if affinity:
        spec["affinity"] = affinity
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


def placed(core: client.CoreV1Api, app: str) -> list[tuple[str, str | None]]:
    pods = core.list_namespaced_pod("default", label_selector=f"app={app}").items
    return sorted(((p.status.phase, p.spec.node_name) for p in pods), key=lambda x: (x[0], x[1] or ""))


def test_pod_anti_affinity_preferred_stacks_required_leaves_pending(sb, core, apps) -> None:
    """Upstream's default (preferred) puts a third worker next to another on 2 nodes; required keeps it Pending
    with the scheduler's reason; an unmatched nodeSelector keeps every pod off the nodes."""
    apps.create_namespaced_stateful_set("default", worker_set("pref", 3, "preferred"))
    got = wait_for("3 preferred workers running", lambda: (p := placed(core, "pref")) and
                   [ph for ph, _ in p].count("Running") == 3 and p)
    assert len({node for _, node in got}) == 2  # spread first, then stacked
    apps.create_namespaced_stateful_set("default", worker_set("req", 3, "required"))
    got = wait_for("2 required workers running", lambda: (p := placed(core, "req")) and
                   [ph for ph, _ in p].count("Running") == 2 and p)
    assert len({node for ph, node in got if ph == "Running"}) == 2
    pending = next(p for p in core.list_namespaced_pod("default", label_selector="app=req").items
                   if p.status.phase == "Pending")
    cond = next(c for c in pending.status.conditions or [] if c.type == "PodScheduled")
    assert cond.reason == "Unschedulable" and "didn't match pod anti-affinity rules" in cond.message
    apps.create_namespaced_stateful_set("default", worker_set("pinned", 1, "required",
                                                              {"sagemaker.amazonaws.com/compute-type": "cpu"}))
    pod = wait_for("a pinned pod marked unschedulable", lambda: next(
        (p for p in core.list_namespaced_pod("default", label_selector="app=pinned").items
         if any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions or [])), None))
    assert pod.spec.node_name is None and "node affinity/selector" in pod.status.conditions[-1].message


def hook_job(name: str, exit_code: int | None = None) -> dict[str, Any]:
    annotations = {} if exit_code is None else {"sandbox.kvfleet.io/exit-code": str(exit_code)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
            "spec": {"backoffLimit": 1, "template": {"metadata": {"annotations": annotations}, "spec": {
                "restartPolicy": "Never", "containers": [{"name": "check", "image": "bitnami/kubectl:latest"}]}}}}


def test_a_job_runs_to_completion_or_fails_after_its_backoff_limit(sb, core, kube_api) -> None:
    batch = client.BatchV1Api(kube_api(sb, CLUSTER))
    batch.create_namespaced_job("default", hook_job("ok"))
    job = wait_for("job ok Complete", lambda: (j := batch.read_namespaced_job("ok", "default")).status
                   and j.status.conditions and j)
    assert [(c.type, c.status) for c in job.status.conditions] == [("SuccessCriteriaMet", "True"),
                                                                   ("Complete", "True")]
    assert job.status.succeeded == 1 and job.status.completion_time is not None
    pods = core.list_namespaced_pod("default", label_selector="job-name=ok").items
    assert [p.status.phase for p in pods] == ["Succeeded"]
    assert pods[0].status.container_statuses[0].state.terminated.exit_code == 0
    batch.create_namespaced_job("default", hook_job("bad", exit_code=3))
    job = wait_for("job bad Failed", lambda: (j := batch.read_namespaced_job("bad", "default")).status and j.status.conditions
                   and j)
    assert ("Failed", "True") in [(c.type, c.status) for c in job.status.conditions]
    assert job.status.failed == 2  # backoffLimit 1: the first run and one retry
    batch.delete_namespaced_job("bad", "default")
    wait_for("the failed job's pods deleted with it",
             lambda: not core.list_namespaced_pod("default", label_selector="job-name=bad").items)


def test_an_idle_cluster_skips_periodic_passes_but_starts_due_pods_and_judges_deadlines(sb, core, apps) -> None:
    """The idle skip (WorkloadController._idle): with nothing written, most periodic passes do nothing, yet a
    pod start that is due, a fault hook and a Deployment's progress deadline are never missed."""
    from kvfleet_sandbox.controllers.workloads import IDLE_SKIPS

    wl = sb.twin(CLUSTER).services["workloads"]
    apps.create_namespaced_deployment("default", gpu_deployment("idle", 1))
    wait_for("a Running pod", lambda: [p for p in pods_of(core, "idle") if p.status.phase == "Running"])
    wl.settle(0)
    passes, full = wl.passes, wl.full_passes
    wait_for("40 more passes", lambda: wl.passes >= passes + 40, timeout=30)
    ran, looped = wl.full_passes - full, wl.passes - passes
    assert looped // (IDLE_SKIPS + 1) - 1 <= ran <= looped // (IDLE_SKIPS + 1) + 2, (ran, looped)
    # a pod bound while idle starts after pod_startup_s of model time, not later: the due start ends the skip
    apps.create_namespaced_deployment("default", gpu_deployment("due", 1))
    wait_for("the second pod Running", lambda: [p for p in pods_of(core, "due") if p.status.phase == "Running"])
    # a fault hook is a full pass at once
    full = wl.full_passes
    wl.kill_pod("default", pods_of(core, "due")[0].metadata.name)
    wait_for("a full pass after the kill", lambda: wl.full_passes > full)
    # a deadline only time passes: a Deployment that cannot progress (no GPU left) times out on the model clock
    apps.create_namespaced_deployment("default", gpu_deployment("stuck", 1, progressDeadlineSeconds=20))
    wait_for("ProgressDeadlineExceeded", lambda: any(
        c.reason == "ProgressDeadlineExceeded"
        for c in getattr(status_of(apps.read_namespaced_deployment("stuck", "default")), "conditions", None) or []),
        timeout=20)
