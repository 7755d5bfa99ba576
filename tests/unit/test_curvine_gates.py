"""The Curvine judges, pure (fleet.curvine_gates, fleet.curvine_values.flatten/values_diff): no cluster, no helm."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvfleet.errors import GateRefused, PermanentError
from kvfleet.fleet import curvine_gates as gates
from kvfleet.fleet import curvine_values as cv


def test_flatten_names_every_leaf_by_its_dotted_path() -> None:
    values = {"worker": {"replicas": 3, "storage": {"dataDirs": [{"size": "100Gi"}, {"size": "200Gi"}]}},
              "a.b": {"c": 1}, "empty": {}}
    assert cv.flatten(values) == {"worker.replicas": 3, "worker.storage.dataDirs[0].size": "100Gi",
                                  "worker.storage.dataDirs[1].size": "200Gi", "a\\.b.c": 1, "empty": {}}


def test_values_diff_shows_changed_added_and_removed_keys() -> None:
    before = {"worker": {"replicas": 3}, "master": {"replicas": 1}}
    after = {"worker": {"replicas": 4}, "fuse": {"enabled": True}}
    assert cv.values_diff(before, after).splitlines() == ["+ fuse.enabled: True", "- master.replicas: 1",
                                                          "~ worker.replicas: 3 -> 4"]
    assert cv.values_diff(before, before) == "(no value changes)"


def test_a_format_flag_left_true_refuses_with_the_fix() -> None:
    gates.refuse_flag_hazard("c-1", "curvine", {"cluster": {"formatMaster": False}}, 3, "upgrade")
    with pytest.raises(GateRefused) as err:
        gates.refuse_flag_hazard("c-1", "curvine", {"cluster": {"formatMaster": True}}, 3, "upgrade")
    text = str(err.value)
    assert text.startswith("upgrade refused on c-1: the deployed Curvine release (revision 3)")
    assert "cluster.formatMaster=true" in text and "helm upgrade curvine -n curvine --reuse-values --set " in text
    assert all(f"--set {k}=false" in text for k in cv.safe_flags())


def test_overrides_touching_a_format_flag_are_refused_and_lists_are_not_scalars() -> None:
    with pytest.raises(GateRefused, match="refused on c-1"):
        gates.refuse_flag_overrides("c-1", {"cluster": {"formatMaster": True}})
    gates.refuse_flag_overrides("c-1", {"config.log.level": "DEBUG"})
    assert gates.normalize_overrides({"worker": {"nodeSelector": {"a.b/c": "x"}}}) == {
        "worker.nodeSelector.a\\.b/c": "x"}
    with pytest.raises(PermanentError, match="is not a scalar"):
        gates.normalize_overrides({"worker.storage.dataDirs": [1, 2]})


@pytest.mark.parametrize(("before", "after", "allowance", "kept"), [(10, 10, 0, True), (10, 12, 0, True),
                                                                     (10, 9, 0, False), (10, 9, 1, True),
                                                                     (10, 0, 0, False), (10, 9, -5, False)])
def test_metadata_preserved(before: int, after: int, allowance: int, kept: bool) -> None:
    assert gates.metadata_preserved({"files_total": before}, {"files_total": after}, allowance) is kept


def test_the_gates_import_no_other_kvfleet_layer() -> None:
    for module in (gates, cv):
        tree = ast.parse(Path(str(module.__file__)).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        kvfleet = {m for m in imported if m.startswith("kvfleet")}
        assert all(m.startswith("kvfleet.fleet") or m == "kvfleet.errors" for m in kvfleet), kvfleet


def _sts(node_selector: dict[str, str] | None) -> dict[str, object]:
    pod: dict[str, object] = {"containers": [{"name": "worker", "args": []}]}
    if node_selector is not None:
        pod["nodeSelector"] = node_selector
    return {"kind": "StatefulSet", "metadata": {"name": "curvine-worker"},
            "spec": {"template": {"spec": pod}}}


def test_a_render_with_no_objects_or_a_flag_is_refused() -> None:
    with pytest.raises(GateRefused, match="rendered no objects"):
        gates.refuse_rendered_flags("c-1", [], "upgrade", "helm upgrade --dry-run=server")
    flagged = {"kind": "ConfigMap", "metadata": {"name": "curvine-config"},
               "data": {"curvine-cluster.toml": "format_master = true\n"}}
    with pytest.raises(GateRefused, match="upgrade refused on c-1 before any change"):
        gates.refuse_rendered_flags("c-1", [flagged], "upgrade", "helm upgrade --dry-run=server")
    ok = gates.refuse_rendered_flags("c-1", [_sts(None)], "upgrade", "render")
    assert ok == {"rendered": "render", "objects": 1, "kinds": ["StatefulSet/curvine-worker"], "format_findings": []}


def test_unpinned_workers_are_refused() -> None:
    with pytest.raises(GateRefused, match="does not pin the workers"):
        gates.refuse_unpinned_workers("c-1", [_sts(None)])


def test_requested_workers_never_exceed_the_eligible_nodes() -> None:
    nodes = ["n-1", "n-2"]
    assert gates.requested_workers("c-1", 2, all_eligible=False, eligible=nodes, ineligible={}) == 2
    assert gates.requested_workers("c-1", None, all_eligible=True, eligible=nodes, ineligible={}) == 2
    assert gates.requested_workers("c-1", None, all_eligible=True, eligible=[], ineligible={}) == 1
    with pytest.raises(GateRefused, match=r"3 workers asked, but only 2 node\(s\).*n-3: not a GPU node"):
        gates.requested_workers("c-1", 3, all_eligible=False, eligible=nodes, ineligible={"n-3": "not a GPU node"})
    with pytest.raises(PermanentError, match="at least 1"):
        gates.requested_workers("c-1", 0, all_eligible=False, eligible=nodes, ineligible={})
    with pytest.raises(PermanentError, match="target_workers"):
        gates.requested_workers("c-1", None, all_eligible=False, eligible=nodes, ineligible={})


def test_a_scale_out_is_due_for_an_idle_node_or_sustained_usage_only() -> None:
    base = {"replicas": 2, "eligible": 3, "threshold": 0.8}
    idle = gates.scale_out_due(**base, nodes_without_worker=["n-3"], usage=0.1, previous_usage=None)  # type: ignore[arg-type]
    assert idle["due"] and idle["target"] == 3
    spike = gates.scale_out_due(**base, nodes_without_worker=[], usage=0.9, previous_usage=0.5)  # type: ignore[arg-type]
    assert not spike["due"] and spike["target"] == 2
    sustained = gates.scale_out_due(**base, nodes_without_worker=[], usage=0.9, previous_usage=0.85)  # type: ignore[arg-type]
    assert sustained["due"] and "above 80%" in sustained["reasons"][0]
    full = gates.scale_out_due(replicas=3, eligible=3, nodes_without_worker=[], usage=0.9, previous_usage=None,
                               threshold=0.8)
    assert not full["due"] and "add GPU nodes" in full["reasons"][-1]
