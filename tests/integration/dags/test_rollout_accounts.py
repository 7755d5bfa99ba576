"""kvfleet_rollout across AWS accounts, end to end through dag.test() against the twin in its own process: a cluster
named ml-prod in two accounts, each reached through its account's role assumed from the hub's base identity. The
rollout converges both; the twin's request log shows every change made in the right account, as the account's
role, in a session named after the run and tagged with it and the LOB."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RETAIL, PAYMENTS = "111111111111", "222222222222"
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
KEYS = {RETAIL: f"{RETAIL}/us-east-1/ml-prod", PAYMENTS: f"{PAYMENTS}/us-east-1/ml-prod"}


def _cluster(account: str, name: str) -> str:
    return f"""
  - name: ml-prod
    account: {name}
    region: us-east-1
    gpu_nodes: {{count: 4, instance_type: ml.g5.4xlarge}}
    l2_injection: patch
    addons:  # the operator's role and TLS bucket, in the cluster's account (the rollout's preflight checks both)
      amazon-sagemaker-hyperpod-inference:
        configuration:
          executionRoleArn: arn:aws:iam::{account}:role/hyperpod-inference-exec
          tlsCertificateS3Bucket: hyperpod-tls-{name}
    curvine: {{worker: {{replicas: 2, size: 100Gi}}}}"""


FLEET = f"""
settings: {{wave_size: 1}}
accounts:
  retail-prod: {{id: "{RETAIL}", role_arn: "arn:aws:iam::{RETAIL}:role/kvfleet-operator", external_id: kvfleet-retail}}
  payments-prod: {{id: "{PAYMENTS}", role_arn: "arn:aws:iam::{PAYMENTS}:role/platform/kvfleet-operator",
                  session_duration_s: 1800}}
lobs:
  - {{name: retail, account: retail-prod}}
  - {{name: payments, account: payments-prod}}
clusters:{_cluster(RETAIL, "retail-prod")}{_cluster(PAYMENTS, "payments-prod")}
endpoints:
  # the same namespace/name on both ml-prod: each LOB's bare cluster name is looked for in its own account
  - {{name: chat, namespace: shared, lob: retail, cluster: ml-prod, model: qwen2-7b, instance_type: ml.g5.4xlarge}}
  - {{name: chat, namespace: shared, lob: payments, cluster: ml-prod, model: qwen2-7b, instance_type: ml.g5.4xlarge}}
  - {{name: disputes-rag, namespace: payments, lob: payments, cluster: ml-prod, model: qwen2-7b,
     instance_type: ml.g5.4xlarge}}
"""


@pytest.fixture
def small_fleet(tmp_path: Path) -> Path:  # the sandbox_process fixture starts the twin with this fleet
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


def test_the_rollout_converges_both_ml_prod_each_as_its_account(dagbag, history, sandbox_process,  # type: ignore[no-untyped-def]
                                                               small_fleet) -> None:
    from test_rollout_sandbox import conf

    from kvfleet.clients.identity import session_name

    dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, approval="none"))
    assert dr.state == "success"
    run_key = f"kvfleet_rollout/{dr.run_id}"
    outcomes = sorted((s["cluster"], s["endpoint"], s["outcome"]) for s in history.runs.steps(run_key)
                      if s["stage"] == "endpoint")
    assert outcomes == [(KEYS[RETAIL], "shared/chat", "changed"), (KEYS[PAYMENTS], "payments/disputes-rag", "changed"),
                        (KEYS[PAYMENTS], "shared/chat", "changed")]
    verdicts = {(r["cluster"], r["endpoint"], r["verdict"])
                for r in history.queries.rows("verifications", cutoff=EPOCH, lob=None, endpoint=None)
                if r["run_key"] == run_key}
    assert {v for *_, v in verdicts} == {"pass"} and len(verdicts) == 3
    # every change in its cluster's account, as the account's role, in the run's session with its tags
    log = sandbox_process.admin("/aws/calls")
    session = session_name("kvfleet_rollout", dr.run_id)  # its rules: tests/unit/test_identity.py
    for account, role, lob in ((RETAIL, "kvfleet-operator", "retail"), (PAYMENTS, "kvfleet-operator", "payments")):
        changes = [c for c in log if c["account"] == account and c["mutating"]]
        assert changes, account
        assert {c["caller_arn"] for c in changes} == {f"arn:aws:sts::{account}:assumed-role/{role}/{session}"}
        assert {tuple(map(tuple, c["session_tags"])) for c in changes} == {(("run", run_key), ("lob", lob))}
    assert not [c for c in log if c["account"] == "123456789012" and c["mutating"]]


def _roles(calls: list[dict], account: str) -> set[str]:  # type: ignore[type-arg]
    """The roles (assumed-role/<role>) that called in ``account``, the session left out."""
    return {c["caller_arn"].rsplit("/", 1)[0] for c in calls if c["account"] == account}


def test_the_scheduled_dags_and_plan_diff_reach_each_account_as_the_rollout(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, capsys) -> None:
    """With no aws_conn_id in the run conf, the drift check, the hourly verification and the scale-out detection
    reach each ml-prod as its account's role; `kvfleet plan --diff --aws-conn-id aws_default` and the rollout's
    dry run make their calls in each account as the same role."""
    from test_rollout_sandbox import conf

    from kvfleet import cli
    from kvfleet.clients.identity import session_name

    assert dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, approval="none")).state == "success"
    runs = {
        "kvfleet_drift_check": {"fleet": str(small_fleet), "clusters": [], "remediate": False},
        "kvfleet_hit_verification": {"fleet": str(small_fleet), "lobs": [], "clusters": [], "endpoints": [],
                                     "prompt_tokens": 2000, "sweep": False, "max_parallel": 8},
        "kvfleet_curvine_scale_out": {"fleet": str(small_fleet), "clusters": []},
    }
    for dag_id, run_conf in runs.items():
        sandbox_process.admin("/reset-requests", {})
        dr = dagbag.get_dag(dag_id).test(run_conf=run_conf)
        assert dr.state == "success", dag_id
        calls = sandbox_process.admin("/aws/calls")
        for account in (RETAIL, PAYMENTS):
            mine = [c for c in calls if c["account"] == account]
            assert mine, (dag_id, account)
            session = session_name(dag_id, dr.run_id)  # its rules: tests/unit/test_identity.py
            assert {c["caller_arn"] for c in mine} == {
                f"arn:aws:sts::{account}:assumed-role/kvfleet-operator/{session}"}, (dag_id, account)
    # the CLI's plan --diff and the rollout's dry run: each account's calls by the same role
    sandbox_process.admin("/reset-requests", {})
    assert cli.main(["plan", "--diff", "--fleet", str(small_fleet), "--aws-conn-id", "aws_default"]) == 0
    capsys.readouterr()
    cli_calls = sandbox_process.admin("/aws/calls")
    sandbox_process.admin("/reset-requests", {})
    dry = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, dry_run=True, approval="none"))
    assert dry.state == "success"
    dry_calls = sandbox_process.admin("/aws/calls")
    for account in (RETAIL, PAYMENTS):
        assert _roles(cli_calls, account) == _roles(dry_calls, account) == {
            f"arn:aws:sts::{account}:assumed-role/kvfleet-operator"}
        assert {c["operation"] for c in cli_calls if c["account"] == account} <= \
            {c["operation"] for c in dry_calls if c["account"] == account}
    assert not [c for c in cli_calls + dry_calls if c["mutating"] and c["operation"] != "AssumeRole"]
