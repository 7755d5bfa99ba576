"""`kvfleet preflight` on a twin whose start-up created the fleet without the operator's execution role and TLS
certificate bucket (``SandboxSettings(omit_prerequisites=...)``): the command exits 1 and
lists both, each with its fix, on every cluster; the rest of the prerequisites are there, so nothing else is
listed."""

from __future__ import annotations

import json

import pytest

from kvfleet import cli
from kvfleet.fleet.inventory import load_inventory
from kvfleet_sandbox.aws_prereqs import operator_settings

pytestmark = pytest.mark.integration


@pytest.fixture
def missing_env(sandbox_factory, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    sandbox = sandbox_factory(omit_prerequisites=("execution_role", "tls_bucket"))
    for key, value in sandbox.exports().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)  # boto3 reads AWS_ENDPOINT_URL natively
    return sandbox


def test_preflight_lists_the_missing_execution_role_and_tls_bucket_with_fixes(missing_env, example_fleet,
                                                                              capsys) -> None:
    inv = load_inventory(example_fleet)

    assert cli.main(["preflight", "--fleet", str(example_fleet)]) == 1
    text = capsys.readouterr().out
    for cl in inv.clusters:
        role_arn, bucket = operator_settings(cl)
        assert role_arn and bucket
        role = role_arn.rsplit("/", 1)[-1]
        assert f"[{cl.name}] MISSING (execution_role): IAM role {role}" in text
        assert f"fix: aws iam create-role --role-name {role} --assume-role-policy-document " in text
        assert f"[{cl.name}] MISSING (tls_bucket): S3 bucket {bucket}" in text
        assert f"fix: aws s3api create-bucket --bucket {bucket} --region {cl.region}" in text

    assert cli.main(["preflight", "--fleet", str(example_fleet), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ready"] is False
    assert sorted({(p["cluster"], p["check"]) for p in report["problems"] if p["severity"] == "error"}) == sorted(
        (cl.name, check) for cl in inv.clusters for check in ("execution_role", "tls_bucket"))
