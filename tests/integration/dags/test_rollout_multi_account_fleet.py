"""kvfleet_rollout on tests/fleets/multi-account.yaml as it is (two LOB accounts with ml-prod each, reached by
their roles, and shared-services' ml-eval through its own connection), end to end through dag.test() against the
twin in its own process: every cluster converges, each change made in its cluster's account."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
FLEET = Path(__file__).resolve().parents[2] / "fleets" / "multi-account.yaml"
ACCOUNTS = {"111111111111": "retail", "222222222222": "payments", "333333333333": "platform"}


@pytest.fixture
def small_fleet(tmp_path: Path) -> Path:  # the sandbox_process fixture starts the twin with this fleet
    path = tmp_path / "fleet.yaml"
    shutil.copyfile(FLEET, path)
    return path


def test_the_multi_account_fleet_converges(dagbag, history, sandbox_process, small_fleet) -> None:  # type: ignore[no-untyped-def]
    from test_rollout_sandbox import conf

    dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, approval="none"))
    assert dr.state == "success"
    run_key = f"kvfleet_rollout/{dr.run_id}"
    outcomes = {(s["cluster"], s["endpoint"], s["outcome"]) for s in history.runs.steps(run_key)
                if s["stage"] == "endpoint"}
    assert {o for *_, o in outcomes} == {"changed"} and len(outcomes) == 5, outcomes
    assert {c.split("/")[0] for c, _, _ in outcomes} == set(ACCOUNTS)
    calls = sandbox_process.admin("/aws/calls")
    for account in ACCOUNTS:
        changes = [c for c in calls if c["account"] == account and c["mutating"]]
        assert changes and {c["caller_arn"].split(":")[4] for c in changes} == {account}, account
    assert not [c for c in calls if c["account"] == "123456789012" and c["mutating"]]
