"""NodeRecovery in drift: a declared value the cluster does not have is a finding; an undeclared one
is never judged. The inventory's ``Cluster.node_recovery`` is None when the inventory does not declare it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from kvfleet.fleet import drift as rules
from kvfleet.fleet.inventory import Cluster, load_inventory

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _cluster(name: str, node_recovery: str | None = None) -> Cluster:
    declared = {} if node_recovery is None else {"node_recovery": node_recovery}  # None: the key left out
    return Cluster(name=name, region="us-east-1", gpu_nodes={"count": 2, "instance_type": "ml.g5.4xlarge"}, **declared)


def test_declared_value_the_cluster_lacks_is_a_finding() -> None:
    (f,) = rules.node_recovery_findings(_cluster("ml-prod-use1", "None"), "Automatic")
    assert (f.kind, f.object_ref, f.field, f.expected, f.actual) == (
        "node_recovery_mismatch", "HyperPodCluster/ml-prod-use1", "NodeRecovery", "None", "Automatic")
    assert f.severity == "medium"
    assert rules.node_recovery_findings(_cluster("c", "None"), "None") == []
    # DescribeCluster without NodeRecovery: nothing to compare, no finding.
    assert rules.node_recovery_findings(_cluster("c", "None"), None) == []


def test_undeclared_value_is_never_judged() -> None:
    for live in ("Automatic", "None", None):
        assert rules.node_recovery_findings(_cluster("c"), live) == []


def test_classify_reports_node_recovery_mismatch_for_a_declared_cluster() -> None:
    inv = load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")
    name = inv.clusters[0].name
    cl = inv.cluster(name)
    declared = cl.node_recovery
    want = declared or "Automatic"
    other = "None" if want == "Automatic" else "Automatic"
    obs = rules.ClusterObservation(now=NOW, tiered_mode="Enable", tiered_percent=cl.tiered_storage.memory_percent,
                                   node_recovery=other)
    kinds = [f.kind for f in rules.classify(inv, name, obs)]
    assert ("node_recovery_mismatch" in kinds) is (declared is not None)
    obs.node_recovery = want
    assert "node_recovery_mismatch" not in [f.kind for f in rules.classify(inv, name, obs)]


def test_the_loaded_inventory_says_which_cluster_declares_node_recovery() -> None:
    """The suite's fleet writes node_recovery for some clusters only: those are reconciled and judged."""
    import yaml

    raw = yaml.safe_load((ROOT / "tests" / "fleets" / "twin.yaml").read_text())
    written = {c["name"]: c.get("node_recovery") for c in raw["clusters"]}
    inv = load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")
    assert {cl.name: cl.node_recovery for cl in inv.clusters} == written
