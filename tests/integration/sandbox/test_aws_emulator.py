"""The sandbox's AWS emulator, driven only through real boto3 clients (kvfleet_sandbox.aws).

Every answer is parsed by botocore itself, and :func:`assert_output_shape` then checks the parsed answer
against the operation's output shape with botocore's validator (required members, types), because the parser
alone forgives too much: it drops members it does not know and never checks that required ones came back.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.validate import ParamValidator

from kvfleet.fleet.constants import OPERATOR_ADDON
from kvfleet_sandbox.aws import AwsEmulator

pytestmark = pytest.mark.integration

REGION = "us-west-2"
ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/hyperpod-exec"
GPU_GROUP = {"InstanceGroupName": "gpu", "InstanceType": "ml.g6e.4xlarge", "InstanceCount": 2}
_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def client(emulator: AwsEmulator, service: str, **config: Any) -> Any:
    return boto3.client(
        service,
        endpoint_url=emulator.url,
        region_name=REGION,
        aws_access_key_id="AKIDSANDBOX",
        aws_secret_access_key="sandbox-secret",
        config=Config(**config) if config else None,
    )


def assert_output_shape(api: Any, operation: str, response: dict[str, Any]) -> dict[str, Any]:
    """The parsed response satisfies ``operation``'s output shape; returns it for chaining."""
    shape = api.meta.service_model.operation_model(operation).output_shape
    body = {k: v for k, v in response.items() if k != "ResponseMetadata"}
    report = ParamValidator().validate(body, shape)
    assert not report.has_errors(), report.generate_report()
    return response


