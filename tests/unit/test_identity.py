"""Who kvfleet is in a cluster's account (``kvfleet.clients.identity``): the base identity, and the account's role
assumed from it with the account's external id and duration, a session named after the run within STS's rules, and
the session tags ``run`` and ``lob``. tests/fleets/multi-account.yaml: two LOB accounts with a role each (retail with
an external id, payments with a 30-minute session), and shared-services reached through its own connection."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvfleet.clients.identity import Identity, identity_for, session_name, tag_value
from kvfleet.fleet.inventory import load_inventory

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "multi-account.yaml"
# STS: RoleSessionName 2..64 of [\w+=,.@-]; a tag value 0..256 of [\p{L}\p{Z}\p{N}_.:/=+\-@] (botocore's sts model).
SESSION_NAME = re.compile(r"[\w+=,.@-]{2,64}", re.ASCII)
TAG_VALUE = re.compile(r"[\w\s.:/=+\-@]{0,256}")
RUN = ("kvfleet_rollout", "manual__2026-12-07T13:50:25.123456+00:00")


def test_each_account_is_reached_through_its_role_or_its_connection() -> None:
    inv = load_inventory(FLEET)
    retail, payments, shared = inv.clusters
    who = identity_for(inv, retail, conn_id="aws_default", run=RUN)
    assert (who.account, who.conn_id, who.role_arn, who.external_id, who.duration_s) == (
        "111111111111", "aws_default", "arn:aws:iam::111111111111:role/kvfleet-operator", "kvfleet-retail", 3600)
    assert who.session_name == "kvfleet-rollout-manual__2026-12-07T13-50-25.123456+00-00"
    assert dict(who.tags) == {"run": "kvfleet_rollout/manual__2026-12-07T13:50:25.123456+00:00", "lob": "retail"}
    assert who.assume_role_args() == {
        "RoleArn": who.role_arn, "RoleSessionName": who.session_name, "DurationSeconds": 3600,
        "ExternalId": "kvfleet-retail", "Tags": [{"Key": "run", "Value": dict(who.tags)["run"]},
                                                 {"Key": "lob", "Value": "retail"}]}
    pay = identity_for(inv, payments, conn_id="aws_ops", run=RUN)
    assert (pay.conn_id, pay.duration_s, pay.external_id) == ("aws_ops", 1800, None)
    assert "ExternalId" not in pay.assume_role_args()
    own = identity_for(inv, shared, conn_id="aws_default", run=RUN, profile="ops")
    assert (own.account, own.conn_id, own.role_arn, own.profile) == ("333333333333", "aws_shared_services", None,
                                                                     None)
    assert own.describe() == "connection aws_shared_services"
    assert pay.describe() == (f"role {pay.role_arn} (session {pay.session_name}), assumed from connection aws_ops")


def test_a_fleet_without_accounts_acts_as_the_base_identity(example_fleet: Path) -> None:
    inv = load_inventory(example_fleet)
    who = identity_for(inv, inv.clusters[0], conn_id=None, profile="platform", run=RUN)
    assert who == Identity(account="default", conn_id=None, profile="platform")
    assert who.describe() == "profile platform"


@pytest.mark.parametrize("dag,run", [
    ("kvfleet_rollout", "manual__2026-12-07T13:50:25+00:00"),
    ("kvfleet_drift_check", "scheduled__" + "x" * 200),
    ("d", "a b/c:d*e?f\u00e9"),
    ("kvfleet_curvine_upgrade", "🚀" * 80),
])
def test_a_session_name_keeps_to_sts_rules_and_never_collides_when_cut(dag: str, run: str) -> None:
    name = session_name(dag, run)
    assert SESSION_NAME.fullmatch(name), name
    assert name.startswith("kvfleet-")
    if len(f"kvfleet-{dag}-{run}") > 64:
        assert session_name(dag, run + "x") != name  # the digest of the whole tells two long runs apart


def test_a_tag_value_keeps_to_sts_rules() -> None:
    for text in ("kvfleet_rollout/manual__2026-12-07T13:50:25+00:00", "a*b?c#d", "é" * 300, "x" * 1000):
        value = tag_value(text)
        assert TAG_VALUE.fullmatch(value), value
    assert tag_value("retail+payments") == "retail+payments"
    assert tag_value("x" * 1000) != tag_value("x" * 999)


def test_the_identity_travels_to_a_trigger_as_json() -> None:
    import json

    inv = load_inventory(FLEET)
    who = identity_for(inv, inv.clusters[1], run=RUN)
    assert Identity.from_dict(json.loads(json.dumps(who.as_dict()))) == who
    assert Identity.from_dict({}) == Identity()


@pytest.mark.parametrize("argv,said", [
    (["plan", "--diff", "--aws-conn-id", "nope"], "--aws-conn-id nope: no such Airflow connection"),
    (["preflight", "--aws-conn-id", "nope"], "--aws-conn-id nope: no such Airflow connection"),
    (["advise", "--aws-conn-id", "nope"], "--aws-conn-id nope: no such Airflow connection"),
    (["plan", "--diff", "--aws-conn-id", "a b"], "--aws-conn-id 'a b' is not an Airflow connection id"),
    (["preflight", "--profile", "ops team"], "--profile 'ops team' is not an AWS profile name"),
    (["advise", "--aws-conn-id", "x", "--profile", "y"], "not allowed with argument"),
])
def test_the_cli_refuses_an_identity_it_cannot_use_before_any_call(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Never a silent fall back to other credentials: a connection that does not exist is exit 2, naming it."""
    from kvfleet import cli

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # a call would fail loudly, not reach AWS
    monkeypatch.delenv("AIRFLOW_CONN_NOPE", raising=False)
    try:
        code = cli.main([*argv, "--fleet", str(FLEET)])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and said in err and "Traceback" not in err, err
