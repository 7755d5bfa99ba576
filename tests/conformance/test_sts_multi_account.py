"""The twin's STS and per-account identities against tests/conformance/facts/sts_multi_account.yaml, through real boto3
clients (botocore's client-side validation off where a fact is about what the service answers)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.config import Config
from botocore.exceptions import ClientError

from kvfleet_sandbox.aws import AwsEmulator

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "sts_multi_account.yaml").read_text())
HUB, TARGET = "123456789012", "444444444444"
HUB_ARN = f"arn:aws:iam::{HUB}:user/kvfleet-sandbox"
RAW = Config(parameter_validation=False, retries={"max_attempts": 1})


def client(emulator: AwsEmulator, service: str, key: str = "sandbox", secret: str = "sandbox",
           token: str | None = None) -> Any:
    return boto3.client(service, endpoint_url=emulator.url, region_name="us-east-1", aws_access_key_id=key,
                        aws_secret_access_key=secret, aws_session_token=token, config=RAW)


def error_of(call: Callable[[], Any]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response
    return error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Message"]


def trust(*statements: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


@pytest.fixture(scope="module")
def emulator() -> Iterator[AwsEmulator]:
    aws = AwsEmulator(account_id=HUB)
    aws.start()
    iam = client(aws, "iam", aws.admin_key(TARGET))
    hub = {"AWS": f"arn:aws:iam::{HUB}:root"}
    iam.create_role(RoleName="tagged", MaxSessionDuration=7200, AssumeRolePolicyDocument=trust(
        {"Effect": "Allow", "Principal": hub, "Action": ["sts:AssumeRole", "sts:TagSession"],
         "Condition": {"StringEquals": {"sts:ExternalId": "xid"}}}))
    iam.create_role(RoleName="plain", Path="/team/", AssumeRolePolicyDocument=trust(
        {"Effect": "Allow", "Principal": {"AWS": HUB}, "Action": "sts:AssumeRole"}))
    iam.create_role(RoleName="by-arn", AssumeRolePolicyDocument=trust(
        {"Effect": "Allow", "Principal": {"AWS": HUB_ARN}, "Action": "sts:AssumeRole"}))
    iam.create_role(RoleName="denied", AssumeRolePolicyDocument=trust(
        {"Effect": "Allow", "Principal": hub, "Action": "sts:*"},
        {"Effect": "Deny", "Principal": hub, "Action": "sts:AssumeRole"}))
    try:
        yield aws
    finally:
        aws.stop()


def role(name: str, path: str = "/") -> str:
    return f"arn:aws:iam::{TARGET}:role{path}{name}"


def test_session_name_rules(emulator: AwsEmulator) -> None:
    facts, sts = FACTS["session_name"], client(emulator, "sts")
    for bad in ("a", "x" * (facts["max"] + 1), "has space", "bad/slash"):
        code, status, message = error_of(lambda b=bad: sts.assume_role(RoleArn=role("plain", "/team/"),
                                                                       RoleSessionName=b))
        assert (code, status) == (facts["error"]["code"], facts["error"]["status"])
        assert message.startswith(facts["error"]["message_starts"]) and "roleSessionName" in message
    for good in ("ab", "x" * facts["max"], "kvfleet-rollout-manual__2026-01-01T00.00.00+00.00", "a=b,c.d@e-f"):
        assert sts.assume_role(RoleArn=role("plain", "/team/"), RoleSessionName=good)["AssumedRoleUser"]


def test_duration_bounds(emulator: AwsEmulator) -> None:
    facts, sts = FACTS["duration"], client(emulator, "sts")
    code, status, message = error_of(lambda: sts.assume_role(RoleArn=role("plain", "/team/"), RoleSessionName="s",
                                                             DurationSeconds=facts["min"] - 1))
    assert (code, status) == (facts["below_min"]["code"], facts["below_min"]["status"])
    assert facts["below_min"]["message_contains"] in message
    assert error_of(lambda: sts.assume_role(RoleArn=role("plain", "/team/"), RoleSessionName="ss",
                                            DurationSeconds=facts["role_default_max"] + 1)) == \
        (facts["above_role_max"]["code"], facts["above_role_max"]["status"], facts["above_role_max"]["message"])
    before = dt.datetime.now(dt.UTC)
    issued = sts.assume_role(RoleArn=role("tagged"), RoleSessionName="ss", ExternalId="xid", DurationSeconds=7200)
    expiry = issued["Credentials"]["Expiration"]
    assert before + dt.timedelta(seconds=7190) <= expiry <= before + dt.timedelta(seconds=7210)
    default = sts.assume_role(RoleArn=role("plain", "/team/"), RoleSessionName="ss")["Credentials"]["Expiration"]
    assert abs((default - before).total_seconds() - facts["default"]) < 10


def test_tag_limits(emulator: AwsEmulator) -> None:
    facts, sts = FACTS["tags"], client(emulator, "sts")
    many = [{"Key": f"k{i}", "Value": "v"} for i in range(facts["max"] + 1)]
    code, status, message = error_of(lambda: sts.assume_role(RoleArn=role("tagged"), RoleSessionName="ss",
                                                             ExternalId="xid", Tags=many))
    assert (code, status) == (facts["too_many"]["code"], facts["too_many"]["status"])
    assert facts["too_many"]["message_contains"] in message
    for tag in ({"Key": "k" * (facts["key_length"][1] + 1), "Value": "v"},
                {"Key": "k", "Value": "v" * (facts["value_length"][1] + 1)}):
        assert error_of(lambda t=tag: sts.assume_role(RoleArn=role("tagged"), RoleSessionName="ss",
                                                      ExternalId="xid", Tags=[t]))[0] == "ValidationError"
    edge = [{"Key": "k" * facts["key_length"][1], "Value": "v" * facts["value_length"][1]}]
    assert sts.assume_role(RoleArn=role("tagged"), RoleSessionName="ss", ExternalId="xid", Tags=edge)


def test_trust_policy_evaluation(emulator: AwsEmulator) -> None:
    facts, sts = FACTS["access_denied"], client(emulator, "sts")

    def denied(arn: str, **kwargs: Any) -> None:
        assert error_of(lambda: sts.assume_role(RoleArn=arn, RoleSessionName="ss", **kwargs)) == \
            (facts["code"], facts["status"], facts["message"].format(caller=HUB_ARN, role=arn))

    denied(role("tagged"))  # ExternalId missing
    denied(role("tagged"), ExternalId="other")
    denied(role("plain", "/team/"), Tags=[{"Key": "lob", "Value": "x"}])  # no sts:TagSession
    denied(role("denied"))  # an explicit Deny wins
    denied(role("nobody"))
    # Principal by account id, by the caller's ARN, by the account's root (with the external id and tags)
    assert sts.assume_role(RoleArn=role("plain", "/team/"), RoleSessionName="ss")
    assert sts.assume_role(RoleArn=role("by-arn"), RoleSessionName="ss")
    assert sts.assume_role(RoleArn=role("tagged"), RoleSessionName="ss", ExternalId="xid",
                           Tags=[{"Key": "lob", "Value": "retail"}])
    # A session of another account is not the hub's principal.
    other = sts.assume_role(RoleArn=role("plain", "/team/"), RoleSessionName="ss")["Credentials"]
    chained = client(emulator, "sts", other["AccessKeyId"], other["SecretAccessKey"], other["SessionToken"])
    assert error_of(lambda: chained.assume_role(RoleArn=role("by-arn"), RoleSessionName="ss"))[:2] == \
        (facts["code"], facts["status"])


def test_caller_identity_shapes(emulator: AwsEmulator) -> None:
    facts = FACTS["caller_identity"]
    base = client(emulator, "sts").get_caller_identity()
    assert base["Arn"] == facts["base"].format(account=HUB, user="kvfleet-sandbox") and base["Account"] == HUB
    issued = client(emulator, "sts").assume_role(RoleArn=role("plain", "/team/"), RoleSessionName="who")
    creds = issued["Credentials"]
    assert creds["AccessKeyId"].startswith(FACTS["credentials"]["access_key_prefix"]) and creds["SessionToken"]
    who = client(emulator, "sts", creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"]) \
        .get_caller_identity()
    role_id = client(emulator, "iam", emulator.admin_key(TARGET)).get_role(RoleName="plain")["Role"]["RoleId"]
    assert who == {**who, "Account": TARGET,
                   "Arn": facts["assumed_arn"].format(account=TARGET, role_name="plain", session_name="who"),
                   "UserId": facts["assumed_user_id"].format(role_id=role_id, session_name="who")}
    assert issued["AssumedRoleUser"]["Arn"] == who["Arn"]


def test_expired_and_unknown_credentials(emulator: AwsEmulator) -> None:
    expired, unknown = FACTS["expired"], FACTS["unknown_key"]
    emulator.credential_lifetime_s = 1
    try:
        creds = client(emulator, "sts").assume_role(RoleArn=role("plain", "/team/"),
                                                    RoleSessionName="ss")["Credentials"]
    finally:
        emulator.credential_lifetime_s = None
    while dt.datetime.now(dt.UTC) < creds["Expiration"]:
        time.sleep(0.05)
    args = (creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"])
    for service, call, kind in (("sts", lambda c: c.get_caller_identity(), "query"),
                                ("sagemaker", lambda c: c.list_clusters(), "json"),
                                ("eks", lambda c: c.list_addons(clusterName="x"), "json")):
        want = expired[kind]
        assert error_of(lambda s=service, f=call: f(client(emulator, s, *args))) == \
            (want["code"], want["status"], want["message"])
    emulator.identities.accept_unknown_keys = False
    try:
        for service, call, kind in (("sts", lambda c: c.get_caller_identity(), "query"),
                                    ("sagemaker", lambda c: c.list_clusters(), "json")):
            want = unknown[kind]
            assert error_of(lambda s=service, f=call: f(client(emulator, s, "AKIANOBODY00000001"))) == \
                (want["code"], want["status"], want["message"])
    finally:
        emulator.identities.accept_unknown_keys = True
