"""The twin across AWS accounts (kvfleet_sandbox.aws_sts, the per-account state of kvfleet_sandbox.aws, the runtime's
account seeding): tests/fleets/multi-account.yaml started as the sandbox, driven through real boto3 clients.

Facts the emulator follows, with their sources: tests/conformance/facts/sts_multi_account.yaml.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from kvfleet_sandbox.kube.auth import presigned_token
from kvfleet_sandbox.runtime import Sandbox, account_key

pytestmark = pytest.mark.integration

FLEET = Path(__file__).resolve().parents[2] / "fleets" / "multi-account.yaml"
HUB = "123456789012"
RETAIL, PAYMENTS, SHARED = "111111111111", "222222222222", "333333333333"
RETAIL_ROLE = f"arn:aws:iam::{RETAIL}:role/kvfleet-operator"
PAYMENTS_ROLE = f"arn:aws:iam::{PAYMENTS}:role/platform/kvfleet-operator"
RETAIL_KEY, PAYMENTS_KEY = f"{RETAIL}/us-east-1/ml-prod", f"{PAYMENTS}/us-east-1/ml-prod"
REGION = "us-east-1"


def client(sandbox: Sandbox, service: str, key: str = "sandbox", secret: str = "sandbox",
           token: str | None = None, region: str = REGION) -> Any:
    return boto3.client(service, endpoint_url=sandbox.aws.url, region_name=region, aws_access_key_id=key,
                        aws_secret_access_key=secret, aws_session_token=token)


def assumed(sandbox: Sandbox, role: str, service: str, **kwargs: Any) -> Any:
    creds = client(sandbox, "sts").assume_role(RoleArn=role, RoleSessionName="kvfleet-test-run", **kwargs)
    c = creds["Credentials"]
    return client(sandbox, service, c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"])


def error_of(call: Callable[[], Any]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response
    return error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Message"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    # This module drives the twin's STS and per-account state with calls kvfleet does not make (ListClusters, roles
    # that are not kvfleet's): IAM identity policies are not enforced here (tests/integration/sandbox/
    # test_iam_enforced_accounts.py enforces them on the same fleet).
    sandbox = start_sandbox(FLEET, tmp_path_factory.mktemp("accounts"), SandboxSettings(iam_enforced=False),
                            controllers=())
    try:
        yield sandbox
    finally:
        sandbox.stop()


def test_both_ml_prod_clusters_exist_each_only_in_its_account(fleet: Sandbox) -> None:
    assert sorted(fleet.twins) == sorted([RETAIL_KEY, PAYMENTS_KEY, f"{SHARED}/us-west-2/ml-eval"])
    # The hub's base identity sees neither (they are in other accounts), as DescribeCluster in the hub would.
    assert error_of(lambda: client(fleet, "sagemaker").describe_cluster(ClusterName="ml-prod"))[0] == "ResourceNotFound"
    assert error_of(lambda: client(fleet, "eks").describe_cluster(name="ml-prod-eks"))[0] == \
        "ResourceNotFoundException"
    retail = assumed(fleet, RETAIL_ROLE, "sagemaker", ExternalId="kvfleet-retail")
    payments = assumed(fleet, PAYMENTS_ROLE, "sagemaker")
    arns = [c.describe_cluster(ClusterName="ml-prod")["ClusterArn"] for c in (retail, payments)]
    assert arns[0].split(":")[4] == RETAIL and arns[1].split(":")[4] == PAYMENTS
    assert [s["ClusterName"] for s in retail.list_clusters()["ClusterSummaries"]] == ["ml-prod"]
    eks = assumed(fleet, RETAIL_ROLE, "eks", ExternalId="kvfleet-retail").describe_cluster(name="ml-prod-eks")
    assert eks["cluster"]["endpoint"] == fleet.servers[RETAIL_KEY].https_url
    # A bare name of two clusters is refused with both keys; a unique one still finds its twin.
    with pytest.raises(KeyError, match=f"{RETAIL_KEY}.*{PAYMENTS_KEY}"):
        fleet.twin("ml-prod")
    assert fleet.twin("ml-eval").account == SHARED and fleet.twin(PAYMENTS_KEY).account == PAYMENTS
    contexts = [c["name"] for c in __import__("yaml").safe_load(fleet.kubeconfig.read_text())["contexts"]]
    assert sorted(contexts) == sorted([RETAIL_KEY, PAYMENTS_KEY, "ml-eval"])


def test_the_seeded_roles_and_caller_identities(fleet: Sandbox) -> None:
    role = client(fleet, "iam", fleet.aws.admin_key(PAYMENTS)).get_role(RoleName="kvfleet-operator")["Role"]
    assert role["Arn"] == PAYMENTS_ROLE and role["Path"] == "/platform/" and role["MaxSessionDuration"] >= 1800
    statement = role["AssumeRolePolicyDocument"]["Statement"][0]
    assert statement["Principal"] == {"AWS": f"arn:aws:iam::{HUB}:root"}
    assert set(statement["Action"]) == {"sts:AssumeRole", "sts:TagSession"} and "Condition" not in statement
    retail = client(fleet, "iam", fleet.aws.admin_key(RETAIL)).get_role(RoleName="kvfleet-operator")["Role"]
    assert retail["AssumeRolePolicyDocument"]["Statement"][0]["Condition"] == {
        "StringEquals": {"sts:ExternalId": "kvfleet-retail"}}
    assert client(fleet, "sts").get_caller_identity()["Arn"] == f"arn:aws:iam::{HUB}:user/kvfleet-sandbox"
    who = assumed(fleet, RETAIL_ROLE, "sts", ExternalId="kvfleet-retail").get_caller_identity()
    assert who["Account"] == RETAIL
    assert who["Arn"] == f"arn:aws:sts::{RETAIL}:assumed-role/kvfleet-operator/kvfleet-test-run"
    assert who["UserId"] == f"{retail['RoleId']}:kvfleet-test-run"
    # The shared-services account: its own connection's static key, exported as AIRFLOW_CONN_AWS_SHARED_SERVICES.
    conn = json.loads(fleet.exports()["AIRFLOW_CONN_AWS_SHARED_SERVICES"])
    assert conn["login"] == account_key(SHARED) and conn["extra"]["endpoint_url"] == fleet.aws.url
    shared = client(fleet, "sagemaker", conn["login"], conn["password"], region="us-west-2")
    assert shared.describe_cluster(ClusterName="ml-eval")["ClusterArn"].split(":")[4] == SHARED


def test_assume_role_refusals_carry_aws_codes(fleet: Sandbox) -> None:
    sts = client(fleet, "sts")
    denied = f"User: arn:aws:iam::{HUB}:user/kvfleet-sandbox is not authorized to perform: sts:AssumeRole on " \
             f"resource: {RETAIL_ROLE}"
    for extra in ({}, {"ExternalId": "wrong-one"}):
        assert error_of(lambda e=extra: sts.assume_role(RoleArn=RETAIL_ROLE, RoleSessionName="s1", **e)) == \
            ("AccessDenied", 403, denied)
    # A role whose trust names another account only, and one that trusts the hub for AssumeRole but not TagSession.
    iam = client(fleet, "iam", fleet.aws.admin_key(PAYMENTS))
    for name, action in (("untrusting", ["sts:AssumeRole"]), ("no-tags", ["sts:AssumeRole"])):
        principal = f"arn:aws:iam::{'999999999999' if name == 'untrusting' else HUB}:root"
        iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": principal}, "Action": action}]}))
    untrusting, no_tags = (f"arn:aws:iam::{PAYMENTS}:role/{n}" for n in ("untrusting", "no-tags"))
    code, status, message = error_of(lambda: sts.assume_role(RoleArn=untrusting, RoleSessionName="s1"))
    assert (code, status) == ("AccessDenied", 403) and message.endswith(untrusting)
    assert sts.assume_role(RoleArn=no_tags, RoleSessionName="s1")["Credentials"]["AccessKeyId"].startswith("ASIA")
    tags = [{"Key": "lob", "Value": "payments"}]
    assert error_of(lambda: sts.assume_role(RoleArn=no_tags, RoleSessionName="s1", Tags=tags))[:2] == \
        ("AccessDenied", 403)
    missing = f"arn:aws:iam::{PAYMENTS}:role/nobody"
    assert error_of(lambda: sts.assume_role(RoleArn=missing, RoleSessionName="s1"))[:2] == ("AccessDenied", 403)
    code, _, message = error_of(lambda: sts.assume_role(RoleArn=PAYMENTS_ROLE, RoleSessionName="s1",
                                                        DurationSeconds=7200))
    assert (code, message) == ("ValidationError", "The requested DurationSeconds exceeds the MaxSessionDuration set "
                                                  "for this role.")


def test_session_tags_and_account_in_the_request_log(fleet: Sandbox) -> None:
    tags = [{"Key": "lob", "Value": "retail"}, {"Key": "run", "Value": "manual__1"}]
    sagemaker = assumed(fleet, RETAIL_ROLE, "sagemaker", ExternalId="kvfleet-retail", Tags=tags)
    fleet.aws.reset_request_log()
    sagemaker.describe_cluster(ClusterName="ml-prod")
    client(fleet, "sagemaker").list_clusters()
    (entry,) = fleet.aws.calls(account=RETAIL)
    assert (entry.service, entry.operation, entry.account) == ("sagemaker", "DescribeCluster", RETAIL)
    assert entry.caller_arn == f"arn:aws:sts::{RETAIL}:assumed-role/kvfleet-operator/kvfleet-test-run"
    assert dict(entry.session_tags) == {"lob": "retail", "run": "manual__1"}
    assert [e.operation for e in fleet.aws.calls(account=HUB)] == ["ListClusters"]
    assert fleet.aws.calls(mutating=True) == []


def test_expired_credentials_are_refused(fleet: Sandbox) -> None:
    fleet.aws.credential_lifetime_s = 1
    try:
        creds = client(fleet, "sts").assume_role(RoleArn=PAYMENTS_ROLE, RoleSessionName="short")["Credentials"]
    finally:
        fleet.aws.credential_lifetime_s = None
    assert creds["Expiration"] <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    args = (creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"])
    while dt.datetime.now(dt.UTC) < creds["Expiration"]:  # the wall clock, which is what expiry is measured on
        time.sleep(0.05)
    assert error_of(lambda: client(fleet, "sagemaker", *args).describe_cluster(ClusterName="ml-prod")) == \
        ("ExpiredTokenException", 403, "The security token included in the request is expired")
    assert error_of(lambda: client(fleet, "sts", *args).get_caller_identity()) == \
        ("ExpiredToken", 403, "The security token included in the request is expired")
    assert error_of(lambda: client(fleet, "eks", *args).describe_cluster(name="ml-prod-eks"))[:2] == \
        ("ExpiredTokenException", 403)
    assert error_of(lambda: client(fleet, "iam", *args).list_roles())[:2] == ("ExpiredToken", 403)
    # A temporary key the emulator never issued, and an issued key with another session token.
    assert error_of(lambda: client(fleet, "sts", "ASIAUNKNOWN000001", "x", "y").get_caller_identity())[:2] == \
        ("InvalidClientTokenId", 403)
    assert error_of(lambda: client(fleet, "sagemaker", args[0], args[1], "forged").list_clusters())[:2] == \
        ("UnrecognizedClientException", 403)


def _kube_status(fleet: Sandbox, key: str, access_key: str) -> int:
    token = presigned_token(access_key, REGION, origin=fleet.aws.url)
    context = ssl.create_default_context(cadata=fleet.tls.ca_pem if fleet.tls else None)
    request = urllib.request.Request(f"{fleet.servers[key].https_url}/api/v1/namespaces/default",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_kubernetes_accepts_only_the_clusters_own_accounts_credentials(fleet: Sandbox) -> None:
    creds = client(fleet, "sts").assume_role(RoleArn=RETAIL_ROLE, RoleSessionName="kvfleet-test-run",
                                             ExternalId="kvfleet-retail")["Credentials"]
    retail_key = creds["AccessKeyId"]
    assert _kube_status(fleet, PAYMENTS_KEY, retail_key) == 401
    assert _kube_status(fleet, RETAIL_KEY, retail_key) in (200, 403)  # authenticated; RBAC decides the rest
    assert _kube_status(fleet, RETAIL_KEY, "sandbox") == 401  # the hub's base key has no access entry there
    shared = f"{SHARED}/us-west-2/ml-eval"
    assert _kube_status(fleet, shared, account_key(SHARED)) in (200, 403)
    assert _kube_status(fleet, shared, retail_key) == 401
    fleet.aws.credential_lifetime_s = 1
    try:
        short = client(fleet, "sts").assume_role(RoleArn=RETAIL_ROLE, RoleSessionName="short",
                                                 ExternalId="kvfleet-retail")["Credentials"]
    finally:
        fleet.aws.credential_lifetime_s = None
    while dt.datetime.now(dt.UTC) < short["Expiration"]:
        time.sleep(0.05)
    assert _kube_status(fleet, RETAIL_KEY, short["AccessKeyId"]) == 401
