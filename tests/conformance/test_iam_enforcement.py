"""The twin's IAM identity-policy enforcement against tests/conformance/facts/iam_enforcement.yaml: the evaluation
rules (kvfleet_sandbox.aws_iam_enforce, directly) and the refusals each service answers (through real boto3 clients
against an emulator that enforces), plus the moto 5.2.5 limits that made the twin evaluate with its own code."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.config import Config
from botocore.exceptions import ClientError

from kvfleet_sandbox.aws import AwsEmulator
from kvfleet_sandbox.aws_iam_enforce import (
    ALLOW,
    EXPLICIT_DENY,
    IMPLICIT_DENY,
    UnmodelledCondition,
    evaluate,
    resource_matches,
)

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "iam_enforcement.yaml").read_text())
ACCOUNT, REGION = "123456789012", "us-east-1"
USER_ARN = f"arn:aws:iam::{ACCOUNT}:user/kvfleet-sandbox"
RAW = Config(parameter_validation=False, retries={"max_attempts": 1})


def policy(*statements: dict[str, Any]) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def allow(action: Any, resource: Any = "*", **extra: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


def deny(action: Any, resource: Any = "*", **extra: Any) -> dict[str, Any]:
    return {"Effect": "Deny", "Action": action, "Resource": resource, **extra}


CTX = {"aws:principalaccount": ACCOUNT, "aws:username": "kvfleet-sandbox"}


# --- the evaluation rules -----------------------------------------------------------------------------------------


def test_explicit_deny_wins_then_allow_then_implicit_deny() -> None:
    assert FACTS["evaluation"]["order"][0].startswith("explicit Deny")
    both = [policy(allow("eks:UpdateAddon")), policy(deny("eks:UpdateAddon"))]
    assert evaluate(both, "eks:UpdateAddon", "arn:aws:eks:us-east-1:1:addon/c/a/u", CTX) == EXPLICIT_DENY
    assert evaluate(both[:1], "eks:UpdateAddon", "arn:aws:eks:us-east-1:1:addon/c/a/u", CTX) == ALLOW
    assert evaluate(both[:1], "eks:CreateAddon", "arn:aws:eks:us-east-1:1:cluster/c", CTX) == IMPLICIT_DENY
    assert evaluate([], "eks:DescribeCluster", "*", CTX) == IMPLICIT_DENY


def test_action_matching() -> None:
    facts = FACTS["matching"]["action"]
    assert facts["case_sensitive"] is False
    assert evaluate([policy(allow("SageMaker:describe*"))], "sagemaker:DescribeCluster", "*", CTX) == ALLOW
    assert evaluate([policy(allow("sagemaker:?escribeCluster"))], "sagemaker:DescribeCluster", "*", CTX) == ALLOW
    assert evaluate([policy(allow("sagemaker:Describe*"))], "sagemaker:UpdateCluster", "*", CTX) == IMPLICIT_DENY
    not_action = {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}
    assert evaluate([policy(not_action)], "eks:ListAddons", "*", CTX) == ALLOW
    assert evaluate([policy(not_action)], "iam:GetRole", "*", CTX) == IMPLICIT_DENY


def test_resource_matching_per_segment_with_variables() -> None:
    facts = FACTS["matching"]
    assert facts["resource"]["case_sensitive"] and facts["resource"]["per_segment"]
    pattern = "arn:aws:sagemaker:*:${aws:PrincipalAccount}:cluster/*"
    mine = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:cluster/abc123"
    assert resource_matches(pattern, mine, CTX)
    assert not resource_matches(pattern, "arn:aws:sagemaker:us-west-2:999999999999:cluster/abc123", CTX)
    assert not resource_matches(pattern, mine.replace("cluster/", "Cluster/"), CTX)  # case-sensitive
    # A wildcard does not cross into the next segment.
    assert not resource_matches("arn:aws:sagemaker:*", mine, CTX)
    assert resource_matches("arn:aws:sagemaker:*:*:*", mine, CTX)
    # A variable without a value matches nothing; ${*} is a literal asterisk.
    assert not resource_matches("arn:aws:iam::${aws:PrincipalAccount}:user/${aws:username}", USER_ARN,
                                {"aws:principalaccount": ACCOUNT})
    assert resource_matches("arn:aws:iam::${aws:PrincipalAccount}:user/${aws:username}", USER_ARN, CTX)
    assert resource_matches("arn:aws:s3:::b/${*}", "arn:aws:s3:::b/*", CTX)
    assert not resource_matches("arn:aws:s3:::b/${*}", "arn:aws:s3:::b/x", CTX)
    not_resource = {"Effect": "Deny", "Action": "*", "NotResource": "arn:aws:s3:::keep"}
    allow_all = allow("s3:*")
    assert evaluate([policy(allow_all, not_resource)], "s3:ListBucket", "arn:aws:s3:::keep", CTX) == ALLOW
    assert evaluate([policy(allow_all, not_resource)], "s3:ListBucket", "arn:aws:s3:::other", CTX) == EXPLICIT_DENY


def test_condition_operators() -> None:
    facts = FACTS["conditions"]
    tagged = {**CTX, "aws:resourcetag/kvfleet:managed": "true"}

    def ok(condition: dict[str, Any], context: dict[str, Any]) -> bool:
        return evaluate([policy(allow("sagemaker:UpdateCluster", Condition=condition))],
                        "sagemaker:UpdateCluster", "*", context) == ALLOW

    assert ok({"StringEquals": {"aws:ResourceTag/kvfleet:managed": "true"}}, tagged)
    assert not ok({"StringEquals": {"aws:ResourceTag/kvfleet:managed": "true"}}, CTX)  # absent: positive false
    assert ok({"StringNotEquals": {"aws:ResourceTag/kvfleet:managed": "false"}}, CTX)  # absent: negated true
    assert facts["absent_key"] == {"positive_operator": False, "negated_operator": True}
    assert ok({"StringEqualsIfExists": {"aws:ResourceTag/kvfleet:managed": "true"}}, CTX)
    assert not ok({"StringEqualsIfExists": {"aws:ResourceTag/kvfleet:managed": "true"}},
                  {**CTX, "aws:resourcetag/kvfleet:managed": "no"})
    assert ok({"StringLike": {"aws:ResourceTag/kvfleet:managed": ["t*", "yes"]}}, tagged)  # values: OR
    assert ok({"StringEqualsIgnoreCase": {"aws:ResourceTag/kvfleet:managed": "TRUE"}}, tagged)
    assert not ok({"StringEquals": {"aws:ResourceTag/kvfleet:managed": "true", "aws:PrincipalAccount": "1"}},
                  tagged)  # keys: AND
    assert ok({"StringEquals": {"aws:PrincipalAccount": "${aws:PrincipalAccount}"}}, CTX)
    assert ok({"Null": {"aws:ResourceTag/kvfleet:managed": "false"}}, tagged)
    assert ok({"Null": {"aws:ResourceTag/kvfleet:managed": "true"}}, CTX)
    assert ok({"Bool": {"aws:securetransport": "true"}}, {**CTX, "aws:securetransport": True})
    keys = {"ForAllValues:StringEquals": {"aws:TagKeys": ["run", "lob"]}}
    assert ok(keys, {**CTX, "aws:tagkeys": ["run"]}) and not ok(keys, {**CTX, "aws:tagkeys": ["run", "other"]})
    assert ok(keys, CTX)  # no value at all: ForAllValues is true (hence Null false beside it in hub-policy.json)
    assert not ok({**keys, "Null": {"aws:TagKeys": "false"}}, CTX)
    any_key = {"ForAnyValue:StringEquals": {"aws:TagKeys": ["run"]}}
    assert ok(any_key, {**CTX, "aws:tagkeys": ["x", "run"]}) and not ok(any_key, CTX)
    assert ok({"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*:user/*"}}, {**CTX, "aws:principalarn": USER_ARN})
    for operator in facts["operators"]:
        evaluate([policy(allow("x:Y", Condition={operator: {"aws:username": "z"}}))], "x:Y", "*", CTX)
    with pytest.raises(UnmodelledCondition, match="NumericLessThan"):
        ok({"NumericLessThan": {"aws:MultiFactorAuthAge": "3600"}}, CTX)


def test_kvfleet_policy_evaluates_as_written() -> None:
    """k8s/iam/kvfleet-policy.json in its own account allows what it lists there and nothing in another account."""
    doc = json.loads((Path(__file__).resolve().parents[2] / "k8s" / "iam" / "kvfleet-policy.json").read_text())
    cluster = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:cluster/abc"
    assert evaluate([doc], "sagemaker:UpdateCluster", cluster, CTX) == ALLOW
    assert evaluate([doc], "sagemaker:UpdateCluster", cluster.replace(ACCOUNT, "999999999999"), CTX) == IMPLICIT_DENY
    assert evaluate([doc], "sagemaker:DeleteCluster", cluster, CTX) == IMPLICIT_DENY
    assert evaluate([doc], "eks:UpdateAddon", f"arn:aws:eks:{REGION}:{ACCOUNT}:addon/c-eks/x/1-2", CTX) == ALLOW


# --- the refusals on the wire -------------------------------------------------------------------------------------


def client(emulator: AwsEmulator, service: str, key: str = "sandbox") -> Any:
    return boto3.client(service, endpoint_url=emulator.url, region_name=REGION, aws_access_key_id=key,
                        aws_secret_access_key=key, config=RAW)


def error_of(call: Callable[[], Any]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response
    return error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Message"]


@pytest.fixture(scope="module")
def emulator() -> Iterator[AwsEmulator]:
    aws = AwsEmulator(account_id=ACCOUNT, delay_s=0.01)
    aws.start()
    try:
        aws.add_eks_cluster("c-eks", REGION, "https://127.0.0.1:1")
        aws.add_hyperpod_cluster("c", REGION, "c-eks", [{"InstanceGroupName": "g", "InstanceType": "ml.g5.xlarge",
                                                          "InstanceCount": 1}])
        aws.add_addon("c-eks", "vpc-cni")
        iam = client(aws, "iam", aws.admin_key())
        iam.create_user(UserName="kvfleet-sandbox")
        iam.put_user_policy(UserName="kvfleet-sandbox", PolicyName="reads", PolicyDocument=json.dumps(policy(
            allow(["sagemaker:DescribeCluster", "eks:DescribeCluster", "eks:DescribeAddon"]),
            deny("eks:DescribeAddon", f"arn:aws:eks:{REGION}:{ACCOUNT}:addon/c-eks/vpc-cni/*"))))
        iam.create_role(RoleName="kvfleet-operator", AssumeRolePolicyDocument=json.dumps(policy(
            {"Effect": "Allow", "Principal": {"AWS": ACCOUNT}, "Action": "sts:AssumeRole"})))
        aws.enforce_iam()
        yield aws
    finally:
        aws.stop()


def test_each_service_answers_its_own_access_denied(emulator: AwsEmulator) -> None:
    facts = FACTS["access_denied"]
    cluster_arn = emulator.hyperpod_cluster("c")["ClusterArn"]  # type: ignore[index]
    cases = [
        ("sagemaker", lambda: client(emulator, "sagemaker").update_cluster(ClusterName="c", NodeRecovery="None"),
         "sagemaker:UpdateCluster", cluster_arn),
        ("eks", lambda: client(emulator, "eks").create_addon(clusterName="c-eks", addonName="x"),
         "eks:CreateAddon", f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/c-eks"),
        ("iam", lambda: client(emulator, "iam").get_role(RoleName="kvfleet-operator"),
         "iam:GetRole", f"arn:aws:iam::{ACCOUNT}:role/kvfleet-operator"),
        ("sts", lambda: client(emulator, "sts").assume_role(RoleArn=f"arn:aws:iam::{ACCOUNT}:role/kvfleet-operator",
                                                            RoleSessionName="s1"),
         "sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/kvfleet-operator"),
        ("s3", lambda: client(emulator, "s3").list_objects_v2(Bucket="tls-certs"), "s3:ListBucket",
         "arn:aws:s3:::tls-certs"),
    ]
    for service, call, action, resource in cases:
        code, status, message = error_of(call)
        assert (code, status) == (facts[service]["code"], facts[service]["status"]), service
        assert message == facts["implicit"].format(arn=USER_ARN, action=action, resource=resource), service
    # HeadBucket is authorized as s3:ListBucket; a HEAD answer has no body, so botocore reports the status alone.
    assert error_of(lambda: client(emulator, "s3").head_bucket(Bucket="tls-certs"))[:2] == ("403", 403)
    assert emulator.iam_denials()[-1][3:] == ("s3:ListBucket", "arn:aws:s3:::tls-certs", IMPLICIT_DENY)


def test_explicit_deny_message_and_what_is_allowed(emulator: AwsEmulator) -> None:
    eks = client(emulator, "eks")
    assert eks.describe_cluster(name="c-eks")["cluster"]["name"] == "c-eks"
    addon_arn = emulator._account(None).eks.clusters["c-eks"].addons["vpc-cni"].arn
    code, status, message = error_of(lambda: eks.describe_addon(clusterName="c-eks", addonName="vpc-cni"))
    assert (code, status) == ("AccessDeniedException", 403)
    assert message == FACTS["access_denied"]["explicit"].format(arn=USER_ARN, action="eks:DescribeAddon",
                                                                resource=addon_arn)
    # Needs no permission; the administrator's key is not authorized by IAM at all.
    assert client(emulator, "sts").get_caller_identity()["Arn"] == USER_ARN
    assert client(emulator, "sagemaker", emulator.admin_key()).list_clusters()["ClusterSummaries"]


# --- moto 5.2.5's limits ------------------------------------------------------------------------------------------


def test_moto_statement_answers_denied_for_an_allow_whose_condition_fails() -> None:
    from moto.iam.access_control import IAMPolicyStatement, PermissionResult

    facts = FACTS["moto_limits"]
    statement = IAMPolicyStatement(allow("sagemaker:UpdateCluster", Condition={
        "StringEquals": {"aws:ResourceTag/kvfleet:managed": "true"}}))
    result = statement.is_action_permitted("sagemaker:UpdateCluster", "*", None, {"aws:ResourceTag/kvfleet:managed":
                                                                                  "false"})
    assert result.name == facts["statement_condition_failing_on_allow"] == PermissionResult.DENIED.name
    from moto.iam.policy_conditions import CONDITION_OPERATIONS

    assert sorted(CONDITION_OPERATIONS) == facts["conditions_implemented"]


def test_moto_validator_refuses_a_variable_in_the_account_segment(emulator: AwsEmulator) -> None:
    assert FACTS["moto_limits"]["validator_rejects_variable_in_account_segment"] is True
    iam = client(emulator, "iam", emulator.admin_key())
    document = json.dumps(policy(allow("iam:GetRole", "arn:aws:iam::${aws:PrincipalAccount}:role/*")))
    code, _, message = error_of(lambda: iam.put_user_policy(UserName="kvfleet-sandbox", PolicyName="v",
                                                            PolicyDocument=document))
    assert code == "MalformedPolicyDocument" and "IAM resource path" in message
