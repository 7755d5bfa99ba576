"""Stage 1 and NodeRecovery against the twin: a declared value is reconciled and the change
recorded; an undeclared one keeps whatever the cluster has."""

from __future__ import annotations

import time

import pytest
from preflightkit import CLUSTER, aws_client, declaring

from kvfleet.stages import tiered_storage

pytestmark = pytest.mark.integration


def update_calls(sandbox) -> list[dict]:  # type: ignore[no-untyped-def]
    return [e.params for e in sandbox.aws.request_log if e.service == "sagemaker" and e.operation == "UpdateCluster"]


def live(sandbox) -> dict:  # type: ignore[no-untyped-def]
    return sandbox.aws.hyperpod_cluster(CLUSTER) or {}


def test_declared_node_recovery_is_reconciled_with_tiered_storage(fleet_env, inventory, make_ctx) -> None:
    assert live(fleet_env)["NodeRecovery"] == "Automatic"
    inv = declaring(inventory, CLUSTER, declared=True, node_recovery="None")
    fleet_env.aws.reset_request_log()

    outcome = tiered_storage.reconcile(make_ctx(inv=inv))

    assert outcome.outcome == "changed"
    assert outcome.detail["node_recovery"] == "None" and outcome.detail["node_recovery_before"] == "Automatic"
    assert outcome.detail["node_recovery_source"] == "declared"
    (call,) = update_calls(fleet_env)
    assert call["NodeRecovery"] == "None" and call["TieredStorageConfig"]["Mode"] == "Enable"
    assert live(fleet_env)["NodeRecovery"] == "None"

    fleet_env.aws.reset_request_log()
    again = tiered_storage.reconcile(make_ctx(inv=inv))
    assert again.outcome == "unchanged" and update_calls(fleet_env) == []


def test_declared_node_recovery_alone_is_an_update_without_tiered_storage(fleet_env, inventory, make_ctx) -> None:
    tiered_storage.reconcile(make_ctx())  # tiered storage enabled, NodeRecovery sent back as it is (Automatic)
    inv = declaring(inventory, CLUSTER, declared=True, node_recovery="None")

    dry = make_ctx(inv=inv, dry_run=True)
    fleet_env.aws.reset_request_log()
    assert tiered_storage.reconcile(dry).outcome == "planned"
    (planned,) = dry.planned
    assert planned.action == f"aws sagemaker update-cluster --cluster-name {CLUSTER} --node-recovery None"
    assert planned.diff == "- NodeRecovery Automatic\n+ NodeRecovery None (declared in the inventory)"
    assert update_calls(fleet_env) == []

    outcome = tiered_storage.reconcile(make_ctx(inv=inv))
    assert outcome.outcome == "changed" and outcome.detail["node_recovery_before"] == "Automatic"
    (call,) = update_calls(fleet_env)
    assert call == {"ClusterName": CLUSTER, "NodeRecovery": "None"}
    assert live(fleet_env)["NodeRecovery"] == "None"
    assert live(fleet_env)["TieredStorageConfig"]["Mode"] == "Enable"


def test_undeclared_node_recovery_keeps_the_live_value(fleet_env, inventory, make_ctx) -> None:
    sagemaker = aws_client(fleet_env, "sagemaker")
    sagemaker.update_cluster(ClusterName=CLUSTER, NodeRecovery="None")  # a platform team's own choice
    deadline = time.monotonic() + 30
    while live(fleet_env)["ClusterStatus"] != "InService" or live(fleet_env)["NodeRecovery"] != "None":
        assert time.monotonic() < deadline, "the cluster did not settle"
        time.sleep(0.05)
    inv = declaring(inventory, CLUSTER, declared=False)  # the inventory names no node_recovery
    assert inv.cluster(CLUSTER).node_recovery is None
    fleet_env.aws.reset_request_log()

    outcome = tiered_storage.reconcile(make_ctx(inv=inv))

    assert outcome.outcome == "changed" and outcome.detail["node_recovery_source"] == "live"
    assert "node_recovery_before" not in outcome.detail
    (call,) = update_calls(fleet_env)
    assert call["NodeRecovery"] == "None"  # sent back unchanged
    assert live(fleet_env)["NodeRecovery"] == "None"
    fleet_env.aws.reset_request_log()
    assert tiered_storage.reconcile(make_ctx(inv=inv)).outcome == "unchanged"
    assert update_calls(fleet_env) == []
