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
