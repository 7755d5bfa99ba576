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
    # node_recovery not declared: None, so stage 1 keeps the cluster's live value
    assert (c.tiered_storage.memory_percent, c.node_recovery, c.tiered_storage.mode) == (20, None, "Enable")
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


def test_an_object_with_a_bad_field_is_left_out_of_the_checks_across_objects_and_says_so() -> None:
    """A bad field inside an object (Curvine's namespace, an endpoint's model) leaves that object out of the checks
    across objects (GPU capacity, the host-path prefix, the model's fit): no made-up value stands in for the bad
    one, and the object's first problem says so. References are still read from the document as written."""
    def many(d):  # type: ignore[no-untyped-def]
        d["clusters"][0]["curvine"] = {"namespace": "kube-system", "worker": {"host_path": "/etc/x"}}
        d["endpoints"][0].update(replicas=5, model="qwen2.5-32b-instruct", cluster="c1")
        d["endpoints"].append({**d["endpoints"][0], "name": "other", "cluster": "zzz", "replicas": "2", "model": "qwen2-7b"})

    problems = _problems(_with(many))
    paths = sorted(p.split(": ")[1] for p in problems)
    assert paths == ["clusters.c1.curvine.namespace", "endpoints[0](chat).model", "endpoints[1](other).cluster",
                     "endpoints[1](other).replicas"], paths
    left_out = [p for p in problems if "left out of the checks across objects until this is fixed" in p]
    assert sorted(p.split(": ")[1] for p in left_out) == ["clusters.c1.curvine.namespace", "endpoints[0](chat).model",
                                                          "endpoints[1](other).replicas"], left_out
    # with the fields fixed, the checks across objects run on them again
    def fixed(d):  # type: ignore[no-untyped-def]
        d["clusters"][0]["curvine"] = {"worker": {"host_path": "/etc/x"}}
        d["endpoints"][0].update(replicas=5, model="qwen2-5-32b-instruct", cluster="c1")

    paths = sorted(p.split(": ")[1] for p in _problems(_with(fixed)))
    assert paths == ["clusters.c1.curvine.worker.host_path", "clusters.c1.gpu_nodes", "endpoints[0](chat).model"], paths


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


def test_gpu_overcommit_names_the_cluster_and_the_gpus() -> None:
    # the case: 3 endpoints × 2 replicas on 4 single-GPU nodes
    def three(d):  # type: ignore[no-untyped-def]
        d["clusters"][0]["gpu_nodes"]["count"] = 4
        d["endpoints"] += [{**d["endpoints"][0], "name": f"chat{i}"} for i in (2, 3)]

    (msg,) = _problems(_with(three))
    assert "clusters.c1.gpu_nodes: GPU overcommit" in msg and "need 6 GPUs" in msg and "have 4 GPUs" in msg


@pytest.mark.parametrize("seed", ["random", "-1", "4294967296", "1.5"])
def test_hash_seed_must_be_an_integer_string(seed: str) -> None:
    (msg,) = _problems(_with(lambda d: d.update(settings={"hash_seed": seed})))
    assert "settings.hash_seed" in msg and "0–4294967295" in msg


def test_same_endpoint_name_in_two_namespaces_on_one_cluster() -> None:
    def two(d):  # type: ignore[no-untyped-def]
        d["clusters"][0]["gpu_nodes"]["count"] = 4
        d["endpoints"].append({**d["endpoints"][0], "namespace": "other"})

    (msg,) = _problems(_with(two))
    assert "endpointName" in msg and "SageMaker endpoint" in msg


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d["endpoints"][0].update(env={"A-B": "1"}), "not an environment variable name"),
    (lambda d: d["endpoints"][0].update(env={"PYTHONHASHSEED": "random"}), "settings.hash_seed"),
    (lambda d: d["clusters"][0].update(curvine={"worker": {"host_path": "/opt/../etc"}}), "'..'"),
    (lambda d: d["clusters"][0].update(curvine={"worker": {"host_path": "/a,b"}}), "--set"),
    (lambda d: d["clusters"][0].update(ebs_storage_class="EBS_sc"), "DNS-1123"),
    (lambda d: d["clusters"][0].update(curvine={"repo_url": "http://charts.example.com"}), "plain http"),
    (lambda d: d["clusters"][0].update(curvine={"version": "latest"}), "SemVer"),
    (lambda d: d["endpoints"][0].update(image="Bad Image"), "image reference"),
])
def test_syntax_checks(mutate, words: str) -> None:  # type: ignore[no-untyped-def]
    problems = _problems(_with(mutate))
    assert any(words in p for p in problems), problems


def test_http_repo_allowed_explicitly() -> None:
    inv = parse_inventory(_with(lambda d: d["clusters"][0].update(
        curvine={"repo_url": "http://charts.internal", "allow_insecure_repo": True})))
    assert inv.clusters[0].curvine.repo_url == "http://charts.internal"


@pytest.mark.parametrize("text, words", [
    ("lobs: [{name: a}]\nlobs: [{name: b}]\n", "duplicate key 'lobs'"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n", "alias bomb"),
    ("x: &r [*r]\n", "alias to itself"),
    ("x: " + "[" * 100 + "]" * 100 + "\n", "nested more than"),
])
def test_yaml_bounds(text: str, words: str) -> None:
    (msg,) = _problems(text)
    assert "not valid YAML" in msg and words in msg


def test_duplicate_lob_in_a_list() -> None:
    problems = _problems(_with(lambda d: d["lobs"].append({"name": "retail"})))
    assert any("duplicate line of business 'retail'" in p for p in problems)


def test_non_regular_files_and_size_are_refused_before_reading(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for path, words in (("/dev/zero", "a device"), (str(tmp_path), "a directory")):
        with pytest.raises(InventoryError, match=words):
            load_inventory(path)
    big = tmp_path / "big.yaml"
    big.write_text("#" * (4 * 1024 * 1024 + 1))
    with pytest.raises(InventoryError, match="4 MiB"):
        load_inventory(big)


def test_a_name_with_a_trailing_newline_is_refused() -> None:
    # found by the long fuzz run: `$` alone matches before a final "\n", so "chat\n" passed as a cluster name
    problems = _problems(_with(lambda d: d["clusters"][0].update(name="c1\n")))
    assert any("clusters.c1\n.name" in p and "HyperPod cluster name" in p for p in problems), problems
