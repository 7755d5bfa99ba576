"""NodeRecovery in drift: a declared value the cluster does not have is a finding; an undeclared one
is never judged. Both inventory shapes are read: a ``node_recovery_declared`` flag beside a defaulted value, and
``node_recovery`` None when not declared."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kvfleet.fleet import drift as rules
from kvfleet.fleet.inventory import load_inventory

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclasses.dataclass(frozen=True)
class FlagShape:
    """The inventory shape with a flag (node_recovery defaulted to Automatic when not declared)."""

    name: str
    node_recovery: str = "Automatic"
    node_recovery_declared: bool = False


@dataclasses.dataclass(frozen=True)
class NoneShape:
    """The inventory shape where node_recovery is None when the inventory does not declare it."""

    name: str
    node_recovery: str | None = None


@pytest.mark.parametrize(("cluster", "want"), [
    (FlagShape("c"), None),
    (FlagShape("c", "None", True), "None"),
    (FlagShape("c", "Automatic", True), "Automatic"),
    (NoneShape("c"), None),
    (NoneShape("c", "None"), "None"),
])
def test_declared_node_recovery_reads_both_shapes(cluster: Any, want: str | None) -> None:
    assert rules.declared_node_recovery(cluster) == want


def test_declared_value_the_cluster_lacks_is_a_finding() -> None:
    (f,) = rules.node_recovery_findings(NoneShape("ml-prod-use1", "None"), "Automatic")  # type: ignore[arg-type]
    assert (f.kind, f.object_ref, f.field, f.expected, f.actual) == (
        "node_recovery_mismatch", "HyperPodCluster/ml-prod-use1", "NodeRecovery", "None", "Automatic")
    assert f.severity == "medium"
    assert rules.node_recovery_findings(NoneShape("c", "None"), "None") == []  # type: ignore[arg-type]
    # DescribeCluster without NodeRecovery: nothing to compare, no finding.
    assert rules.node_recovery_findings(NoneShape("c", "None"), None) == []  # type: ignore[arg-type]


def test_undeclared_value_is_never_judged() -> None:
    for live in ("Automatic", "None", None):
        assert rules.node_recovery_findings(NoneShape("c"), live) == []  # type: ignore[arg-type]
        assert rules.node_recovery_findings(FlagShape("c", "Automatic", False), live) == []  # type: ignore[arg-type]


def test_classify_reports_node_recovery_mismatch_for_a_declared_cluster() -> None:
    inv = load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")
    name = inv.clusters[0].name
    cl = inv.cluster(name)
    declared = rules.declared_node_recovery(cl)
    want = declared or "Automatic"
    other = "None" if want == "Automatic" else "Automatic"
    obs = rules.ClusterObservation(now=NOW, tiered_mode="Enable", tiered_percent=cl.memory_percent,
                                   node_recovery=other)
    kinds = [f.kind for f in rules.classify(inv, name, obs)]
    assert ("node_recovery_mismatch" in kinds) is (declared is not None)
    obs.node_recovery = want
    assert "node_recovery_mismatch" not in [f.kind for f in rules.classify(inv, name, obs)]


def test_the_loaded_inventory_says_which_cluster_declares_node_recovery() -> None:
    """The suite's fleet (fleet.example.yaml's shape) writes node_recovery for some clusters only: those are reconciled and judged."""
    import yaml

    raw = yaml.safe_load((ROOT / "tests" / "fleets" / "twin.yaml").read_text())
    written = {c["name"]: c.get("node_recovery") for c in raw["clusters"]}
    inv = load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")
    assert {cl.name: rules.declared_node_recovery(cl) for cl in inv.clusters} == written
