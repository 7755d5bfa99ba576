"""The twin enforces IAM identity policies on every AWS call (kvfleet_sandbox.aws_iam_enforce): at start-up the sandbox
attaches k8s/iam/kvfleet-policy.json to kvfleet's principal in each account (runtime._attach_iam), and the emulator
authorizes every call but the administrator's with them, SageMaker and EKS (the twin's own emulation) included.

Driven through real boto3 clients with kvfleet's exported key (single account: tests/fleets/twin.yaml) and with the
hub's sessions and an account's own key (tests/fleets/multi-account.yaml, in test_iam_enforced_accounts.py:
moto's IAM is per process and account, so the two fleets' hubs must not be alive at once). Each test changes the
attached policies through the twin's IAM and puts them back. Rules and sources:
tests/conformance/facts/iam_enforcement.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from kvfleet_sandbox.aws_iam_enforce import DEFAULT_POLICY_FILES
from kvfleet_sandbox.aws_sts import BASE_USER
from kvfleet_sandbox.runtime import Sandbox, start_sandbox
from kvfleet_sandbox.twin import SandboxSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
HUB, REGION = "123456789012", "us-east-1"
KVFLEET = f"arn:aws:iam::{HUB}:user/{BASE_USER}"
POLICY = json.loads(DEFAULT_POLICY_FILES[0].read_text())
POLICY_NAME = DEFAULT_POLICY_FILES[0].stem
RAW = Config(retries={"max_attempts": 1})
NOT_ALLOWED = "User: {arn} is not authorized to perform: {action} on resource: {resource} because no " \
              "identity-based policy allows the {action} action"
EXPLICIT = "User: {arn} is not authorized to perform: {action} on resource: {resource} with an explicit deny in an " \
           "identity-based policy"


def client(sandbox: Sandbox, service: str, key: str = "sandbox", secret: str = "sandbox", token: str | None = None,
           region: str = REGION) -> Any:
    return boto3.client(service, endpoint_url=sandbox.aws.url, region_name=region, aws_access_key_id=key,
                        aws_secret_access_key=secret, aws_session_token=token, config=RAW)


def error_of(call: Callable[[], Any]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response
    return error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Message"]


def without(action: str) -> dict[str, Any]:
    """kvfleet-policy.json less one action (its statement keeps the others)."""
    statements = []
    for st in POLICY["Statement"]:
        actions = [a for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"]) if a != action]
        if actions:
            statements.append({**st, "Action": actions})
    return {**POLICY, "Statement": statements}


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = start_sandbox(ROOT / "tests" / "fleets" / "twin.yaml", tmp_path_factory.mktemp("iam"),
                            SandboxSettings(), controllers=())
    try:
        yield sandbox
    finally:
        sandbox.stop()


@pytest.fixture
def policies(sb: Sandbox) -> Iterator[Callable[..., None]]:
    """``set(**{policy_name: document})`` replaces kvfleet's inline policies; the original is put back after."""
    from moto.iam.models import iam_backends

    user = iam_backends[HUB]["aws"].get_user(BASE_USER)
    saved = dict(user.policies)

    def set_(**documents: dict[str, Any]) -> None:
        user.policies.clear()
        for name, doc in documents.items():
            sb.aws._moto.put_inline_policy(HUB, "user", BASE_USER, name, json.dumps(doc))

    try:
        yield set_
    finally:
        user.policies.clear()
        user.policies.update(saved)


def test_the_sandbox_attaches_kvfleet_policy_and_enforces_it(sb: Sandbox) -> None:
    assert sb.iam_enforced and sb.describe()["iam_enforced"] is True
    admin = client(sb, "iam", sb.aws.admin_key())
    assert admin.list_user_policies(UserName=BASE_USER)["PolicyNames"] == [POLICY_NAME]
    attached = admin.get_user_policy(UserName=BASE_USER, PolicyName=POLICY_NAME)["PolicyDocument"]
    assert attached == POLICY  # the same file the product documents
    # kvfleet's calls are allowed; one it does not make is refused; the administrator is not authorized by IAM.
    sagemaker = client(sb, "sagemaker")
    assert sagemaker.describe_cluster(ClusterName="ml-prod-use1")["ClusterStatus"] == "InService"
    code, status, message = error_of(lambda: sagemaker.list_clusters())
    assert (code, status) == ("AccessDeniedException", 400)
    assert message == NOT_ALLOWED.format(arn=KVFLEET, action="sagemaker:ListClusters", resource="*")
    assert client(sb, "sagemaker", sb.aws.admin_key()).list_clusters()["ClusterSummaries"]
    # The clusters carry the tag a platform team puts on the clusters kvfleet manages.
    arn = sb.aws.hyperpod_cluster("ml-prod-use1")["ClusterArn"]  # type: ignore[index]
    assert client(sb, "sagemaker", sb.aws.admin_key()).list_tags(ResourceArn=arn)["Tags"] == [
        {"Key": "kvfleet:managed", "Value": "true"}]


