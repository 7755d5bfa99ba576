"""NodeRecovery and the drift check against the twin: a declared value the cluster does not have is
``node_recovery_mismatch`` until stage 1 reconciles it; an undeclared one is never reported, whatever the cluster
has."""

from __future__ import annotations

import pytest
from preflightkit import CLUSTER, declaring

from kvfleet.stages import drift, tiered_storage

pytestmark = pytest.mark.integration


def node_recovery_findings(ctx) -> list:  # type: ignore[no-untyped-def]
    result = drift.check(ctx)
    assert result.reachable, result.findings
    return [f for f in result.findings if f.kind == "node_recovery_mismatch"]


def test_declared_node_recovery_drift_is_reported_then_reconciled(fleet_env, inventory, make_ctx) -> None:
    assert (fleet_env.aws.hyperpod_cluster(CLUSTER) or {})["NodeRecovery"] == "Automatic"
    inv = declaring(inventory, CLUSTER, declared=True, node_recovery="None")

    (finding,) = node_recovery_findings(make_ctx(inv=inv))
    assert (finding.object_ref, finding.field, finding.expected, finding.actual) == (
        f"HyperPodCluster/{CLUSTER}", "NodeRecovery", "None", "Automatic")

    outcome = tiered_storage.reconcile(make_ctx(inv=inv))  # stage 1 reconciles the declared value
    assert outcome.outcome == "changed" and outcome.detail["node_recovery_before"] == "Automatic"
    assert node_recovery_findings(make_ctx(inv=inv)) == []


def test_undeclared_node_recovery_is_never_drift(fleet_env, inventory, make_ctx) -> None:
    undeclared = declaring(inventory, CLUSTER, declared=False)
    assert node_recovery_findings(make_ctx(inv=undeclared)) == []
    # The cluster moves to another value outside kvfleet: still not drift, and stage 1 keeps it.
    tiered_storage.reconcile(make_ctx(inv=declaring(inventory, CLUSTER, declared=True, node_recovery="None")))
    assert node_recovery_findings(make_ctx(inv=undeclared)) == []
    kept = tiered_storage.reconcile(make_ctx(inv=undeclared))
    assert kept.detail["node_recovery"] == "None" and kept.detail["node_recovery_source"] == "live"
