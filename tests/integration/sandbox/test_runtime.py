"""The sandbox runtime: the example fleet as real clients see it (official Kubernetes client, kubectl, boto3),
the admin endpoint's counters and faults, and a stop that leaves nothing listening."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kvfleet.fleet.inventory import load_inventory
from kvfleet_sandbox.runtime import Sandbox, port_refuses
from kvfleet_sandbox.twin import gpus_per_instance

ROOT = Path(__file__).resolve().parents[3]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
INVENTORY = load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")


def admin(sandbox: Sandbox, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(sandbox.admin.url + path, data=data, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def aws_client(sandbox: Sandbox, service: str, region: str, **config: Any) -> Any:
    env = sandbox.exports()
    return boto3.client(service, region_name=region, endpoint_url=env["AWS_ENDPOINT_URL"],
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], config=Config(**config))


def test_nodes_match_the_inventory_and_carry_gpus(sandbox: Sandbox, kube_api) -> None:
    for cluster in INVENTORY.clusters:
        core = client.CoreV1Api(kube_api(sandbox, cluster.name))
        nodes = core.list_node(label_selector="sagemaker.amazonaws.com/instance-group-name=gpu-workers").items
        assert len(nodes) == cluster.gpu_nodes.count
        assert sorted(n.metadata.name for n in nodes) == sorted(sandbox.twin(cluster.name).gpu_nodes)
        for node in nodes:
            labels = node.metadata.labels
            assert node.metadata.name.startswith("hyperpod-i-")
            assert labels["node.kubernetes.io/instance-type"] == cluster.gpu_nodes.instance_type
            assert labels["sagemaker.amazonaws.com/compute-type"] == "hyperpod"
            assert labels["kubernetes.io/hostname"] == node.metadata.name
            assert labels["topology.kubernetes.io/zone"].startswith(cluster.region)
            gpus = str(gpus_per_instance(cluster.gpu_nodes.instance_type))
            assert node.status.capacity["nvidia.com/gpu"] == gpus
            assert node.status.allocatable["nvidia.com/gpu"] == gpus
            assert {"cpu", "memory", "pods"} <= set(node.status.allocatable)
            assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
            assert any(a.type == "InternalIP" and a.address.startswith("10.") for a in node.status.addresses)


def test_what_a_fresh_eks_cluster_already_has(sandbox: Sandbox, kube_api) -> None:
    for cluster in INVENTORY.clusters:
        api = kube_api(sandbox, cluster.name)
        namespaces = {ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items}
        assert {"default", "kube-system"} <= namespaces
        sc = client.StorageV1Api(api).read_storage_class(cluster.ebs_storage_class)
        assert sc.provisioner == "ebs.csi.aws.com"
        assert sc.metadata.annotations["storageclass.kubernetes.io/is-default-class"] == "true"
        assert client.StorageV1Api(api).read_csi_driver("ebs.csi.aws.com").spec.attach_required
        apps = client.AppsV1Api(api)
        assert apps.read_namespaced_daemon_set("aws-node", "kube-system").metadata.name == "aws-node"
        assert apps.read_namespaced_deployment("ebs-csi-controller", "kube-system").spec.replicas == 2


def test_boto3_with_the_exports_reaches_hyperpod_then_eks(sandbox: Sandbox, monkeypatch) -> None:
    for key, value in sandbox.exports().items():
        monkeypatch.setenv(key, value)
    for cluster in INVENTORY.clusters:
        # No endpoint_url: boto3 must pick AWS_ENDPOINT_URL up from the environment, as product code does.
        sagemaker = boto3.client("sagemaker", region_name=cluster.region)
        described = sagemaker.describe_cluster(ClusterName=cluster.name)
        assert described["ClusterStatus"] == "InService"
        # A cluster whose inventory declares no NodeRecovery is created as CreateCluster leaves it: Automatic.
        assert described["NodeRecovery"] == (cluster.node_recovery or "Automatic")
        assert not described.get("TieredStorageConfig")  # stage 1 enables it, the sandbox does not
        [group] = described["InstanceGroups"]
        assert (group["InstanceGroupName"], group["InstanceType"], group["CurrentCount"]) == (
            "gpu-workers", cluster.gpu_nodes.instance_type, cluster.gpu_nodes.count)
        eks_arn = described["Orchestrator"]["Eks"]["ClusterArn"]
        eks_name = eks_arn.rsplit("/", 1)[-1]
        assert eks_name == f"{cluster.name}-eks"
        eks = boto3.client("eks", region_name=cluster.region).describe_cluster(name=eks_name)["cluster"]
        assert eks["endpoint"] == sandbox.servers[cluster.name].https_url
        ca = base64.b64decode(eks["certificateAuthority"]["data"]).decode()
        assert sandbox.tls is not None and ca == sandbox.tls.ca_pem  # the CA that signs the server's certificate
        nodes = sagemaker.list_cluster_nodes(ClusterName=cluster.name)["ClusterNodeSummaries"]
        assert len(nodes) == cluster.gpu_nodes.count


def test_kvfleets_identity_is_bound_by_k8s_rbac_and_anonymous_is_refused(sandbox: Sandbox) -> None:
    """kvfleet's EKS token (boto3, the exported keys) is the group kvfleet: allowed what k8s/rbac grants, 403
    elsewhere; no token is 401; the sandbox's admin token is system:masters."""

    from kvfleet.clients.kube import eks_token as kvfleet_token

    cluster = INVENTORY.clusters[0]
    server = sandbox.servers[cluster.name]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in sandbox.exports().items():
            mp.setenv(key, value)
        token = kvfleet_token(boto3.client("sts", region_name=cluster.region), f"{cluster.name}-eks")

    def status(path: str, auth: str | None) -> int:
        req = urllib.request.Request(server.url + path, headers={"Authorization": auth} if auth else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code

    assert sandbox.rbac_enforced
    assert status("/api/v1/nodes", f"Bearer {token}") == 200  # cluster.yaml: list nodes
    assert status("/api/v1/namespaces/default/secrets", f"Bearer {token}") == 403  # never granted
    assert status("/api/v1/nodes", None) == 401
    assert status("/api/v1/namespaces/default/secrets", f"Bearer {sandbox.admin_token}") == 200


def test_kubectl_lists_the_nodes_in_every_context(sandbox: Sandbox) -> None:
    if not KUBECTL.exists():
        pytest.skip("kubectl missing: run tools/fetch-k8s-binaries.sh")
    for cluster in INVENTORY.clusters:
        out = subprocess.run([str(KUBECTL), "--kubeconfig", str(sandbox.kubeconfig), "--context", cluster.name,
                              "get", "nodes", "-o", "name"], capture_output=True, text=True, timeout=30, check=True)
        names = sorted(line.removeprefix("node/") for line in out.stdout.split())
        assert names == sorted(sandbox.twin(cluster.name).gpu_nodes)


def test_state_files_describe_the_running_sandbox(sandbox: Sandbox) -> None:
    env = sandbox.exports()
    assert env["AWS_DEFAULT_REGION"] == INVENTORY.clusters[0].region
    conn = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
    assert conn["conn_type"] == "aws"
    assert conn["extra"] == {"endpoint_url": env["AWS_ENDPOINT_URL"], "region_name": env["AWS_DEFAULT_REGION"]}
    lines = sandbox.env_file.read_text().splitlines()
    assert f"export AWS_ENDPOINT_URL={env['AWS_ENDPOINT_URL']}" in lines
    sourced = subprocess.run(["bash", "-c", f"source {sandbox.env_file} && env"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    for key, value in env.items():
        assert f"{key}={value}" in sourced
    ports = json.loads(sandbox.ports_file.read_text())
    assert set(ports["ports"]) == set(sandbox.ports())
    assert set(ports["clusters"]) == {c.name for c in INVENTORY.clusters}


def test_stop_leaves_nothing_listening(sandbox_factory) -> None:
    sandbox = sandbox_factory()
    ports = sandbox.ports()
    assert {sandbox.aws.port, sandbox.admin.port, *(s.port for s in sandbox.servers.values())} <= set(ports)
    assert not any(port_refuses(p) for p in ports)
    sandbox.stop()
    sandbox.stop()  # idempotent
    assert all(port_refuses(p) for p in ports)


def test_admin_counts_requests_and_injects_api_errors(sandbox: Sandbox, kube_api) -> None:
    name = INVENTORY.clusters[0].name
    core = client.CoreV1Api(kube_api(sandbox, name))
    assert admin(sandbox, "/reset-requests", {})[0] == 200
    core.list_node()
    core.list_node()
    core.read_namespace("default")
    status, counts = admin(sandbox, f"/requests?cluster={name}")
    assert status == 200
    assert counts["clusters"][name]["counts"]["list nodes"] == 2
    assert counts["clusters"][name]["counts"]["get namespaces"] == 1

    assert admin(sandbox, "/fault", {"cluster": name, "kind": "api_error_rate", "rate": 1.0})[0] == 200
    with pytest.raises(ApiException) as failed:
        core.list_node()
    assert failed.value.status >= 500
    other = INVENTORY.clusters[1].name
    client.CoreV1Api(kube_api(sandbox, other)).list_node()  # only the named cluster was hit
    assert admin(sandbox, "/fault", {"cluster": name, "kind": "clear"})[0] == 200
    assert len(core.list_node().items) == INVENTORY.clusters[0].gpu_nodes.count


def test_admin_aws_faults_and_operation_log(sandbox: Sandbox) -> None:
    cluster = INVENTORY.clusters[1]
    sagemaker = aws_client(sandbox, "sagemaker", cluster.region, retries={"max_attempts": 1, "mode": "standard"})
    sagemaker.describe_cluster(ClusterName=cluster.name)
    _, log = admin(sandbox, f"/requests?cluster={cluster.name}")
    assert log["aws"]["operations"] == ["sagemaker:DescribeCluster"]
    _, log = admin(sandbox, f"/requests?cluster={INVENTORY.clusters[0].name}")
    assert log["aws"]["operations"] == []
    assert admin(sandbox, "/fault", {"kind": "api_error_rate", "rate": 1.0, "target": "aws"})[0] == 200
    with pytest.raises(ClientError) as failed:
        sagemaker.describe_cluster(ClusterName=cluster.name)
    assert failed.value.response["Error"]["Code"] == "ServiceUnavailable"
    admin(sandbox, "/fault", {"kind": "clear"})
    assert sagemaker.describe_cluster(ClusterName=cluster.name)["ClusterName"] == cluster.name


def test_admin_conflict_and_network_failure_hit_only_the_next_mutations(sandbox: Sandbox, kube_api) -> None:
    name = INVENTORY.clusters[0].name
    core = client.CoreV1Api(kube_api(sandbox, name))
    body = {"metadata": {"name": "fault-cm", "namespace": "default"}, "data": {"a": "1"}}
    status, answer = admin(sandbox, "/fault", {"cluster": name, "kind": "api_conflict", "count": 1,
                                               "resource": "configmaps", "target": "kube"})
    assert status == 200 and answer["count"] == 1
    core.list_node()  # reads are spared
    with pytest.raises(ApiException) as conflict:
        core.create_namespaced_config_map("default", body)
    assert conflict.value.status == 409 and "injected conflict" in str(conflict.value.body)
    core.create_namespaced_config_map("default", body)  # only the next one
    assert admin(sandbox, "/fault", {"cluster": name, "kind": "api_network_failure", "count": 1,
                                     "target": "kube"})[0] == 200
    with pytest.raises(Exception) as dropped:  # urllib3 gives up: no answer came (PATCH is never retried)
        core.patch_namespaced_config_map("fault-cm", "default", {"data": {"a": "2"}}, _request_timeout=10)
    assert not isinstance(dropped.value, ApiException), dropped.value
    assert core.read_namespaced_config_map("fault-cm", "default").data == {"a": "1"}
    core.patch_namespaced_config_map("fault-cm", "default", {"data": {"a": "2"}})
    core.delete_namespaced_config_map("fault-cm", "default")

    cluster = INVENTORY.clusters[1]
    sagemaker = aws_client(sandbox, "sagemaker", cluster.region, retries={"max_attempts": 1, "mode": "standard"})
    assert admin(sandbox, "/fault", {"kind": "api_conflict", "count": 1, "resource": "UpdateCluster",
                                     "target": "aws"})[0] == 200
    sagemaker.describe_cluster(ClusterName=cluster.name)  # not a mutation, not that operation
    with pytest.raises(ClientError) as aws_conflict:
        sagemaker.update_cluster(ClusterName=cluster.name, NodeRecovery="Automatic")
    assert aws_conflict.value.response["ResponseMetadata"]["HTTPStatusCode"] == 409
    assert admin(sandbox, "/fault", {"kind": "api_network_failure", "count": 3, "target": "aws"})[0] == 200
    assert admin(sandbox, "/fault", {"kind": "clear"})[0] == 200  # clear ends both kinds
    assert sandbox.aws.drops_left == 0 and sandbox.servers[name].drops_left == 0


def test_admin_fail_write_refuses_only_the_nth_write_of_that_kind(sandbox: Sandbox, kube_api) -> None:
    name = INVENTORY.clusters[0].name
    core = client.CoreV1Api(kube_api(sandbox, name))
    for cm in ("fw-a", "fw-b"):
        core.create_namespaced_config_map("default", {"metadata": {"name": cm}, "data": {"v": "0"}})
    status, answer = admin(sandbox, "/fault", {"cluster": name, "kind": "fail_write", "resource": "configmaps",
                                               "name": "fw-a", "nth": 2, "code": 503})
    assert status == 200 and answer["clusters"][name][0]["nth"] == 2
    core.patch_namespaced_config_map("fw-b", "default", {"data": {"v": "1"}})  # another object: not counted
    core.patch_namespaced_config_map("fw-a", "default", {"data": {"v": "9"}}, dry_run="All")  # not a write
    core.patch_namespaced_config_map("fw-a", "default", {"data": {"v": "1"}})  # write 1 goes through
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_config_map("fw-a", "default", {"data": {"v": "2"}})
    assert refused.value.status == 503 and "write 2 refused (sandbox fault fail_write)" in str(refused.value.body)
    assert core.read_namespaced_config_map("fw-a", "default").data == {"v": "1"}  # nothing written
    core.patch_namespaced_config_map("fw-a", "default", {"data": {"v": "3"}})  # once only
    assert admin(sandbox, "/fault", {"cluster": name, "kind": "fail_write", "resource": "configmaps",
                                     "nth": 1})[0] == 200
    assert admin(sandbox, "/fault", {"kind": "clear"})[0] == 200  # clear disarms it
    core.patch_namespaced_config_map("fw-b", "default", {"data": {"v": "4"}})


@pytest.mark.parametrize(("body", "field"), [
    ({"kind": "api_conflict"}, "count"),
    ({"kind": "api_conflict", "count": -1}, "count"),
    ({"kind": "api_conflict", "count": 10_001}, "count"),
    ({"kind": "api_conflict", "count": True}, "count"),
    ({"kind": "api_network_failure", "count": 1.5}, "count"),
    ({"kind": "api_network_failure", "count": 1, "resource": 7}, "resource"),
    ({"kind": "api_network_failure", "count": 1, "target": "dns"}, "target"),
    ({"kind": "api_conflict", "count": 1, "code": 409}, "code"),
    ({"kind": "fail_write", "resource": "deployments"}, "nth"),
    ({"kind": "fail_write", "resource": "deployments", "nth": 0}, "nth"),
    ({"kind": "fail_write", "resource": "deployments", "nth": 1, "code": 404}, "code"),
    ({"kind": "fail_write", "nth": 1}, "resource"),
    ({"kind": "l2_drop_reads", "cluster": "c", "namespace": "a", "endpoint": "b", "drop": 1}, "drop"),
    ({"kind": "l2_drop_reads", "cluster": "c", "namespace": "a", "endpoint": ""}, "endpoint"),
])
def test_admin_mutation_faults_are_range_checked(sandbox: Sandbox, body: dict[str, Any], field: str) -> None:
    status, answer = admin(sandbox, "/fault", body)
    assert status == 400 and field in answer["error"], answer
    assert sandbox.aws.conflicts_left == 0 and sandbox.aws.drops_left == 0


def test_admin_refuses_what_it_cannot_do(sandbox_factory) -> None:
    sandbox = sandbox_factory(controllers=())
    name = INVENTORY.clusters[0].name
    status, body = admin(sandbox, "/fault", {"cluster": name, "kind": "operator_rerender"})
    assert status == 409 and "operator" in body["error"]
    status, body = admin(sandbox, "/fault", {"cluster": name, "kind": "kill_pod", "namespace": "x", "name": "y"})
    assert status == 409 and "workloads" in body["error"]
    assert admin(sandbox, "/fault", {"cluster": "nope", "kind": "api_latency", "seconds": 1})[0] == 404
    assert admin(sandbox, "/fault", {"cluster": name, "kind": "meteor"})[0] == 400
    assert admin(sandbox, "/fault", {"cluster": name, "kind": "api_error_rate", "rate": 2})[0] == 400
    status, clusters = admin(sandbox, "/clusters")
    assert status == 200 and clusters["clusters"][name]["gpu_nodes"] == INVENTORY.clusters[0].gpu_nodes.count


def test_service_faults_call_the_registered_hooks(sandbox_factory, kube_api) -> None:
    sandbox = sandbox_factory(controllers=())
    name = INVENTORY.clusters[0].name
    node = client.CoreV1Api(kube_api(sandbox, name)).list_node().items[0].metadata.name
    calls: list[tuple[str, tuple[Any, ...]]] = []

    class Workloads:
        def kill_pod(self, *args: Any) -> None:
            calls.append(("kill_pod", args))

        def lose_node(self, *args: Any) -> None:
            calls.append(("lose_node", args))

    sandbox.twin(name).services["workloads"] = Workloads()
    assert admin(sandbox, "/fault", {"cluster": name, "kind": "kill_pod", "namespace": "retail", "name": "p"})[0] == 200
    assert admin(sandbox, "/fault", {"cluster": name, "kind": "lose_node", "node": node})[0] == 200
    assert admin(sandbox, "/fault", {"cluster": name, "kind": "lose_node"})[0] == 400
    assert admin(sandbox, "/fault", {"cluster": name, "kind": "lose_node", "node": "no-such-node"})[0] == 404
    assert calls == [("kill_pod", ("retail", "p")), ("lose_node", (node,))]


def test_l2_read_penalty_fault_is_range_checked(sandbox_factory) -> None:
    sandbox = sandbox_factory(controllers=("vllm",))
    name = INVENTORY.clusters[0].name
    vllm = sandbox.twin(name).services["vllm"]
    status, body = admin(sandbox, "/fault", {"cluster": name, "kind": "l2_read_penalty", "ms": -5})
    assert status == 400 and "between 0.0 and 60000.0" in body["error"] and vllm.l2_read_penalty_ms == 0
    status, body = admin(sandbox, "/fault", {"cluster": name, "kind": "l2_read_penalty", "ms": 250})
    assert status == 200 and vllm.l2_read_penalty_ms == 250.0


def test_a_missing_controller_module_is_skipped(sandbox_factory, caplog) -> None:
    sandbox = sandbox_factory(controllers=("not_written_yet",))
    assert all(not twin.controllers for twin in sandbox.twins.values())
    assert "not_written_yet does not exist yet" in caplog.text


def test_a_failing_controller_stops_everything_started(sandbox_factory, monkeypatch) -> None:
    started: list[int] = []

    def attach(twin: Any) -> Any:
        started.append(twin.aws.port)
        raise RuntimeError("controller bug")

    module = types.ModuleType("kvfleet_sandbox.controllers.broken")
    module.attach = attach  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(RuntimeError, match="controller bug"):
        sandbox_factory(controllers=("broken",))
    assert started and port_refuses(started[0])


def test_a_fleet_given_as_text(sandbox_factory, kube_api) -> None:
    # 3 nodes of 4 GPUs hold the stage cluster's 5 endpoints x 2 replicas; its endpoints move to the same type
    text = (ROOT / "tests" / "fleets" / "twin.yaml").read_text().replace("count: 12, instance_type: ml.g5.4xlarge",
                                                             "count: 3, instance_type: ml.g5.12xlarge")
    text = text.replace("instance_type: ml.g5.4xlarge,", "instance_type: ml.g5.12xlarge,")
    sandbox = sandbox_factory(text, controllers=())
    nodes = client.CoreV1Api(kube_api(sandbox, "ml-stage-usw2")).list_node().items
    assert len(nodes) == 3
    assert {n.status.capacity["nvidia.com/gpu"] for n in nodes} == {"4"}


def test_admin_traffic_mix_sets_an_endpoints_traffic_and_refuses_bad_rows(sandbox: Sandbox) -> None:
    name = INVENTORY.clusters[0].name
    vllm = sandbox.twins[name].services["vllm"]
    for body, field in (({"cluster": name, "endpoint": "ep", "rows": []}, '"rows"'),
                        ({"cluster": name, "endpoint": "ep", "rows": [[0, 10, 0.5]]}, "rows[0]: 'tokens'"),
                        ({"cluster": name, "endpoint": "ep", "rows": [[100, 10, 1.5]]}, "rows[0]: 'hit'"),
                        ({"cluster": name, "endpoint": "ep", "rows": [[100, 10]]}, "rows[0] must be"),
                        ({"cluster": name, "endpoint": "", "rows": [[100, 10, 0.5]]}, '"endpoint"'),
                        ({"cluster": name, "endpoint": "ep", "rows": [[100, 10, 0.5]], "x": 1}, "no field 'x'")):
        status, answer = admin(sandbox, "/traffic-mix", body)
        assert status == 400 and field in answer["error"], (body, answer)
        assert vllm.traffic_mix("ep") == ()  # a refused body changes nothing
    status, answer = admin(sandbox, "/traffic-mix", {"cluster": name, "endpoint": "ep", "rows": [[180, 20000, 0.6]]})
    assert status == 200 and answer == {"clusters": [name], "endpoint": "ep", "rows": 1}
    assert vllm.traffic_mix("ep") == ((180, 20000, 0.6),)
    other = sandbox.twins[INVENTORY.clusters[1].name].services["vllm"]
    assert other.traffic_mix("ep") == ()  # only the named cluster
