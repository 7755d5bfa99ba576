"""The sandbox's scheduler breaks ties the way a real one may, deterministically, and never lets that override a
filter or a score (facts: tests/conformance/facts/kube_scheduler.yaml).

kube-scheduler draws at random among the best-scored nodes and remembers nothing of a pod's predecessor; the twin
takes, among the nodes it judges equally good, the one the pod's name last ran on, then the first by name. The real
Curvine chart pins its workers to no node (a hostPath volume keeps the data on the node, not the pod): checked on
the local copy of curvine-helm when present.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet_sandbox.controllers._scheduling import NodeSlot, choose

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "kube_scheduler.yaml").read_text())
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_UPSTREAM = ROOT.parent / "shared" / "reference" / "upstream" / "curvine-helm"
NODES = ("node-a", "node-b", "node-c", "node-d")
WORKER = {"app.kubernetes.io/name": "curvine", "app.kubernetes.io/component": "worker"}
HYPERPOD = {"sagemaker.amazonaws.com/compute-type": "hyperpod"}


def _slots(**changes: dict[str, Any]) -> dict[str, NodeSlot]:
    """Four equal, empty, Ready GPU nodes; ``changes`` sets fields of some (``node_b={"pods": 1}``)."""
    slots = {}
    for name in NODES:
        slot = NodeSlot(name=name, labels={"kubernetes.io/hostname": name, **HYPERPOD}, ready=True, lost=False,
                        cordoned=False, taints=[], gpus=1, ip="10.0.0.1")
        for key, value in changes.get(name.replace("-", "_"), {}).items():
            setattr(slot, key, value)
        slots[name] = slot
    return slots


def _worker_spec(anti: str = "required") -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": WORKER}, "topologyKey": "kubernetes.io/hostname"}
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": [term]} if anti == "required" else {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}
    return {"nodeSelector": HYPERPOD, "affinity": {"podAntiAffinity": affinity},
            "containers": [{"name": "worker", "image": "curvine:v1"}]}


def _chosen(slots: dict[str, NodeSlot], spec: dict[str, Any], previous: str | None) -> str | None:
    target, _ = choose(slots, spec, "curvine", previous)
    return target.name if target else None


def test_the_facts_say_a_real_scheduler_draws_among_ties_and_remembers_nothing() -> None:
    assert FACTS["tie_break"]["random_among_equal_scores"] is True
    assert FACTS["tie_break"]["remembers_previous_node"] is False
    assert FACTS["replacement_pod"]["same_name"] is True
    assert FACTS["replacement_pod"]["node_name_set_by_controller"] is False
    assert FACTS["twin"]["tie_break"][0].startswith("previous node")


def test_among_equal_nodes_the_previous_one_wins_then_the_first_by_name() -> None:
    spec = _worker_spec()
    assert _chosen(_slots(), spec, None) == "node-a"
    for previous in NODES:  # every draw a real scheduler could make among four equal nodes
        assert _chosen(_slots(), spec, previous) == previous
    assert _chosen(_slots(), spec, "node-gone") == "node-a"  # a node that no longer exists is just not there


def test_the_previous_node_never_overrides_a_filter_or_a_better_score() -> None:
    spec, previous = _worker_spec(), "node-a"
    worker_there = {"pod_labels": [("curvine", WORKER)], "pods": 1}
    for changed in ({"lost": True, "ready": False},  # lost: its pods are gone, the replacement goes elsewhere
                    {"ready": False},
                    {"cordoned": True},
                    {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]},
                    {"labels": {"kubernetes.io/hostname": "node-a"}},  # no compute-type label: nodeSelector
                    worker_there,  # another worker: required anti-affinity
                    {"pods": 1},  # more loaded than the others
                    {"gpus_used": 1.0}):
        assert _chosen(_slots(node_a=changed), spec, previous) == "node-b", changed
    # Preferred anti-affinity ranks before the tie-break too, and with every node holding a worker it is a tie again.
    assert _chosen(_slots(node_a=worker_there), _worker_spec("preferred"), previous) == "node-b"
    everywhere = {name.replace("-", "_"): worker_there for name in NODES}
    assert _chosen(_slots(**everywhere), _worker_spec("preferred"), "node-c") == "node-c"
    assert _chosen(_slots(**everywhere), spec, previous) is None  # required: nowhere to go, as before


def test_a_restarted_worker_keeps_its_node_whatever_its_pass_scheduled_before_it() -> None:
    """The race of tests/integration/test_rbac_iam_coverage.py: the Curvine master (no anti-affinity against the
    workers) and worker-1 are replaced in one pass, master first. With the ties broken by name only, the master took
    worker-1's node (it sorts first) and pushed worker-1 to the master's old node, where its hostPath held nothing.
    Whichever order the pass schedules them in, each now goes back to its own node."""
    master_spec = {"nodeSelector": HYPERPOD, "containers": [{"name": "master", "image": "curvine:v1"}]}
    worker0 = {"pod_labels": [("curvine", WORKER)], "pods": 1}
    for order in (("master", "worker"), ("worker", "master")):
        slots = _slots(node_a=worker0)  # worker-0 on node-a; worker-1 (node-b) and the master (node-c) replaced
        placed = {}
        for pod in order:
            spec, previous = (master_spec, "node-c") if pod == "master" else (_worker_spec(), "node-b")
            target, _ = choose(slots, spec, "curvine", previous)
            assert target is not None
            target.pods += 1
            if pod == "worker":
                target.pod_labels.append(("curvine", WORKER))
            placed[pod] = target.name
        assert placed == {"master": "node-c", "worker": "node-b"}, order


def _upstream() -> Path:
    path = Path(os.environ.get("KVFLEET_UPSTREAM_CURVINE_HELM") or DEFAULT_UPSTREAM)
    if not (path / "curvine-runtime" / "templates" / "worker-statefulset.yaml").exists():
        pytest.skip(f"no local copy of CurvineIO/curvine-helm at {path} (set KVFLEET_UPSTREAM_CURVINE_HELM)")
    return path


def test_the_real_chart_pins_its_workers_to_no_node() -> None:
    facts = FACTS["curvine_worker_placement"]
    text = (_upstream() / facts["source"]["path"]).read_text()
    assert f"kind: {facts['kind']}" in text
    assert f"podManagementPolicy: {facts['pod_management_policy']}" in text
    assert f"type: {facts['update_strategy']}" in text
    assert "hostPath:" in text and f"type: {facts['host_path_type']}" in text
    assert facts["pins_to_a_node"] is False
    assert "nodeName" not in text and "nodeAffinity" not in text  # only worker.nodeSelector / worker.affinity
