"""The account guard (``HyperPodClient.account_problem``, run when a stage context first reaches its cluster): a
connection whose credentials land in another account than the inventory's is refused before any change, with a
message naming both accounts, and the refusal is in the history; the request log holds reads only."""

from __future__ import annotations

import pytest
import yaml
from stagekit import mutating_calls, reset_counters

from kvfleet.errors import PermanentError
from kvfleet.fleet.inventory import parse_inventory
from kvfleet.history.keys import StepKey
from kvfleet.stages import addons, curvine, tiered_storage

pytestmark = pytest.mark.integration
CLUSTER = "ml-stage-usw2"


def _in_account(example_fleet, account_id: str):  # type: ignore[no-untyped-def]
    """The twin's fleet with ``CLUSTER`` declared in ``account_id``, reached through the base connection (which
    the twin answers as its own account, 123456789012)."""
    doc = yaml.safe_load(example_fleet.read_text())
    doc["accounts"] = [{"name": "elsewhere", "id": account_id, "aws_conn_id": "aws_default"}]
    next(c for c in doc["clusters"] if c["name"] == CLUSTER)["account"] = "elsewhere"
    return parse_inventory(yaml.safe_dump(doc))


@pytest.mark.parametrize("stage", [tiered_storage, addons, curvine], ids=lambda s: s.__name__.rsplit(".", 1)[-1])
def test_credentials_in_another_account_change_nothing(fleet_env, make_ctx, history, example_fleet,  # type: ignore[no-untyped-def]
                                                       stage) -> None:
    inv = _in_account(example_fleet, "111111111111")
    history.runs.start("t/guard", dag_id="t", run_id="guard", trigger="test", triggered_by=None, params={})
    reset_counters(fleet_env)
    ctx = make_ctx(inv.cluster(CLUSTER).key, inv=inv, history=history, step_key=StepKey("t/guard", "stage"))
    with pytest.raises(PermanentError) as err:
        stage.reconcile(ctx)
    text = str(err.value)
    assert "account guard" in text and "account 123456789012" in text and "account 111111111111" in text
    assert "nothing was changed" in text
    assert mutating_calls(fleet_env, CLUSTER) == {"k8s": [], "aws": []}
    assert fleet_env.aws.operations() == ["GetCallerIdentity"]  # the guard's one read, before anything else
    refused = [s for s in history.runs.steps("t/guard") if s["step"] == "account_guard"]
    assert [(s["outcome"], s["cluster"]) for s in refused] == [("refused", f"111111111111/us-west-2/{CLUSTER}")]
    assert "123456789012" in refused[0]["detail"]["reason"]


def test_the_right_account_passes_the_guard(fleet_env, make_ctx, example_fleet) -> None:  # type: ignore[no-untyped-def]
    """The twin's own account, declared: the guard reads the caller and the cluster, and lets the stage act."""
    inv = _in_account(example_fleet, "123456789012")
    ctx = make_ctx(inv.cluster(CLUSTER).key, inv=inv)
    reset_counters(fleet_env)
    assert ctx.hyperpod.region == "us-west-2"
    assert fleet_env.aws.operations() == ["GetCallerIdentity", "DescribeCluster"]
