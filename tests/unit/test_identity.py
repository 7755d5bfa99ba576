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


def _sts_tag_value(value: str) -> bool:
    """STS's tagValueType: 0..256 of [\\p{L}\\p{Z}\\p{N}_.:/=+\\-@] (written apart from kvfleet's own check)."""
    import unicodedata

    return len(value) <= 256 and all(c in "_.:/=+-@" or unicodedata.category(c) in {
        "Lu", "Ll", "Lt", "Lm", "Lo", "Zs", "Zl", "Zp", "Nd", "Nl", "No"} for c in value)


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
    ("kvfleet_rollout", "manual__nightly\n"),  # Airflow's run id pattern ends in $, which a final newline passes
    ("a", ""),
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
    for text in ("kvfleet_rollout/manual__2026-12-07T13:50:25+00:00", "a*b?c#d", "é" * 300, "x" * 1000,
                 "manual__nightly\n", "manual__a\tb", "x\x1cy", "a\u2028b"):
        value = tag_value(text)
        assert _sts_tag_value(value), value
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


@pytest.mark.parametrize("command", [["preflight"], ["plan", "--diff"], ["advise"]])
def test_a_profile_that_does_not_exist_is_a_usage_error(command: list[str], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """As for --aws-conn-id (exit 2, naming it, before any call): --profile naming no profile."""
    from kvfleet import cli

    (tmp_path / "config").write_text("[profile ops]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    try:
        code = cli.main([*command, "--profile", "nosuch", "--fleet", str(FLEET)])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "--profile nosuch: no such AWS profile" in err, (code, err)


def test_the_cli_without_options_acts_as_the_dags_base_identity() -> None:
    """One resolution: without --aws-conn-id or --profile the CLI's base identity is the DAGs' (aws_default), so a
    `plan --diff` observes as the identity the rollout applies with."""
    import argparse

    from kvfleet import cli

    inv = load_inventory(FLEET)
    for cluster in inv.clusters:
        mine = cli._identity(argparse.Namespace(aws_conn_id=None, profile=None), "plan")(inv, cluster)
        dags = identity_for(inv, cluster, run=("kvfleet_cli", "plan"))
        assert mine == dags


def test_a_trigger_deferred_before_the_identity_was_passed_resumes_as_its_connection() -> None:
    """Trigger kwargs written before the identity travelled (aws_conn_id + account) still name who to act as, and
    survive another serialisation; the identity round-trips as JSON."""
    from kvfleet.airflow.triggers.kube_watch import KubeWatchTrigger
    from kvfleet.airflow.triggers.readiness import KubeReadyTrigger

    who = Identity(account="111111111111", conn_id=None, role_arn="arn:aws:iam::111111111111:role/r",
                   tags=(("run", "a/b"),))
    assert Identity.from_dict(who.as_dict()) == who
    old = KubeReadyTrigger("ml-prod", "us-east-1", check="pods", aws_conn_id="aws_retail", account="111111111111")
    assert old.identity == Identity(account="111111111111", conn_id="aws_retail")
    assert KubeReadyTrigger(**old.serialize()[1]).identity == old.identity
    watch = KubeWatchTrigger("ml-prod", "us-east-1", aws_conn_id=None, account="111111111111")
    assert KubeWatchTrigger(**watch.serialize()[1]).identity == watch.identity
