"""Every rejection the inventory promises, each with a message that names file, path, value and fix."""

from __future__ import annotations

import warnings

import pytest
import yaml

from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import InventoryWarning, load_inventory, parse_inventory

BASE = {
    "lobs": [{"name": "retail"}],
    "clusters": [{"name": "c1", "region": "us-east-1", "gpu_nodes": {"count": 2, "instance_type": "ml.g5.4xlarge"}}],
    "endpoints": [{"name": "chat", "namespace": "retail", "lob": "retail", "cluster": "c1", "model": "qwen2-7b",
                   "instance_type": "ml.g5.4xlarge"}],
}


def _with(mutate) -> str:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    mutate(doc)
    return yaml.safe_dump(doc)


def _problems(text: str) -> list[str]:
    with pytest.raises(InventoryError) as err:
        parse_inventory(text, source="fleet.yaml")
    return err.value.problems


def test_example_fleet_is_valid(example_fleet) -> None:  # type: ignore[no-untyped-def]
    inv = load_inventory(example_fleet)
    assert len(inv.lobs) == 3 and len(inv.clusters) == 2 and len(inv.endpoints) == 12


def test_defaults_follow_the_sources() -> None:
    inv = parse_inventory(yaml.safe_dump(BASE))
    c = inv.clusters[0]
    assert (c.memory_percent, c.node_recovery, c.tiered_storage_mode) == (20, "Automatic", "Enable")
    s = inv.settings
    assert (s.chunk_size, s.l2_url, s.serde, s.hash_seed) == (
        256, "fs://localhost:0/mnt/curvine/l2cache/", "naive", "0")


@pytest.mark.parametrize("value, bound", [(15, "below 20"), (101, "above 100")])
def test_memory_percent_outside_20_100(value: int, bound: str) -> None:
    problems = _problems(_with(lambda d: d["clusters"][0].update(tiered_storage={"memory_percent": value})))
    assert len(problems) == 1
    msg = problems[0]
    assert msg.startswith("fleet.yaml: clusters.c1.tiered_storage.memory_percent:")
    assert f"{value} is {bound}" in msg and "20–100" in msg


def test_unknown_routing_strategy() -> None:
    (msg,) = _problems(_with(lambda d: d["endpoints"][0].update(routing="prefix-aware")))
    assert "endpoints[0](chat).routing" in msg and "'prefix-aware'" in msg
    assert "prefixaware" in msg and "kvaware" in msg


def test_unknown_cluster_and_lob_are_both_reported() -> None:
    problems = _problems(_with(lambda d: d["endpoints"][0].update(cluster="nope", lob="ghost")))
    assert any("cluster: 'nope' is not a declared cluster; declared: c1" in p for p in problems)
    assert any("lob: 'ghost' is not a declared line of business; declared: retail" in p for p in problems)


def test_duplicate_endpoint_on_one_cluster() -> None:
    (msg,) = _problems(_with(lambda d: d["endpoints"].append(dict(d["endpoints"][0]))))
    assert "duplicate endpoint retail/chat on cluster c1" in msg and "endpoints[0](chat)" in msg


def test_same_name_on_two_clusters_is_fine() -> None:
    def two(d):  # type: ignore[no-untyped-def]
        d["clusters"].append({**d["clusters"][0], "name": "c2"})
        d["endpoints"].append({**d["endpoints"][0], "cluster": "c2"})

    assert len(parse_inventory(_with(two)).endpoints) == 2


@pytest.mark.parametrize("field, value, what", [
    ("name", "Chat_Bot", "Kubernetes object name"),
    ("namespace", "Retail", "Kubernetes namespace"),
    ("model", "qwen2.7b", "modelName pattern"),
    ("name", "x" * 64, "Kubernetes object name"),
])
def test_names_kubernetes_or_the_crd_would_refuse(field: str, value: str, what: str) -> None:
    problems = _problems(_with(lambda d: d["endpoints"][0].update({field: value})))
    assert any(what in p and repr(value) in p for p in problems), problems


def test_instance_type_must_start_with_ml() -> None:
    (msg,) = _problems(_with(lambda d: d["endpoints"][0].update(instance_type="g5.4xlarge")))
    assert "instance_type: 'g5.4xlarge' does not start with 'ml.'" in msg and "ml.g5.4xlarge" in msg


def test_l2_on_one_node_cluster_is_a_warning_not_an_error() -> None:
    def one_node(d):  # type: ignore[no-untyped-def]
        d["clusters"][0]["gpu_nodes"].update(count=1)
        d["endpoints"][0]["replicas"] = 1  # two would not fit one single-GPU node

    text = _with(one_node)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inv = parse_inventory(text, source="fleet.yaml")
    assert len(inv.endpoints) == 1
    assert any(issubclass(w.category, InventoryWarning) and "cross-node reuse" in str(w.message) for w in caught)


def test_all_problems_are_listed_not_only_the_first() -> None:
    def many(d):  # type: ignore[no-untyped-def]
        d["clusters"][0]["tiered_storage"] = {"memory_percent": 5}
        d["endpoints"][0].update(routing="fast", instance_type="p4d", cluster="zzz")

    assert len(_problems(_with(many))) == 4


def test_remote_url_in_endpoint_env_is_refused() -> None:
    (msg,) = _problems(_with(lambda d: d["endpoints"][0].update(env={"LMCACHE_REMOTE_URL": "fs://x/"})))
    assert "duplicate" in msg


def test_unknown_field_is_named_with_the_allowed_ones() -> None:
    (msg,) = _problems(_with(lambda d: d["clusters"][0].update(memory_pct=20)))
    assert "clusters.c1.memory_pct: unknown field" in msg and "tiered_storage" in msg


def test_garbled_yaml_is_one_clear_problem() -> None:
    (msg,) = _problems("clusters: [unclosed")
    assert msg.startswith("fleet.yaml: not valid YAML")


def test_missing_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InventoryError, match="cannot read the inventory"):
        load_inventory(tmp_path / "nope.yaml")