def error_of(call: Callable[[], Any]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response
    return error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Message"]


def wait_for(probe: Callable[[], Any], want: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        seen = probe()
        if seen == want or time.monotonic() > deadline:
            assert seen == want
            return seen
        time.sleep(0.02)


class HoldableClock:
    """The module emulator's transition clock (``aws_clock.Clock``): wall time, except that no transition
    finishes while a test holds it; held ones finish once it lets go. A test that asserts an in-flight state
    (``Updating``, ``UPDATING``, a conflict with the change under way) holds it, instead of racing the delay."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holds = 0

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        with self._cond:
            while (left := deadline - time.monotonic()) > 0 or self._holds:
                self._cond.wait(left if left > 0 else None)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._cond:
            self._holds += 1
        try:
            yield
        finally:
            with self._cond:
                self._holds -= 1
                self._cond.notify_all()


TRANSITIONS = HoldableClock()


@pytest.fixture(scope="module")
def emulator() -> Iterator[AwsEmulator]:
    emu = AwsEmulator(account_id=ACCOUNT, delay_s=0.25, clock=TRANSITIONS)  # in-flight states: TRANSITIONS.held()
    emu.start()
    yield emu
    emu.stop()


@pytest.fixture(scope="module")
def sagemaker(emulator: AwsEmulator) -> Any:
    return client(emulator, "sagemaker")


@pytest.fixture(scope="module")
def eks(emulator: AwsEmulator) -> Any:
    return client(emulator, "eks")


@pytest.fixture
def fleet(emulator: AwsEmulator) -> dict[str, str]:
    """A seeded EKS cluster and the InService HyperPod cluster orchestrated by it."""
    eks_name, hp_name = unique("eks"), unique("hp")
    eks_arn = emulator.add_eks_cluster(eks_name, REGION, "http://127.0.0.1:6443")
    hp_arn = emulator.add_hyperpod_cluster(hp_name, REGION, eks_name, [dict(GPU_GROUP, ExecutionRole=ROLE)])
    return {"eks": eks_name, "eks_arn": eks_arn, "hp": hp_name, "hp_arn": hp_arn}


def hp_status(sagemaker: Any, name: str) -> str:
    return sagemaker.describe_cluster(ClusterName=name)["ClusterStatus"]


def addon_status(eks: Any, cluster: str, addon: str) -> str:
    return eks.describe_addon(clusterName=cluster, addonName=addon)["addon"]["status"]


# --- STS -------------------------------------------------------------------------------------------------


def test_sts_caller_identity(emulator: AwsEmulator) -> None:
    sts = client(emulator, "sts")
    identity = assert_output_shape(sts, "GetCallerIdentity", sts.get_caller_identity())
    assert identity["Account"] == ACCOUNT
    assert identity["Arn"].startswith(f"arn:aws:iam::{ACCOUNT}:")
    assert identity["UserId"]


# --- SageMaker HyperPod ------------------------------------------------------------------------------------


def test_describe_seeded_cluster_by_name_and_arn(sagemaker: Any, fleet: dict[str, str]) -> None:
    by_name = assert_output_shape(
        sagemaker, "DescribeCluster", sagemaker.describe_cluster(ClusterName=fleet["hp"])
    )
    assert re.fullmatch(
        rf"arn:aws:sagemaker:{REGION}:{ACCOUNT}:cluster/[a-z0-9]{{12}}", by_name["ClusterArn"]
    )
    assert by_name["ClusterArn"] == fleet["hp_arn"]
    assert by_name["ClusterStatus"] == "InService"
    assert by_name["Orchestrator"]["Eks"]["ClusterArn"] == fleet["eks_arn"]
    assert by_name["Orchestrator"]["Eks"]["ClusterArn"].split("/")[-1] == fleet["eks"]
    assert by_name["NodeRecovery"] == "Automatic"
    assert "TieredStorageConfig" not in by_name
    [group] = by_name["InstanceGroups"]
    assert group["InstanceGroupName"] == "gpu" and group["InstanceType"] == "ml.g6e.4xlarge"
    assert group["CurrentCount"] == group["TargetCount"] == 2 and group["Status"] == "InService"
    by_arn = sagemaker.describe_cluster(ClusterName=fleet["hp_arn"])
    assert by_arn["ClusterName"] == fleet["hp"]


def test_describe_missing_cluster_is_resource_not_found(sagemaker: Any) -> None:
    code, status, message = error_of(lambda: sagemaker.describe_cluster(ClusterName="no-such-cluster"))
    assert (code, status) == ("ResourceNotFound", 400)
    assert "no-such-cluster" in message


def test_cluster_in_another_region_is_not_found(emulator: AwsEmulator, fleet: dict[str, str]) -> None:
    elsewhere = boto3.client(
        "sagemaker",
        endpoint_url=emulator.url,
        region_name="eu-west-1",
        aws_access_key_id="a",
        aws_secret_access_key="b",
    )
    assert error_of(lambda: elsewhere.describe_cluster(ClusterName=fleet["hp"]))[0] == "ResourceNotFound"


def test_create_cluster_keeps_settings_and_comes_in_service(sagemaker: Any, fleet: dict[str, str]) -> None:
    name = unique("created")
    created = sagemaker.create_cluster(
        ClusterName=name,
        InstanceGroups=[
            {
                "InstanceGroupName": "workers",
                "InstanceType": "ml.g5.4xlarge",
                "InstanceCount": 3,
                "ExecutionRole": ROLE,
                "ThreadsPerCore": 1,
                "LifeCycleConfig": {"SourceS3Uri": "s3://bucket/lc/", "OnCreate": "on_create.sh"},
            }
        ],
        Orchestrator={"Eks": {"ClusterArn": fleet["eks_arn"]}},
        NodeRecovery="None",
        TieredStorageConfig={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 30},
    )
    assert_output_shape(sagemaker, "CreateCluster", created)
    assert hp_status(sagemaker, name) == "Creating"
    wait_for(lambda: hp_status(sagemaker, name), "InService")
    described = assert_output_shape(
        sagemaker, "DescribeCluster", sagemaker.describe_cluster(ClusterName=name)
    )
    assert described["ClusterArn"] == created["ClusterArn"]
    assert described["Orchestrator"] == {"Eks": {"ClusterArn": fleet["eks_arn"]}}
    assert described["NodeRecovery"] == "None"
    assert described["TieredStorageConfig"] == {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 30}
    [group] = described["InstanceGroups"]
    assert (group["InstanceType"], group["CurrentCount"], group["ThreadsPerCore"]) == ("ml.g5.4xlarge", 3, 1)
    listed = assert_output_shape(sagemaker, "ListClusters", sagemaker.list_clusters(NameContains=name))
    assert [c["ClusterName"] for c in listed["ClusterSummaries"]] == [name]
    assert error_of(lambda: sagemaker.create_cluster(ClusterName=name))[0] == "ResourceInUse"


def test_list_cluster_nodes(sagemaker: Any, fleet: dict[str, str]) -> None:
    nodes = assert_output_shape(
        sagemaker, "ListClusterNodes", sagemaker.list_cluster_nodes(ClusterName=fleet["hp"])
    )
    summaries = nodes["ClusterNodeSummaries"]
    assert len(summaries) == 2 and "NextToken" not in nodes
    for node in summaries:
        assert re.fullmatch(r"i-[0-9a-f]{17}", node["InstanceId"])
        assert node["InstanceGroupName"] == "gpu" and node["InstanceType"] == "ml.g6e.4xlarge"
        assert node["InstanceStatus"]["Status"] == "Running" and node["LaunchTime"]
    first = sagemaker.list_cluster_nodes(ClusterName=fleet["hp"], MaxResults=1)
    second = sagemaker.list_cluster_nodes(ClusterName=fleet["hp"], MaxResults=1, NextToken=first["NextToken"])
    paged = first["ClusterNodeSummaries"] + second["ClusterNodeSummaries"]
    assert [n["InstanceId"] for n in paged] == [n["InstanceId"] for n in summaries]
    assert error_of(lambda: sagemaker.list_cluster_nodes(ClusterName="ghost"))[0] == "ResourceNotFound"


def test_tiered_storage_alone_is_refused(
    emulator: AwsEmulator, sagemaker: Any, fleet: dict[str, str]
) -> None:
    emulator.reset_request_log()
    code, status, message = error_of(
        lambda: sagemaker.update_cluster(
            ClusterName=fleet["hp"],
            TieredStorageConfig={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20},
        )
    )
    assert (code, status) == ("ValidationException", 400)
    assert "NodeRecovery" in message and "InstanceGroups" in message
    assert hp_status(sagemaker, fleet["hp"]) == "InService"  # nothing started
    assert emulator.operations("sagemaker") == ["UpdateCluster", "DescribeCluster"]


def test_tiered_storage_with_node_recovery_is_accepted(
    emulator: AwsEmulator, sagemaker: Any, fleet: dict[str, str]
) -> None:
    seen: list[tuple[str, str, dict[str, Any]]] = []
    emulator.on_tiered_storage(lambda hp, eks_name, config: seen.append((hp, eks_name, config)))
    wanted = {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20}
    with TRANSITIONS.held():
        answer = sagemaker.update_cluster(
            ClusterName=fleet["hp"], TieredStorageConfig=wanted, NodeRecovery="Automatic"
        )
        assert assert_output_shape(sagemaker, "UpdateCluster", answer)["ClusterArn"] == fleet["hp_arn"]
        assert hp_status(sagemaker, fleet["hp"]) == "Updating"
    wait_for(lambda: hp_status(sagemaker, fleet["hp"]), "InService")
    assert sagemaker.describe_cluster(ClusterName=fleet["hp"])["TieredStorageConfig"] == wanted
    assert (fleet["hp"], fleet["eks"], wanted) in seen


def test_tiered_storage_with_instance_groups_is_accepted(sagemaker: Any, fleet: dict[str, str]) -> None:
    with TRANSITIONS.held():
        sagemaker.update_cluster(
            ClusterName=fleet["hp"],
            TieredStorageConfig={"Mode": "Disable"},
            InstanceGroups=[dict(GPU_GROUP, InstanceCount=3, ExecutionRole=ROLE)],
        )
        [group] = sagemaker.describe_cluster(ClusterName=fleet["hp"])["InstanceGroups"]
        assert (group["Status"], group["CurrentCount"], group["TargetCount"]) == ("Updating", 2, 3)
    wait_for(lambda: hp_status(sagemaker, fleet["hp"]), "InService")
    described = sagemaker.describe_cluster(ClusterName=fleet["hp"])
    assert described["TieredStorageConfig"] == {"Mode": "Disable"}
    assert described["InstanceGroups"][0]["CurrentCount"] == 3
    assert len(sagemaker.list_cluster_nodes(ClusterName=fleet["hp"])["ClusterNodeSummaries"]) == 3


@pytest.mark.parametrize(
    "config",
    [
        {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 15},
        {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 101},
        {"Mode": "On"},
    ],
    ids=["percent-15", "percent-101", "mode-On"],
)
def test_invalid_tiered_storage_is_refused(
    sagemaker: Any, fleet: dict[str, str], config: dict[str, Any]
) -> None:
    # botocore passes all three client-side (docs/reference/hyperpod.md#client-side-validation): the service has to
    # refuse them.
    code, status, message = error_of(
        lambda: sagemaker.update_cluster(
            ClusterName=fleet["hp"], TieredStorageConfig=config, NodeRecovery="Automatic"
        )
    )
    assert (code, status) == ("ValidationException", 400)
    assert "tieredStorageConfig" in message
    assert hp_status(sagemaker, fleet["hp"]) == "InService"


def test_update_during_update_conflicts(sagemaker: Any, fleet: dict[str, str]) -> None:
    with TRANSITIONS.held():
        sagemaker.update_cluster(ClusterName=fleet["hp"], NodeRecovery="None")
        assert error_of(lambda: sagemaker.update_cluster(ClusterName=fleet["hp"], NodeRecovery="Automatic"))[
            0
        ] == ("ConflictException")
    wait_for(lambda: hp_status(sagemaker, fleet["hp"]), "InService")
    assert sagemaker.describe_cluster(ClusterName=fleet["hp"])["NodeRecovery"] == "None"


def test_injected_update_failure(emulator: AwsEmulator, sagemaker: Any, fleet: dict[str, str]) -> None:
    emulator.fail_next_update(fleet["hp"], "InsufficientInstanceCapacity for ml.g6e.4xlarge")
    sagemaker.update_cluster(
        ClusterName=fleet["hp"], TieredStorageConfig={"Mode": "Enable"}, NodeRecovery="Automatic"
    )
    wait_for(lambda: hp_status(sagemaker, fleet["hp"]), "Failed")
    described = assert_output_shape(
        sagemaker, "DescribeCluster", sagemaker.describe_cluster(ClusterName=fleet["hp"])
    )
    assert "InsufficientInstanceCapacity" in described["FailureMessage"]
    assert "TieredStorageConfig" not in described  # a failed update changes nothing
    sagemaker.update_cluster(
        ClusterName=fleet["hp"], TieredStorageConfig={"Mode": "Enable"}, NodeRecovery="Automatic"
    )
    wait_for(lambda: hp_status(sagemaker, fleet["hp"]), "InService")
    assert sagemaker.describe_cluster(ClusterName=fleet["hp"])["TieredStorageConfig"] == {
        "Mode": "Enable",
        "InstanceMemoryAllocationPercentage": 20,
    }


def test_scaled_clock_drives_transitions(fleet: dict[str, str]) -> None:
    class ScaledClock:
        """A thousand model seconds per wall second."""

        def sleep(self, seconds: float) -> None:
            time.sleep(seconds / 1000)

        def now(self) -> float:
            return time.time()

    with AwsEmulator(delay_s=600, clock=ScaledClock()) as fast:
        fast.add_eks_cluster("eks-x", REGION, "http://127.0.0.1:1")
        fast.add_hyperpod_cluster("hp-x", REGION, "eks-x", [dict(GPU_GROUP, ExecutionRole=ROLE)])
        sm = client(fast, "sagemaker")
        sm.update_cluster(ClusterName="hp-x", NodeRecovery="None")
        # 600 model seconds are 0.6 wall seconds here; on wall time they would be 600: the bound tells them apart
        wait_for(lambda: hp_status(sm, "hp-x"), "InService", timeout=60)


# --- EKS ---------------------------------------------------------------------------------------------------


def test_eks_describe_cluster(eks: Any, fleet: dict[str, str]) -> None:
    cluster = assert_output_shape(eks, "DescribeCluster", eks.describe_cluster(name=fleet["eks"]))["cluster"]
    assert (cluster["name"], cluster["arn"], cluster["status"]) == (fleet["eks"], fleet["eks_arn"], "ACTIVE")
    assert cluster["endpoint"] == "http://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificateAuthority"]["data"]).startswith(
        b"-----BEGIN CERTIFICATE-----"
    )
    assert re.fullmatch(r"1\.\d+", cluster["version"])
    code, status, _ = error_of(lambda: eks.describe_cluster(name="ghost"))
    assert (code, status) == ("ResourceNotFoundException", 404)


def test_addon_create_goes_active_with_configuration_kept(eks: Any, fleet: dict[str, str]) -> None:
    config = json.dumps({"executionRoleArn": ROLE, "tlsCertificateS3Bucket": "hyperpod-tls-sandbox"})
    created = eks.create_addon(
        clusterName=fleet["eks"],
        addonName=OPERATOR_ADDON,
        configurationValues=config,
        resolveConflicts="OVERWRITE",
    )
    addon = assert_output_shape(eks, "CreateAddon", created)["addon"]
    assert addon["status"] == "CREATING" and addon["health"] == {"issues": []}
    wait_for(lambda: addon_status(eks, fleet["eks"], OPERATOR_ADDON), "ACTIVE")
    described = assert_output_shape(
        eks, "DescribeAddon", eks.describe_addon(clusterName=fleet["eks"], addonName=OPERATOR_ADDON)
    )["addon"]
    assert described["configurationValues"] == config
    assert re.fullmatch(r"v1\.\d+\.\d+-eksbuild\.\d+", described["addonVersion"])
    assert described["addonArn"].startswith(f"arn:aws:eks:{REGION}:{ACCOUNT}:addon/{fleet['eks']}/")
    eks.create_addon(clusterName=fleet["eks"], addonName="metrics-server", addonVersion="v0.7.2-eksbuild.3")
    listed = assert_output_shape(eks, "ListAddons", eks.list_addons(clusterName=fleet["eks"]))
    assert listed["addons"] == sorted([OPERATOR_ADDON, "metrics-server"])
    page = eks.list_addons(clusterName=fleet["eks"], maxResults=1)
    assert len(page["addons"]) == 1 and page["nextToken"]
    assert addon_status(eks, fleet["eks"], "metrics-server") in ("CREATING", "ACTIVE")
    assert (
        eks.describe_addon(clusterName=fleet["eks"], addonName="metrics-server")["addon"]["addonVersion"]
        == "v0.7.2-eksbuild.3"
    )


def test_addon_errors(eks: Any, fleet: dict[str, str]) -> None:
    cluster = fleet["eks"]
    code, status, _ = error_of(
        lambda: eks.create_addon(
            clusterName=cluster, addonName="cert-manager", configurationValues="{not json"
        )
    )
    assert (code, status) == ("InvalidParameterException", 400)
    assert (
        error_of(
            lambda: eks.create_addon(
                clusterName=cluster, addonName="cert-manager", resolveConflicts="SOMETIMES"
            )
        )[0]
        == "InvalidParameterException"
    )
    assert error_of(lambda: eks.create_addon(clusterName=cluster, addonName="cert-manger"))[0] == (
        "InvalidParameterException"
    )
    eks.create_addon(clusterName=cluster, addonName="cert-manager")
    code, status, _ = error_of(lambda: eks.create_addon(clusterName=cluster, addonName="cert-manager"))
    assert (code, status) == ("ResourceInUseException", 409)
    code, status, _ = error_of(lambda: eks.describe_addon(clusterName=cluster, addonName="metrics-server"))
    assert (code, status) == ("ResourceNotFoundException", 404)
    code, status, _ = error_of(lambda: eks.create_addon(clusterName="ghost", addonName="cert-manager"))
    assert (code, status) == ("ResourceNotFoundException", 404)


def test_addon_update_and_describe_update(eks: Any, fleet: dict[str, str]) -> None:
    cluster = fleet["eks"]
    eks.create_addon(clusterName=cluster, addonName="cert-manager")
    wait_for(lambda: addon_status(eks, cluster, "cert-manager"), "ACTIVE")
    with TRANSITIONS.held():
        answer = eks.update_addon(
            clusterName=cluster,
            addonName="cert-manager",
            addonVersion="v1.18.0-eksbuild.1",
            configurationValues='{"replicaCount": 2}',
            resolveConflicts="PRESERVE",
        )
        update = assert_output_shape(eks, "UpdateAddon", answer)["update"]
        assert (update["type"], update["status"]) == ("AddonUpdate", "InProgress") and update["id"]
        assert {"type": "AddonVersion", "value": "v1.18.0-eksbuild.1"} in update["params"]
        assert addon_status(eks, cluster, "cert-manager") == "UPDATING"
        assert error_of(lambda: eks.update_addon(clusterName=cluster, addonName="cert-manager"))[0] == (
            "ResourceInUseException"
        )
    wait_for(lambda: addon_status(eks, cluster, "cert-manager"), "ACTIVE")
    addon = eks.describe_addon(clusterName=cluster, addonName="cert-manager")["addon"]
    assert (addon["addonVersion"], addon["configurationValues"]) == (
        "v1.18.0-eksbuild.1",
        '{"replicaCount": 2}',
    )
    done = eks.describe_update(name=cluster, updateId=update["id"], addonName="cert-manager")
    assert assert_output_shape(eks, "DescribeUpdate", done)["update"]["status"] == "Successful"


def test_hook_fails_operator_addon_without_cert_manager(
    emulator: AwsEmulator, eks: Any, fleet: dict[str, str]
) -> None:
    cluster = fleet["eks"]

    def operator_needs_cert_manager(eks_name: str, addon: str, body: dict[str, Any]) -> str | None:
        if (
            eks_name == cluster
            and addon == OPERATOR_ADDON
            and emulator.addon_status(eks_name, "cert-manager") != ("ACTIVE")
        ):
            return "cert-manager is not installed: the operator's webhook certificates cannot be issued"
        return None

    emulator.on_addon_transition(operator_needs_cert_manager)
    eks.create_addon(clusterName=cluster, addonName=OPERATOR_ADDON)
    wait_for(lambda: addon_status(eks, cluster, OPERATOR_ADDON), "CREATE_FAILED")
    addon = assert_output_shape(
        eks, "DescribeAddon", eks.describe_addon(clusterName=cluster, addonName=OPERATOR_ADDON)
    )["addon"]
    [issue] = addon["health"]["issues"]
    assert "cert-manager" in issue["message"] and issue["code"]
    assert emulator.addon_status(cluster, OPERATOR_ADDON) == "CREATE_FAILED"
    # With cert-manager ACTIVE, an update of the failed add-on succeeds and clears the issue.
    eks.create_addon(clusterName=cluster, addonName="cert-manager")
    wait_for(lambda: emulator.addon_status(cluster, "cert-manager"), "ACTIVE")
    eks.update_addon(clusterName=cluster, addonName=OPERATOR_ADDON, resolveConflicts="OVERWRITE")
    wait_for(lambda: addon_status(eks, cluster, OPERATOR_ADDON), "ACTIVE")
    assert eks.describe_addon(clusterName=cluster, addonName=OPERATOR_ADDON)["addon"]["health"] == {
        "issues": []
    }


def test_injected_addon_failure_and_delete(emulator: AwsEmulator, eks: Any, fleet: dict[str, str]) -> None:
    cluster = fleet["eks"]
    eks.create_addon(clusterName=cluster, addonName="aws-fsx-csi-driver")
    wait_for(lambda: addon_status(eks, cluster, "aws-fsx-csi-driver"), "ACTIVE")
    emulator.fail_addon(cluster, "aws-fsx-csi-driver", "DaemonSet fsx-csi-node has no ready pods")
    update = eks.update_addon(clusterName=cluster, addonName="aws-fsx-csi-driver")["update"]
    wait_for(lambda: addon_status(eks, cluster, "aws-fsx-csi-driver"), "UPDATE_FAILED")
    issues = eks.describe_addon(clusterName=cluster, addonName="aws-fsx-csi-driver")["addon"]["health"][
        "issues"
    ]
    assert issues[0]["message"] == "DaemonSet fsx-csi-node has no ready pods"
    failed = eks.describe_update(name=cluster, updateId=update["id"], addonName="aws-fsx-csi-driver")[
        "update"
    ]
    assert failed["status"] == "Failed" and failed["errors"]
    deleted = assert_output_shape(
        eks, "DeleteAddon", eks.delete_addon(clusterName=cluster, addonName="aws-fsx-csi-driver")
    )
    assert deleted["addon"]["status"] == "DELETING"
    wait_for(lambda: emulator.addon_status(cluster, "aws-fsx-csi-driver"), None)
    assert error_of(lambda: eks.describe_addon(clusterName=cluster, addonName="aws-fsx-csi-driver"))[0] == (
        "ResourceNotFoundException"
    )


# --- the emulator itself -----------------------------------------------------------------------------------


def test_request_log(emulator: AwsEmulator, sagemaker: Any, eks: Any, fleet: dict[str, str]) -> None:
    emulator.reset_request_log()
    sagemaker.describe_cluster(ClusterName=fleet["hp"])
    eks.list_addons(clusterName=fleet["eks"], maxResults=5)
    assert [entry[:3] for entry in emulator.request_log] == [
        ("sagemaker", "DescribeCluster", {"ClusterName": fleet["hp"]}),
        ("eks", "ListAddons", {"clusterName": fleet["eks"], "maxResults": 5}),
    ]
    service, operation, params = emulator.request_log[0][:3]
    assert (service, operation, params) == ("sagemaker", "DescribeCluster", {"ClusterName": fleet["hp"]})
    # Each entry also says where and by whom: the hub's base identity, in the hub, without session tags.
    first = emulator.request_log[0]
    assert (first.account, first.caller_arn, first.session_tags) == (
        ACCOUNT, f"arn:aws:iam::{ACCOUNT}:user/kvfleet-sandbox", ())
    assert emulator.operations() == ["DescribeCluster", "ListAddons"]
    assert emulator.operations("eks") == ["ListAddons"]
    # What a dry run is checked with: no call that changes anything was sent.
    assert not {"UpdateCluster", "CreateAddon", "UpdateAddon", "DeleteAddon"} & set(emulator.operations())
    emulator.reset_request_log()
    assert emulator.request_log == [] and emulator.operations() == []


def test_injected_errors_look_like_a_brown_out(emulator: AwsEmulator, fleet: dict[str, str]) -> None:
    impatient = client(emulator, "sagemaker", retries={"max_attempts": 1, "mode": "standard"})
    emulator.error_rate = 1.0
    try:
        code, status, _ = error_of(lambda: impatient.describe_cluster(ClusterName=fleet["hp"]))
    finally:
        emulator.error_rate = 0.0
    assert (code, status) == ("ServiceUnavailable", 503)
    assert impatient.describe_cluster(ClusterName=fleet["hp"])["ClusterStatus"] == "InService"


def test_unimplemented_operation_says_so(sagemaker: Any) -> None:
    code, status, message = error_of(lambda: sagemaker.delete_cluster(ClusterName="anything"))
    assert (code, status) == ("NotImplemented", 501)
    assert "DeleteCluster" in message


def test_stop_leaves_nothing_listening() -> None:
    emu = AwsEmulator(delay_s=3600)
    emu.start()
    assert emu.url.startswith("http://127.0.0.1:")
    emu.add_eks_cluster("eks-stop", REGION, "http://127.0.0.1:1")
    api = client(emu, "eks")
    timers_before = {t for t in threading.enumerate() if t.name.startswith("aws-emulator:")}
    api.create_addon(clusterName="eks-stop", addonName="metrics-server")  # a one-hour timer is now pending
    pending = {t for t in threading.enumerate() if t.name.startswith("aws-emulator:")} - timers_before
    assert pending, "creating the add-on started no transition timer"
    emu.stop()
    # stop() ended the pending timer rather than leaving it to sleep out its hour (a bound, not a timing)
    for timer in pending:
        timer.join(60)
    assert not [t.name for t in pending if t.is_alive()], "stop() did not cancel the pending transition timer"
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", emu.port), timeout=1):
        pass
    assert emu.addon_status("eks-stop", "metrics-server") == "CREATING"  # the timer was cancelled


def test_missing_required_member_is_refused_by_the_service(emulator: AwsEmulator) -> None:
    unchecked = client(emulator, "sagemaker", parameter_validation=False)
    code, status, message = error_of(lambda: unchecked.update_cluster(NodeRecovery="Automatic"))
    assert (code, status) == ("ValidationException", 400)
    assert "ClusterName" in message


# --- IAM, S3 and SNS (moto behind the same endpoint) ----------------------------------------------------------


def test_sns_publish_through_airflows_hook_is_in_the_request_log(
    emulator: AwsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.amazon.aws.hooks.sns import SnsHook

    for key, value in {"AWS_ENDPOINT_URL": emulator.url, "AWS_ACCESS_KEY_ID": "AKIDSANDBOX",
                       "AWS_SECRET_ACCESS_KEY": "sandbox-secret"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
    sns = client(emulator, "sns")
    topic = sns.create_topic(Name=unique("kvfleet-notify"))["TopicArn"]
    emulator.reset_request_log()
    hook = SnsHook(aws_conn_id=None, region_name=REGION)
    hook.publish_to_target(topic, "gate waiting: ml-stage-usw2 wave 2", subject="kvfleet gate",
                           message_attributes={"cluster": "ml-stage-usw2"})
    assert emulator.operations() == ["Publish"]
    (published,) = emulator.published(topic)
    assert published["TargetArn"] == topic
    # SnsHook.publish_to_target sends MessageStructure=json with the text under "default".
    assert published["MessageStructure"] == "json" and published["Subject"] == "kvfleet gate"
    assert json.loads(published["Message"]) == {"default": "gate waiting: ml-stage-usw2 wave 2"}
    assert published["MessageAttributes.entry.1.Name"] == "cluster"
    assert published["MessageAttributes.entry.1.Value.StringValue"] == "ml-stage-usw2"
    assert emulator.published("arn:aws:sns:us-west-2:123456789012:other") == []


def test_iam_and_s3_answer_like_aws(emulator: AwsEmulator) -> None:
    iam, s3 = client(emulator, "iam"), client(emulator, "s3")
    name = unique("exec-role")
    assert error_of(lambda: iam.get_role(RoleName=name))[:2] == ("NoSuchEntity", 404)
    iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}))
    # (boto3 decodes the policy document into a dict, so the output shape's string check does not apply)
    assert iam.get_role(RoleName=name)["Role"]["Arn"] == f"arn:aws:iam::{ACCOUNT}:role/{name}"
    bucket = unique("hyperpod-tls-emu")
    assert error_of(lambda: s3.head_bucket(Bucket=bucket))[:2] == ("404", 404)
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.head_bucket(Bucket=bucket)
    ops = [(e.service, e.operation, e.params.get("Bucket") or e.params.get("RoleName"))
           for e in emulator.request_log if e.service in ("iam", "s3")][-6:]
    assert ops == [("iam", "GetRole", name), ("iam", "CreateRole", name), ("iam", "GetRole", name),
                   ("s3", "HeadBucket", bucket), ("s3", "CreateBucket", bucket), ("s3", "HeadBucket", bucket)]


def test_moto_state_is_per_account_and_forgotten_when_the_last_emulator_stops() -> None:
    def roles(emu: AwsEmulator) -> list[str]:
        return [r["RoleName"] for r in client(emu, "iam").list_roles()["Roles"]]

    doc = json.dumps({"Version": "2012-10-17", "Statement": []})
    with AwsEmulator(account_id="111111111111") as first, AwsEmulator(account_id="222222222222") as other:
        client(first, "iam").create_role(RoleName="only-in-first", AssumeRolePolicyDocument=doc)
        assert roles(first) == ["only-in-first"] and roles(other) == []
        with AwsEmulator(account_id="111111111111") as same_account:  # one account, one IAM
            assert roles(same_account) == ["only-in-first"]
        assert roles(first) == ["only-in-first"]  # the second one stopping did not wipe the first's state
    with AwsEmulator(account_id="111111111111") as again:
        assert roles(again) == []


def test_injected_errors_reach_moto_services_too(emulator: AwsEmulator) -> None:
    impatient = client(emulator, "sns", retries={"max_attempts": 1, "mode": "standard"})
    emulator.error_rate = 1.0
    try:
        code, status, _ = error_of(lambda: impatient.list_topics())
    finally:
        emulator.error_rate = 0.0
    assert (code, status) == ("ServiceUnavailable", 503)
