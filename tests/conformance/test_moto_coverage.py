"""Conformance: every IAM, S3 and SNS call kvfleet makes, exercised through boto3 against the twin's AWS emulator
(served by moto), with the behaviour facts/moto_coverage.yaml records for it. Starts one emulator on 127.0.0.1
and stops it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.exceptions import ClientError

from kvfleet.clients.aws_prereqs import READ_OPS
from kvfleet_sandbox.aws import AwsEmulator

SHEET = yaml.safe_load((Path(__file__).parent / "facts" / "moto_coverage.yaml").read_text())
EBS_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
TRUST = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": ["sagemaker.amazonaws.com"]}, "Action": "sts:AssumeRole"}]}


@pytest.fixture(scope="module")
def aws() -> Iterator[AwsEmulator]:
    with AwsEmulator(account_id="210987654321") as emulator:
        yield emulator


def client(aws: AwsEmulator, service: str, region: str = "us-west-2") -> Any:
    return boto3.client(service, endpoint_url=aws.url, region_name=region, aws_access_key_id="k",
                        aws_secret_access_key="s")


def error_of(call: Callable[[], Any]) -> tuple[str, int]:
    with pytest.raises(ClientError) as caught:
        call()
    return caught.value.response["Error"]["Code"], caught.value.response["ResponseMetadata"]["HTTPStatusCode"]


def exercise_iam(aws: AwsEmulator) -> None:
    iam = client(aws, "iam")
    assert error_of(lambda: iam.get_role(RoleName="exec")) == ("NoSuchEntity", 404)
    iam.create_role(RoleName="exec", AssumeRolePolicyDocument=json.dumps(TRUST))
    assert error_of(lambda: iam.create_role(RoleName="exec", AssumeRolePolicyDocument="{}")) == ("EntityAlreadyExists", 409)
    role = iam.get_role(RoleName="exec")["Role"]
    assert role["Arn"] == "arn:aws:iam::210987654321:role/exec" and role["AssumeRolePolicyDocument"] == TRUST
    trust = {**TRUST, "Statement": [*TRUST["Statement"], {"Effect": "Allow", "Principal": {"Service": "x"},
                                                          "Action": "sts:AssumeRole"}]}
    iam.update_assume_role_policy(RoleName="exec", PolicyDocument=json.dumps(trust))
    assert iam.get_role(RoleName="exec")["Role"]["AssumeRolePolicyDocument"] == trust
    iam.attach_role_policy(RoleName="exec", PolicyArn=EBS_POLICY)
    attached = iam.list_attached_role_policies(RoleName="exec")["AttachedPolicies"]
    assert [p["PolicyArn"] for p in attached] == [EBS_POLICY]
    version = iam.get_policy(PolicyArn=EBS_POLICY)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=EBS_POLICY, VersionId=version)["PolicyVersion"]["Document"]
    (attach,) = [s for s in document["Statement"] if "ec2:AttachVolume" in s["Action"]]
    assert attach["Effect"] == "Allow" and attach["Resource"] == ["arn:aws:ec2:*:*:volume/*",
                                                                   "arn:aws:ec2:*:*:instance/*"]
    inline = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}]}
    iam.put_role_policy(RoleName="exec", PolicyName="inline", PolicyDocument=json.dumps(inline))
    assert iam.list_role_policies(RoleName="exec")["PolicyNames"] == ["inline"]
    assert iam.get_role_policy(RoleName="exec", PolicyName="inline")["PolicyDocument"] == inline
    iam.delete_role_policy(RoleName="exec", PolicyName="inline")
    iam.detach_role_policy(RoleName="exec", PolicyArn=EBS_POLICY)
    iam.delete_role(RoleName="exec")
    assert error_of(lambda: iam.get_role(RoleName="exec")) == ("NoSuchEntity", 404)


def exercise_s3(aws: AwsEmulator) -> None:
    s3 = client(aws, "s3")
    assert error_of(lambda: s3.head_bucket(Bucket="hyperpod-tls-conf")) == ("404", 404)
    conf = {"LocationConstraint": "us-west-2"}
    s3.create_bucket(Bucket="hyperpod-tls-conf", CreateBucketConfiguration=conf)
    assert error_of(lambda: s3.create_bucket(Bucket="hyperpod-tls-conf", CreateBucketConfiguration=conf))[0] \
        == "BucketAlreadyOwnedByYou"
    assert s3.head_bucket(Bucket="hyperpod-tls-conf")["ResponseMetadata"]["HTTPStatusCode"] == 200
    s3.delete_bucket(Bucket="hyperpod-tls-conf")
    assert error_of(lambda: s3.head_bucket(Bucket="hyperpod-tls-conf")) == ("404", 404)


def exercise_sns(aws: AwsEmulator) -> None:
    sns = client(aws, "sns", "us-east-1")
    missing = "arn:aws:sns:us-east-1:210987654321:absent"
    assert error_of(lambda: sns.publish(TopicArn=missing, Message="m")) == ("NotFound", 404)
    topic = sns.create_topic(Name="kvfleet-conf")["TopicArn"]
    sns.publish(TopicArn=topic, Message="gate waiting", Subject="kvfleet",
                MessageAttributes={"cluster": {"DataType": "String", "StringValue": "ml-stage-usw2"}})
    published = aws.published(topic)
    assert published == [{"TopicArn": topic, "Message": "gate waiting", "Subject": "kvfleet",
                          "MessageAttributes.entry.1.Name": "cluster",
                          "MessageAttributes.entry.1.Value.DataType": "String",
                          "MessageAttributes.entry.1.Value.StringValue": "ml-stage-usw2"}]
    assert [p["TopicArn"] for p in aws.published()] == [missing, topic]  # refused ones are logged too


EXERCISES = {"iam": exercise_iam, "s3": exercise_s3, "sns": exercise_sns}


def test_every_call_names_moto_source_and_a_user() -> None:
    assert SHEET["moto"]["package"] == "moto==5.2.5"
    for call in SHEET["calls"]:
        assert call["covered"] is True and call["used_by"]
        assert call["source"]["path"].startswith(f"moto/{call['service']}/") and call["source"]["line"] > 0


def test_preflights_read_calls_are_all_recorded() -> None:
    recorded = {c["operation"] for c in SHEET["calls"] if c["service"] in ("iam", "s3")}
    assert recorded >= READ_OPS


@pytest.mark.parametrize("service", sorted(EXERCISES))
def test_each_recorded_call_works_through_the_emulator(aws: AwsEmulator, service: str) -> None:
    aws.reset_request_log()
    EXERCISES[service](aws)
    exercised = set(aws.operations(service))
    recorded = {c["operation"] for c in SHEET["calls"] if c["service"] == service}
    assert recorded <= exercised, f"recorded but not exercised: {sorted(recorded - exercised)}"