def test_a_call_kvfleet_makes_is_refused_when_the_policy_lacks_its_action(sb: Sandbox, policies: Any) -> None:
    arn = sb.aws.hyperpod_cluster("ml-prod-use1")["ClusterArn"]  # type: ignore[index]
    policies(**{POLICY_NAME: without("sagemaker:UpdateCluster")})
    code, status, message = error_of(lambda: client(sb, "sagemaker").update_cluster(
        ClusterName="ml-prod-use1", NodeRecovery="Automatic"))
    assert (code, status) == ("AccessDeniedException", 400)
    assert message == NOT_ALLOWED.format(arn=KVFLEET, action="sagemaker:UpdateCluster", resource=arn)
    assert sb.aws.calls(service="sagemaker")[-1].operation == "UpdateCluster"  # received, refused, not applied
    assert sb.aws.hyperpod_cluster("ml-prod-use1")["ClusterStatus"] == "InService"  # type: ignore[index]
    policies(**{POLICY_NAME: without("eks:CreateAddon")})
    code, status, message = error_of(lambda: client(sb, "eks").create_addon(clusterName="ml-prod-use1-eks",
                                                                            addonName="metrics-server"))
    assert (code, status) == ("AccessDeniedException", 403)
    assert message == NOT_ALLOWED.format(arn=KVFLEET, action="eks:CreateAddon",
                                         resource=f"arn:aws:eks:{REGION}:{HUB}:cluster/ml-prod-use1-eks")
    assert sb.aws.addon_status("ml-prod-use1-eks", "metrics-server") is None
    policies(**{POLICY_NAME: without("iam:GetRole")})
    code, status, _ = error_of(lambda: client(sb, "iam").get_role(RoleName="aws-ebs-csi-dri-role"))
    assert (code, status) == ("AccessDenied", 403)
    assert [d[3] for d in sb.aws.iam_denials()[-3:]] == ["sagemaker:UpdateCluster", "eks:CreateAddon", "iam:GetRole"]


def test_an_explicit_deny_wins_over_the_allow(sb: Sandbox, policies: Any) -> None:
    addon = sb.aws._account(None).eks.clusters["ml-prod-use1-eks"].addons["vpc-cni"].arn
    policies(**{POLICY_NAME: POLICY, "deny-addon-updates": {"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Action": "eks:UpdateAddon", "Resource": "arn:aws:eks:*:*:addon/*/vpc-cni/*"}]}})
    eks = client(sb, "eks")
    code, status, message = error_of(lambda: eks.update_addon(clusterName="ml-prod-use1-eks", addonName="vpc-cni",
                                                              addonVersion="v1.19.2-eksbuild.1"))
    assert (code, status) == ("AccessDeniedException", 403)
    assert message == EXPLICIT.format(arn=KVFLEET, action="eks:UpdateAddon", resource=addon)
    assert eks.describe_addon(clusterName="ml-prod-use1-eks", addonName="vpc-cni")["addon"]["status"] == "ACTIVE"


def test_a_tag_condition_allows_the_tagged_cluster_and_refuses_the_untagged(sb: Sandbox, policies: Any) -> None:
    sb.aws.add_hyperpod_cluster("training-untagged", REGION, "ml-prod-use1-eks", [
        {"InstanceGroupName": "train", "InstanceType": "ml.g5.4xlarge", "InstanceCount": 1}])
    untagged = sb.aws.hyperpod_cluster("training-untagged")["ClusterArn"]  # type: ignore[index]
    scoped = {**POLICY, "Statement": [
        {**st, "Condition": {"StringEquals": {"aws:ResourceTag/kvfleet:managed": "true"}}}
        if st["Sid"] == "HyperPodClusters" else st for st in POLICY["Statement"]]}
    policies(**{POLICY_NAME: scoped})
    sagemaker = client(sb, "sagemaker")
    code, status, message = error_of(lambda: sagemaker.update_cluster(ClusterName="training-untagged",
                                                                      NodeRecovery="Automatic"))
    assert (code, status) == ("AccessDeniedException", 400)
    assert message == NOT_ALLOWED.format(arn=KVFLEET, action="sagemaker:UpdateCluster", resource=untagged)
    west = client(sb, "sagemaker", region="us-west-2")  # a tagged cluster (tests elsewhere here keep ml-prod-use1)
    assert west.update_cluster(ClusterName="ml-stage-usw2", NodeRecovery="Automatic")["ClusterArn"]
    # Tagged by the administrator (AddTags), the same cluster is allowed.
    client(sb, "sagemaker", sb.aws.admin_key()).add_tags(ResourceArn=untagged, Tags=[
        {"Key": "kvfleet:managed", "Value": "true"}])
    assert sagemaker.update_cluster(ClusterName="training-untagged", NodeRecovery="Automatic")["ClusterArn"]


def test_enforcement_can_be_left_off(tmp_path: Path) -> None:
    sandbox = start_sandbox(ROOT / "tests" / "fleets" / "twin.yaml", tmp_path, SandboxSettings(iam_enforced=False),
                            controllers=())
    try:
        assert not sandbox.iam_enforced and sandbox.aws.iam is None
        assert client(sandbox, "sagemaker").list_clusters()["ClusterSummaries"]
    finally:
        sandbox.stop()
