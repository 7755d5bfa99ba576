"""k8s/iam's hub and spoke files do what k8s/iam/README.md and docs/run-for-real.md (section 4c) say.

- Every file in k8s/iam is JSON, an IAM policy document of version 2012-10-17.
- ``hub-policy.json``, the hub role's only policy: it allows ``sts:AssumeRole`` and ``sts:TagSession`` (tag keys
  ``run`` and ``lob`` only) on every spoke role of tests/fleets/multi-account.yaml, and nothing else: no other
  action, no other role, no other tag key. Actions and resources are matched by moto's IAM policy engine
  (``moto.iam.access_control.IAMPolicy``, the one moto's own authorization uses); moto 5.2.5 evaluates only the
  ``StringEquals`` condition operator and lets any other pass (``moto/iam/policy_conditions.py``), so the hub's two
  conditions are evaluated here, as the IAM User Guide defines them ("Multivalued context key examples":
  ``ForAllValues`` holds when every value of the request is listed, and when the request has none; ``Null``
  ``false``: the key is present).
- ``spoke-trust-policy.json``, its placeholders filled in, is the trust policy of the spoke roles on the twin's STS
  (``kvfleet_sandbox.aws_sts``, whose trust evaluation tests/conformance/test_sts_multi_account.py checks): the
  hub role, assumed first as the Airflow pods would get it, assumes each spoke role with the account's external id
  and the session tags; without the external id, with another, as the base user, as another role of the hub
  account, or as a role of the same name in another account: AccessDenied. kvfleet's own identity resolution
  (``kvfleet.clients.identity``, ``kvfleet.clients.aws``), run as the hub role, reaches each account, and the tags
  it sent are ones the hub policy allows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.iam.access_control import IAMPolicy, PermissionResult

from kvfleet.fleet.inventory import load_inventory
from kvfleet_sandbox.aws import AwsEmulator

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
IAM = ROOT / "k8s" / "iam"
FLEET = ROOT / "tests" / "fleets" / "multi-account.yaml"
REGION = "us-east-1"
HUB, RETAIL, PAYMENTS, STRANGER = "123456789012", "111111111111", "222222222222", "999999999999"
HUB_ROLE = f"arn:aws:iam::{HUB}:role/kvfleet-hub"
RETAIL_ROLE = f"arn:aws:iam::{RETAIL}:role/kvfleet-operator"
PAYMENTS_ROLE = f"arn:aws:iam::{PAYMENTS}:role/platform/kvfleet-operator"
EXTERNAL_IDS = {RETAIL: "kvfleet-retail", PAYMENTS: "kvfleet-payments"}
PLACEHOLDERS = ("HUB_ACCOUNT_ID", "EXTERNAL_ID")
TAGS = [{"Key": "run", "Value": "kvfleet_rollout/manual__1"}, {"Key": "lob", "Value": "retail"}]


def document(name: str) -> dict[str, Any]:
    value = json.loads((IAM / name).read_text())
    assert isinstance(value, dict)
    return value


def filled(name: str, **values: str) -> str:
    """The file with its placeholders replaced (k8s/iam/README.md, "Placeholders"); none may be left."""
    text = (IAM / name).read_text()
    for placeholder, value in values.items():
        assert placeholder in text, f"{name} has no {placeholder}"
        text = text.replace(placeholder, value)
    assert not [p for p in PLACEHOLDERS if p in text], f"{name}: placeholders left"
    json.loads(text)
    return text


# ---- the hub policy, evaluated ----------------------------------------------------------------------------------


def _condition_holds(operator: str, key: str, wanted: Any, context: dict[str, list[str]]) -> bool:
    """One condition of the hub policy on the request context (IAM User Guide, "Condition operators" and
    "Multivalued context key examples"). Any operator the hub policy does not use fails the test."""
    wanted_values = [str(w) for w in (wanted if isinstance(wanted, list) else [wanted])]
    have = context.get(key)
    if operator == "ForAllValues:StringEquals":
        return all(value in wanted_values for value in have or [])
    if operator == "Null":
        assert wanted_values in (["true"], ["false"]), wanted
        return (not have) == (wanted_values == ["true"])
    if operator == "StringEquals":
        return have is not None and len(have) == 1 and have[0] in wanted_values
    raise AssertionError(f"the test does not evaluate {operator}: extend _condition_holds first")


def _conditions_hold(conditions: dict[str, dict[str, Any]] | None, context: dict[str, list[str]]) -> bool:
    return all(_condition_holds(operator, key, wanted, context)
               for operator, tests in (conditions or {}).items() for key, wanted in tests.items())


def hub_allows(action: str, resource: str, tag_keys: list[str] | None = None) -> bool:
    """Whether hub-policy.json allows ``action`` on ``resource``: a statement matches (moto's engine on Action and
    Resource, the conditions here on ``aws:TagKeys``), and no Deny does."""
    context = {} if tag_keys is None else {"aws:TagKeys": tag_keys}
    allowed = False
    for statement in document("hub-policy.json")["Statement"]:
        bare = {k: v for k, v in statement.items() if k != "Condition"}
        result = IAMPolicy(json.dumps({"Version": "2012-10-17", "Statement": [bare]})).is_action_permitted(
            action, resource)
        if result is PermissionResult.NEUTRAL or not _conditions_hold(statement.get("Condition"), context):
            continue
        if result is PermissionResult.DENIED:
            return False
        allowed = True
    return allowed


def hub_may_assume(role: str, tags: list[dict[str, str]] | None = None) -> bool:
    """AssumeRole with session tags needs both actions (IAM User Guide, "Pass session tags in AWS STS")."""
    keys = [t["Key"] for t in tags or []]
    return hub_allows("sts:AssumeRole", role) and (not keys or hub_allows("sts:TagSession", role, keys))


def test_every_file_is_a_json_policy_document() -> None:
    names = sorted(p.name for p in IAM.glob("*.json"))
    assert {"hub-policy.json", "spoke-trust-policy.json", "hub-trust-pod-identity.json",
            "kvfleet-policy.json"} <= set(names)
    for name in names:
        policy = document(name)
        assert policy["Version"] == "2012-10-17", name
        for statement in policy["Statement"]:
            assert statement["Effect"] == "Allow" and statement.get("Sid"), (name, statement)
            assert not {"NotAction", "NotResource", "NotPrincipal"} & set(statement), (name, statement)
    for name in ("hub-policy.json", "spoke-trust-policy.json"):
        for statement in document(name)["Statement"]:
            assert not any("*" in a for a in (statement["Action"] if isinstance(statement["Action"], list)
                                                else [statement["Action"]])), (name, statement)
    # The hub's only actions, and the spoke trust's only principal.
    hub = document("hub-policy.json")["Statement"]
    assert sorted(s["Action"] for s in hub) == ["sts:AssumeRole", "sts:TagSession"]
    trust = document("spoke-trust-policy.json")["Statement"]
    assert [s["Principal"] for s in trust] == [{"AWS": "arn:aws:iam::HUB_ACCOUNT_ID:role/kvfleet-hub"}]
    assert trust[0]["Condition"] == {"StringEquals": {"sts:ExternalId": "EXTERNAL_ID"}}


def test_the_hub_assumes_every_spoke_role_of_the_inventory_with_run_and_lob_tags() -> None:
    roles = sorted(str(a.role_arn) for a in load_inventory(FLEET).accounts if a.role_arn)
    assert roles == [RETAIL_ROLE, PAYMENTS_ROLE]
    for role in roles:
        assert hub_may_assume(role), role
        for keys in (["run", "lob"], ["lob", "run"], ["run"], ["lob"]):
            assert hub_may_assume(role, [{"Key": k, "Value": "v"} for k in keys]), (role, keys)


@pytest.mark.parametrize(("action", "resource", "tag_keys"), [
    # Anything but the two STS actions, on anything.
    ("sagemaker:UpdateCluster", f"arn:aws:sagemaker:{REGION}:{RETAIL}:cluster/abc123", None),
    ("sagemaker:DescribeCluster", f"arn:aws:sagemaker:{REGION}:{RETAIL}:cluster/abc123", None),
    ("eks:DescribeCluster", f"arn:aws:eks:{REGION}:{RETAIL}:cluster/ml-prod-eks", None),
    ("iam:PassRole", RETAIL_ROLE, None),
    ("iam:CreateRole", f"arn:aws:iam::{RETAIL}:role/kvfleet-operator", None),
    ("iam:UpdateAssumeRolePolicy", RETAIL_ROLE, None),
    ("s3:ListBucket", "arn:aws:s3:::kvfleet-tls", None),
    ("sns:Publish", f"arn:aws:sns:{REGION}:{HUB}:kvfleet-notify", None),
    ("sts:GetFederationToken", f"arn:aws:sts::{HUB}:federated-user/kvfleet", None),
    ("sts:AssumeRoleWithWebIdentity", RETAIL_ROLE, None),
    # AssumeRole on a role that is not a spoke role.
    ("sts:AssumeRole", f"arn:aws:iam::{RETAIL}:role/admin", None),
    ("sts:AssumeRole", f"arn:aws:iam::{RETAIL}:role/kvfleet-operator-admin", None),
    ("sts:AssumeRole", f"arn:aws:iam::{RETAIL}:role/platform/kvfleet-operator-admin", None),
    ("sts:AssumeRole", f"arn:aws:iam::{RETAIL}:role/OrganizationAccountAccessRole", None),
    ("sts:AssumeRole", HUB_ROLE, None),
    # TagSession with any other key, or none, or on another role.
    ("sts:TagSession", RETAIL_ROLE, ["run", "lob", "team"]),
    ("sts:TagSession", RETAIL_ROLE, ["Owner"]),
    ("sts:TagSession", PAYMENTS_ROLE, ["run", "kubernetes-namespace"]),
    ("sts:TagSession", RETAIL_ROLE, []),
    ("sts:TagSession", RETAIL_ROLE, None),
    ("sts:TagSession", f"arn:aws:iam::{RETAIL}:role/admin", ["run", "lob"]),
])
def test_the_hub_may_do_nothing_else(action: str, resource: str, tag_keys: list[str] | None) -> None:
    assert not hub_allows(action, resource, tag_keys)


def test_the_evaluation_is_not_vacuous() -> None:
    """moto's engine really matches: a policy allowing everything would allow what the hub policy refuses."""
    everything = IAMPolicy(json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    assert everything.is_action_permitted("iam:PassRole", RETAIL_ROLE) is PermissionResult.PERMITTED
    assert not hub_allows("iam:PassRole", RETAIL_ROLE)
    assert _condition_holds("ForAllValues:StringEquals", "aws:TagKeys", ["run"], {}) is True  # as AWS: vacuous
    assert _conditions_hold({"ForAllValues:StringEquals": {"aws:TagKeys": ["run"]},
                             "Null": {"aws:TagKeys": "false"}}, {}) is False


# ---- the spoke trust policy, on the twin's STS ---------------------------------------------------------------


def _client(emu: AwsEmulator, service: str, key: str, secret: str = "sandbox", token: str | None = None) -> Any:
    return boto3.client(service, endpoint_url=emu.url, region_name=REGION, aws_access_key_id=key,
                        aws_secret_access_key=secret, aws_session_token=token)


def _assume(sts: Any, role: str, **kwargs: Any) -> dict[str, str]:
    credentials: dict[str, str] = sts.assume_role(RoleArn=role, RoleSessionName="kvfleet-test", **kwargs)[
        "Credentials"]
    return credentials


def _as(emu: AwsEmulator, credentials: dict[str, str], service: str = "sts") -> Any:
    return _client(emu, service, credentials["AccessKeyId"], credentials["SecretAccessKey"],
                   credentials["SessionToken"])


def _create_role(emu: AwsEmulator, account: str, name: str, trust: str, path: str = "/",
                 policy: str | None = None) -> str:
    iam = _client(emu, "iam", emu.admin_key(account))
    arn: str = iam.create_role(RoleName=name, Path=path, AssumeRolePolicyDocument=trust)["Role"]["Arn"]
    if policy is not None:
        iam.put_role_policy(RoleName=name, PolicyName=name, PolicyDocument=policy)
    return arn


def operator_policy(account: str) -> str:
    """kvfleet-policy.json as the spoke role holds it. moto 5.2.5's policy validator reads a resource ARN's fields
    up to each ``:`` (``moto/iam/policy_validation.py``), so the ``:`` inside the policy variable
    ``${aws:PrincipalAccount}``, which IAM resolves to the role's account (IAM User Guide, "IAM policy elements:
    Variables and tags"), shifts the fields and the policy is refused; the twin gets the account written out."""
    return (IAM / "kvfleet-policy.json").read_text().replace("${aws:PrincipalAccount}", account)


def _trusting(principal: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": principal}, "Action": ["sts:AssumeRole", "sts:TagSession"]}]})


def _refused(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response
    assert (error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]) == ("AccessDenied", 403), error
    return str(error["Error"]["Message"])


class Accounts:
    def __init__(self, emu: AwsEmulator, hub: dict[str, str], impostor: dict[str, str],
                 stranger: dict[str, str]) -> None:
        self.emu, self.hub, self.impostor, self.stranger = emu, hub, impostor, stranger


@pytest.fixture(scope="module")
def accounts() -> Iterator[Accounts]:
    """The twin with the hub account's roles and a spoke role per account, built from k8s/iam as the README's
    commands build them. The twin's base key (``sandbox``, the hub's user ``kvfleet-sandbox``) stands for what
    EKS Pod Identity does on the Airflow pods: it assumes the hub role."""
    with AwsEmulator(account_id=HUB, delay_s=0.01) as emu:
        base_user = f"arn:aws:iam::{HUB}:user/kvfleet-sandbox"
        hub_policy = (IAM / "hub-policy.json").read_text()
        assert _create_role(emu, HUB, "kvfleet-hub", _trusting(base_user), policy=hub_policy) == HUB_ROLE
        _create_role(emu, HUB, "kvfleet-impostor", _trusting(base_user), policy=hub_policy)
        for account, role, path in ((RETAIL, RETAIL_ROLE, "/"), (PAYMENTS, PAYMENTS_ROLE, "/platform/")):
            trust = filled("spoke-trust-policy.json", HUB_ACCOUNT_ID=HUB, EXTERNAL_ID=EXTERNAL_IDS[account])
            assert _create_role(emu, account, "kvfleet-operator", trust, path, operator_policy(account)) == role
        # A role named kvfleet-hub in another account, which its own administrator can assume.
        stranger_admin = f"arn:aws:iam::{STRANGER}:user/kvfleet-sandbox-admin"
        _create_role(emu, STRANGER, "kvfleet-hub", _trusting(stranger_admin), policy=hub_policy)
        base = _client(emu, "sts", "sandbox")
        hub = _assume(base, HUB_ROLE)
        impostor = _assume(base, f"arn:aws:iam::{HUB}:role/kvfleet-impostor")
        stranger = _assume(_client(emu, "sts", emu.admin_key(STRANGER)), f"arn:aws:iam::{STRANGER}:role/kvfleet-hub")
        yield Accounts(emu, hub, impostor, stranger)


def test_the_hub_role_assumes_each_spoke_role_with_its_external_id_and_tags(accounts: Accounts) -> None:
    emu = accounts.emu
    assert _as(emu, accounts.hub).get_caller_identity()["Arn"] == \
        f"arn:aws:sts::{HUB}:assumed-role/kvfleet-hub/kvfleet-test"
    for account, role in ((RETAIL, RETAIL_ROLE), (PAYMENTS, PAYMENTS_ROLE)):
        assert hub_may_assume(role, TAGS)
        spoke = _assume(_as(emu, accounts.hub), role, ExternalId=EXTERNAL_IDS[account], Tags=TAGS)
        who = _as(emu, spoke).get_caller_identity()
        assert who["Account"] == account
        assert who["Arn"] == f"arn:aws:sts::{account}:assumed-role/kvfleet-operator/kvfleet-test"
        # The spoke role holds kvfleet-policy.json, unchanged.
        iam = _client(emu, "iam", emu.admin_key(account))
        held = iam.get_role_policy(RoleName="kvfleet-operator", PolicyName="kvfleet-operator")["PolicyDocument"]
        assert held == json.loads(operator_policy(account))
    sessions = {c.role_arn: c for c in emu.identities.sessions() if c.role_arn in (RETAIL_ROLE, PAYMENTS_ROLE)}
    assert {r: dict(c.tags) for r, c in sessions.items()} == {
        r: {"run": "kvfleet_rollout/manual__1", "lob": "retail"} for r in (RETAIL_ROLE, PAYMENTS_ROLE)}


def test_the_spoke_trust_refuses_a_missing_or_wrong_external_id(accounts: Accounts) -> None:
    sts = _as(accounts.emu, accounts.hub)
    hub_session = f"arn:aws:sts::{HUB}:assumed-role/kvfleet-hub/kvfleet-test"
    for extra in ({}, {"ExternalId": "kvfleet-wrong"}, {"ExternalId": EXTERNAL_IDS[PAYMENTS]}):
        message = _refused(lambda e=extra: _assume(sts, RETAIL_ROLE, Tags=TAGS, **e))
        assert message == f"User: {hub_session} is not authorized to perform: sts:AssumeRole on resource: " \
                          f"{RETAIL_ROLE}"
    _refused(lambda: _assume(sts, PAYMENTS_ROLE, ExternalId=EXTERNAL_IDS[RETAIL]))


def test_the_spoke_trust_refuses_every_other_principal(accounts: Accounts) -> None:
    emu = accounts.emu
    callers = {
        "the hub account's user (not the hub role)": _client(emu, "sts", "sandbox"),
        "the hub account's administrator": _client(emu, "sts", emu.admin_key(HUB)),
        "another role of the hub account": _as(emu, accounts.impostor),
        "a role named kvfleet-hub in another account": _as(emu, accounts.stranger),
        "the retail spoke's own administrator": _client(emu, "sts", emu.admin_key(RETAIL)),
    }
    for who, sts in callers.items():
        for account, role in ((RETAIL, RETAIL_ROLE), (PAYMENTS, PAYMENTS_ROLE)):
            message = _refused(lambda s=sts, a=account, r=role: _assume(s, r, ExternalId=EXTERNAL_IDS[a]))
            assert message.endswith(f"sts:AssumeRole on resource: {role}"), (who, message)


def test_kvfleet_as_the_hub_role_reaches_each_account_with_tags_the_hub_allows(
        accounts: Accounts, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvfleet's identity resolution, the hub role's credentials being the environment's (no aws_default
    connection): AssumeRole with the inventory's external id and the run's tags, then GetCallerIdentity."""
    from kvfleet.clients import aws
    from kvfleet.clients.identity import identity_for

    emu = accounts.emu
    inventory = load_inventory(FLEET).model_copy(update={"accounts": [
        a.model_copy(update={"external_id": EXTERNAL_IDS[a.id]}) if a.id in EXTERNAL_IDS else a
        for a in load_inventory(FLEET).accounts]})
    for name in [n for n in os.environ if n.startswith("AIRFLOW_CONN_AWS")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", emu.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", accounts.hub["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", accounts.hub["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", accounts.hub["SessionToken"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    before = {c.access_key for c in emu.identities.sessions()}
    aws.forget()
    try:
        for account in (RETAIL, PAYMENTS):
            cluster = inventory.cluster(f"{account}/{REGION}/ml-prod")
            who = identity_for(inventory, cluster, run=("kvfleet_rollout", "manual__2"))
            assert who.role_arn and who.external_id == EXTERNAL_IDS[account]
            assert aws.client("sts", REGION, who).get_caller_identity()["Account"] == account
    finally:
        aws.forget()
    issued = [c for c in emu.identities.sessions() if c.access_key not in before]
    assert sorted(str(c.role_arn) for c in issued) == sorted([RETAIL_ROLE, PAYMENTS_ROLE])
    for session in issued:
        tags = [{"Key": k, "Value": v} for k, v in session.tags]
        assert {t["Key"] for t in tags} == {"run", "lob"}, session.tags
        assert hub_may_assume(str(session.role_arn), tags), session.tags
