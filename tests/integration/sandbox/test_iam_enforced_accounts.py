"""The twin's IAM enforcement across accounts (tests/fleets/multi-account.yaml): the hub holds hub-policy.json alone,
each account's kvfleet role, and the user of an account reached through its own connection, hold
k8s/iam/kvfleet-policy.json (kvfleet_sandbox.aws_iam_enforce.attach_kvfleet_policies).
See test_iam_enforced_sandbox.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from test_iam_enforced_sandbox import BASE_USER, ROOT, client, error_of

from kvfleet_sandbox.runtime import Sandbox, start_sandbox
from kvfleet_sandbox.twin import SandboxSettings

pytestmark = pytest.mark.integration

FLEET = ROOT / "tests" / "fleets" / "multi-account.yaml"
RETAIL, SHARED = "111111111111", "333333333333"
RETAIL_ROLE = f"arn:aws:iam::{RETAIL}:role/kvfleet-operator"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = start_sandbox(FLEET, tmp_path_factory.mktemp("iam-accounts"), SandboxSettings(), controllers=())
    try:
        yield sandbox
    finally:
        sandbox.stop()


def test_each_account_principal_holds_the_policy_and_the_hub_only_assumes(fleet: Sandbox) -> None:
    sts = client(fleet, "sts")
    tags = [{"Key": "lob", "Value": "retail"}, {"Key": "run", "Value": "manual__1"}]
    creds = sts.assume_role(RoleArn=RETAIL_ROLE, RoleSessionName="kvfleet-run", ExternalId="kvfleet-retail",
                            Tags=tags)["Credentials"]
    retail = client(fleet, "sagemaker", creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"])
    assert retail.describe_cluster(ClusterName="ml-prod")["ClusterArn"].split(":")[4] == RETAIL
    session = f"arn:aws:sts::{RETAIL}:assumed-role/kvfleet-operator/kvfleet-run"
    code, _, message = error_of(lambda: retail.list_clusters())
    assert code == "AccessDeniedException" and message.startswith(f"User: {session} is not authorized")
    # The hub holds hub-policy.json alone (every cluster is reached through an account's role or connection): no
    # SageMaker call of its own, and no session tag but run and lob.
    admin = client(fleet, "iam", fleet.aws.admin_key())
    assert admin.list_user_policies(UserName=BASE_USER)["PolicyNames"] == ["hub-policy"]
    code, _, message = error_of(lambda: client(fleet, "sagemaker").describe_cluster(ClusterName="ml-prod"))
    assert code == "AccessDeniedException" and "sagemaker:DescribeCluster" in message
    code, status, message = error_of(lambda: sts.assume_role(
        RoleArn=RETAIL_ROLE, RoleSessionName="s1", ExternalId="kvfleet-retail", Tags=[{"Key": "team", "Value": "x"}]))
    assert (code, status) == ("AccessDenied", 403) and "sts:TagSession" in message
    # An account reached through its own connection: that account's user holds the same policy.
    conn = json.loads(fleet.exports()["AIRFLOW_CONN_AWS_SHARED_SERVICES"])
    shared = client(fleet, "sagemaker", conn["login"], conn["password"], region="us-west-2")
    assert shared.describe_cluster(ClusterName="ml-eval")["ClusterArn"].split(":")[4] == SHARED
    assert error_of(lambda: shared.list_clusters())[0] == "AccessDeniedException"
