"""Inventory fields from the sources: per-LOB notify targets, instance prices, and the sources' defaults and checks."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import parse_inventory

BASE = {
    "lobs": [{"name": "retail"}],
    "clusters": [{"name": "c1", "region": "us-east-1", "gpu_nodes": {"count": 2, "instance_type": "ml.g5.4xlarge"}}],
    "endpoints": [{"name": "chat", "namespace": "retail", "lob": "retail", "cluster": "c1", "model": "qwen2-7b",
                   "instance_type": "ml.g5.4xlarge"}],
}
TOPIC = "arn:aws:sns:us-east-1:123456789012:kvfleet-retail"


def _with(mutate) -> str:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    mutate(doc)
    return yaml.safe_dump(doc)


def _problems(text: str) -> list[str]:
    with pytest.raises(InventoryError) as err:
        parse_inventory(text, source="fleet.yaml")
    return err.value.problems


def _parse(text: str):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_inventory(text, source="fleet.yaml")


# --- notify (per LOB) ----------------------------------------------------------------------------------------

def test_notify_is_optional_and_parsed() -> None:
    assert _parse(yaml.safe_dump(BASE)).lob("retail").notify.sns_topic_arn is None
    inv = _parse(_with(lambda d: d["lobs"][0].update(
        notify={"sns_topic_arn": TOPIC, "webhook_url": "https://hooks.example.com/kvfleet"})))
    lob = inv.lob("retail")
    assert (lob.notify.sns_topic_arn, lob.notify.webhook_url) == (TOPIC, "https://hooks.example.com/kvfleet")
    def private_hook(d: dict[str, Any]) -> None:
        d["lobs"][0].update(notify={"webhook_url": "http://10.0.0.5:8080/h"})
        d["settings"] = {"webhook_private_ranges": ["10.0.0.0/24"]}  # a private target, allowed explicitly

    only_hook = _parse(_with(private_hook))
    assert only_hook.lob("retail").notify.sns_topic_arn is None
    assert only_hook.lob("retail").notify.webhook_url == "http://10.0.0.5:8080/h"


@pytest.mark.parametrize("arn", ["arn:aws:sqs:us-east-1:123456789012:q", "arn:aws:sns:us-east-1:1234:t",
                                 "kvfleet-retail", "arn:aws:sns:us-east-1:123456789012:bad name"])
def test_notify_topic_must_be_an_sns_topic_arn(arn: str) -> None:
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify={"sns_topic_arn": arn})))
    assert msg.startswith("fleet.yaml: lobs.retail.notify.sns_topic_arn:")
    assert "not an SNS topic ARN" in msg and "arn:aws:sns:" in msg


@pytest.mark.parametrize("url", ["ftp://files.example.com/hook", "hooks.example.com/x", "https:///nohost",
                                 "https://h:99999/x", "https://h/x y"])
def test_notify_webhook_must_be_http_or_https(url: str) -> None:
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify={"webhook_url": url})))
    assert msg.startswith("fleet.yaml: lobs.retail.notify.webhook_url:") and "http(s) URL" in msg
    assert "https://hooks.example.com/kvfleet" in msg  # the fix


def test_notify_webhook_path_is_not_echoed() -> None:
    """A webhook's path is often its secret (a token): the message shows scheme and host only."""
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify={"webhook_url": "gopher://h/T0KEN-SECRET"})))
    assert "T0KEN-SECRET" not in msg and "gopher://h/" in msg


def test_notify_unknown_key_and_wrong_type() -> None:
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify={"email": "a@b"})))
    assert "lobs.retail.notify.email: unknown field" in msg and "sns_topic_arn, webhook_url" in msg
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify=["x"])))
    assert "lobs.retail.notify: expected a mapping" in msg


# --- prices (top level) --------------------------------------------------------------------------------------

def test_prices_optional_and_parsed() -> None:
    assert dict(_parse(yaml.safe_dump(BASE)).prices) == {}
    inv = _parse(_with(lambda d: d.update(prices={"ml.g6e.4xlarge": 1.861, "ml.g5.4xlarge": 2})))
    assert dict(inv.prices) == {"ml.g6e.4xlarge": 1.861, "ml.g5.4xlarge": 2.0}
    assert isinstance(inv.prices["ml.g5.4xlarge"], float)
    assert dict(inv.select(clusters=["c1"]).prices) == dict(inv.prices)  # narrowing keeps them


@pytest.mark.parametrize("key, value, words", [
    ("g6e.4xlarge", 1.0, "not a SageMaker instance type"),
    ("ml.g6e.4xlarge", 0, "above 0"),
    ("ml.g6e.4xlarge", -2.5, "above 0"),
    ("ml.g6e.4xlarge", "1.86", "not a price"),
    ("ml.g6e.4xlarge", True, "not a price"),
    ("ml.g6e.4xlarge", float("inf"), "above 0 and at most"),
    ("ml.g6e.4xlarge", 1e9, "at most 10000"),
])
def test_prices_refused(key: str, value: object, words: str) -> None:
    (msg,) = _problems(_with(lambda d: d.update(prices={key: value})))
    assert msg.startswith(f"fleet.yaml: prices.{key}:") and words in msg


def test_prices_must_be_a_mapping() -> None:
    (msg,) = _problems(_with(lambda d: d.update(prices=[1.0])))
    assert msg.startswith("fleet.yaml: prices: expected a mapping")


def _warned(text: str) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inv = parse_inventory(text, source="fleet.yaml")
    return inv, [str(w.message) for w in caught]


# --- l2_injection: auto --------------------------------------------------------------------------------------

def test_auto_is_the_default_kyverno_on_production_patch_elsewhere() -> None:
    inv, _ = _warned(_with(lambda d: d["clusters"][0].update(production=True)))
    c = inv.clusters[0]  # type: ignore[attr-defined]
    assert (c.l2_injection_asked, c.l2_injection) == ("auto", "kyverno")
    assert c.l2_injection_reason.startswith("auto: production cluster → kyverno")
    plain = parse_inventory(yaml.safe_dump(BASE)).clusters[0]
    assert (plain.l2_injection_asked, plain.l2_injection) == ("auto", "patch")
    assert plain.l2_injection_reason.startswith("auto: not a production cluster → patch")


@pytest.mark.parametrize("asked", ["patch", "kyverno"])
def test_an_explicit_mode_wins_over_auto(asked: str) -> None:
    inv, _ = _warned(_with(lambda d: d["clusters"][0].update(production=True, l2_injection=asked)))
    c = inv.clusters[0]  # type: ignore[attr-defined]
    assert (c.l2_injection_asked, c.l2_injection, c.l2_injection_reason) == (asked, asked, f"asked (l2_injection: {asked})")


def test_patch_on_a_production_cluster_is_a_warning() -> None:
    _, said = _warned(_with(lambda d: d["clusters"][0].update(production=True, l2_injection="patch")))
    (w,) = [m for m in said if "l2_injection" in m]
    assert w.startswith("fleet.yaml: clusters.c1.l2_injection: patch on a production cluster")
    assert "Kyverno ClusterPolicy" in w and "l2_injection: kyverno" in w
    _, quiet = _warned(_with(lambda d: d["clusters"][0].update(l2_injection="patch")))  # not production: fine
    assert not [m for m in quiet if "l2_injection" in m]


def test_unknown_l2_mode_names_auto_too() -> None:
    (msg,) = _problems(_with(lambda d: d["clusters"][0].update(l2_injection="webhook")))
    assert "clusters.c1.l2_injection" in msg and "auto, kyverno, patch" in msg


# --- one Curvine worker per GPU node -------------------------------------------------------------------------

def test_workers_default_to_the_gpu_node_count() -> None:
    inv = _parse(_with(lambda d: d["clusters"][0]["gpu_nodes"].update(count=5)))
    cluster = inv.clusters[0]
    assert (cluster.curvine_workers, cluster.curvine.worker.replicas) == (5, None)  # None: not declared
    assert cluster.curvine.worker.capacity(cluster.curvine_workers) == "100Gi × 5 = 500Gi"


@pytest.mark.parametrize("workers, words", [(2, "is below the cluster's 5 GPU nodes"),
                                            (7, "is above the cluster's 5 GPU nodes")])
def test_an_explicit_worker_count_is_an_override_warned_when_it_differs(workers: int, words: str) -> None:
    inv, said = _warned(_with(lambda d: (d["clusters"][0]["gpu_nodes"].update(count=5),
                                         d["clusters"][0].update(curvine={"worker": {"replicas": workers}}))))
    assert inv.clusters[0].curvine_workers == workers
    (w,) = [m for m in said if "worker.replicas" in m]
    assert w.startswith(f"fleet.yaml: clusters.c1.curvine.worker.replicas: {workers} {words}")
    assert "set it to 5" in w
    _, quiet = _warned(_with(lambda d: (d["clusters"][0]["gpu_nodes"].update(count=5),
                                        d["clusters"][0].update(curvine={"worker": {"replicas": 5}}))))
    assert not [m for m in quiet if "worker.replicas" in m]


# --- node_recovery -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["Automatic", "None"])
def test_node_recovery_declared(value: str) -> None:
    c = _parse(_with(lambda d: d["clusters"][0].update(node_recovery=value))).clusters[0]
    assert c.node_recovery == value


def test_node_recovery_not_declared_is_none() -> None:
    c = _parse(yaml.safe_dump(BASE)).clusters[0]
    assert c.node_recovery is None


def test_unquoted_none_in_yaml_is_the_string_none() -> None:
    text = yaml.safe_dump(BASE).replace("region: us-east-1", "region: us-east-1\n  node_recovery: None")
    assert _parse(text).clusters[0].node_recovery == "None"


@pytest.mark.parametrize("value, words", [("automatic", "is not one of Automatic, None"),
                                          (True, "is not one of Automatic, None"),
                                          (None, "is null")])
def test_node_recovery_refused(value: object, words: str) -> None:
    (msg,) = _problems(_with(lambda d: d["clusters"][0].update(node_recovery=value)))
    assert msg.startswith("fleet.yaml: clusters.c1.node_recovery:") and words in msg
    assert "remove the key to keep the cluster's live value" in msg


# --- models that fit, and hash_seed --------------------------------------------------------------------------

G6E = {"name": "c1", "region": "us-east-1", "gpu_nodes": {"count": 2, "instance_type": "ml.g6e.4xlarge"}}


def _on_g6e(**ep: object) -> str:
    return _with(lambda d: (d["clusters"].__setitem__(0, dict(G6E)),
                            d["endpoints"][0].update(instance_type="ml.g6e.4xlarge", **ep)))


def test_a_32b_model_on_one_48gb_gpu_is_refused_naming_both_memories() -> None:
    """The sources' own example: a 32B model in bf16 (~64 GB of weights) does not fit one 48 GB GPU."""
    problems = _problems(_on_g6e(model="qwen2-5-32b-instruct"))
    (msg,) = problems
    assert msg.startswith("fleet.yaml: endpoints[0](chat).model: qwen2.5-32b-instruct (32.76 B parameters, bf16")
    assert "needs 61.0 GiB (65.5 GB)" in msg and "48 GiB per replica" in msg and "ml.g6e.4xlarge" in msg
    assert "p5" in msg  # the fix names instance families whose GPU holds it


def test_the_dotted_catalogue_name_is_refused_with_a_valid_spelling_then_its_size() -> None:
    """`qwen2.5-32b-instruct` breaks the CRD's modelName pattern: refused with a valid spelling of the same catalogue
    model (the endpoint is left out of the size check until then); that spelling is refused for its size."""
    (problem,) = _problems(_on_g6e(model="qwen2.5-32b-instruct"))
    assert "modelName pattern" in problem and "e.g. qwen2-5-32b-instruct" in problem
    assert "left out of the checks across objects" in problem
    (problem,) = _problems(_on_g6e(model="qwen2-5-32b-instruct"))
    assert "needs 61.0 GiB" in problem and "48 GiB per replica" in problem


def test_a_7b_model_fits_and_the_plan_shows_its_kv_room() -> None:
    from kvfleet.fleet.plan import make_plan, render_plan_text

    inv = _parse(_on_g6e(model="qwen2-7b-instruct"))
    ep = inv.endpoints[0]
    assert (ep.size.catalogue_model, ep.size.params_b, ep.size.dtype) == ("qwen2-7b-instruct", 7.62, "bf16")
    assert (ep.model_params_b, ep.dtype) == (None, None)  # what the file declares
    plan = make_plan(inv, canary=False)
    (fit,) = [e["model_fit"] for w in plan.as_dict()["clusters"][0]["waves"] for e in w["endpoints"]]
    # the seed: "um modelo de 7B em bf16 usa cerca de 14 GB para pesos, deixando mais de 30 GB para blocos KV"
    assert fit["weights_gib"] == 14.2 and fit["gpu_memory_gib"] == 48 and fit["kv_room_gib"] == 33.8 > 30
    assert fit["kv_room_usable_gib"] == 29.0 and fit["kv_tokens"] > 500_000
    assert "KV room 33.8 GiB after the weights" in render_plan_text(plan)


def test_explicit_params_and_dtype() -> None:
    inv = _parse(_on_g6e(model="my-model", model_params_b=13, dtype="fp16"))
    size = inv.endpoints[0].size
    assert (size.params_b, size.dtype, size.catalogue_model) == (13.0, "fp16", None)
    (msg,) = _problems(_on_g6e(model="my-model", model_params_b=30, dtype="bf16"))
    assert msg.startswith("fleet.yaml: endpoints[0](chat).model_params_b: a 30 B-parameter model in bf16 needs")
    assert _parse(_on_g6e(model="my-model", model_params_b=30, dtype="fp8")).endpoints[0].size.dtype == "fp8"  # fits


def test_a_smaller_dtype_makes_a_catalogue_model_fit() -> None:
    inv = _parse(_on_g6e(model="qwen2-5-32b-instruct", dtype="fp8", model_id="Qwen/Qwen2.5-32B-Instruct"))
    assert (inv.endpoints[0].size.params_b, inv.endpoints[0].size.dtype) == (32.76, "fp8")


@pytest.mark.parametrize("extra, field, words", [
    ({"model_params_b": 13}, "dtype", "is required with model_params_b"),
    ({"model_params_b": 0, "dtype": "bf16"}, "model_params_b", "above 0"),
    ({"model_params_b": "7B", "dtype": "bf16"}, "model_params_b", "not a number"),
    ({"model_params_b": 7, "dtype": "bfloat16"}, "dtype", "is not one of"),
])
def test_explicit_size_refused(extra: dict[str, object], field: str, words: str) -> None:
    msgs = _problems(_on_g6e(model="my-model", model_id="acme/my-model", **extra))
    assert any(m.startswith(f"fleet.yaml: endpoints[0](chat).{field}:") and words in m for m in msgs), msgs


def test_an_unknown_model_is_a_warning_not_a_guess() -> None:
    inv, said = _warned(_on_g6e(model="mystery", model_id="acme/mystery-70b"))
    assert inv.endpoints[0].size.params_b is None
    assert any("is not in kvfleet's model catalogue" in m and "model_params_b" in m for m in said)


def test_model_and_model_id_naming_different_catalogue_models_is_a_warning() -> None:
    _, said = _warned(_on_g6e(model="llama-3-8b-instruct"))  # model_id left at its default, Qwen2-7B
    assert any("endpoints[0](chat).model" in m and "model_id (the default)" in m
               and "Set model_id: meta-llama/Meta-Llama-3-8B-Instruct" in m for m in said)


@pytest.mark.parametrize("seed", ["random", "4294967296", "-1", "0x10"])
def test_hash_seed_outside_pythonhashseed_is_refused_with_the_range(seed: str) -> None:
    (msg,) = _problems(_with(lambda d: d.update(settings={"hash_seed": seed})))
    assert msg.startswith("fleet.yaml: settings.hash_seed:") and "0–4294967295" in msg and 'use "0"' in msg


def test_hash_seed_bounds_accepted() -> None:
    assert _parse(_with(lambda d: d.update(settings={"hash_seed": "4294967295"}))).settings.hash_seed == "4294967295"
    assert _parse(_with(lambda d: d.update(settings={"hash_seed": 0}))).settings.hash_seed == "0"


# --- routing that matches the workload -----------------------------------------------------------------------

@pytest.mark.parametrize("workload, good, bad", [
    ("multi-turn", "prefixaware", "session"),
    ("system-prompt", "prefixaware", "roundrobin"),
    ("long-document", "kvaware", "prefixaware"),
    ("batch", "roundrobin", "kvaware"),
    ("rag", "kvaware", "roundrobin"),
])
def test_routing_that_contradicts_the_workload_is_a_warning(workload: str, good: str, bad: str) -> None:
    inv, quiet = _warned(_with(lambda d: d["endpoints"][0].update(workload=workload, routing=good)))
    assert inv.endpoints[0].workload == workload  # type: ignore[attr-defined]
    assert not [m for m in quiet if ".routing" in m]
    _, said = _warned(_with(lambda d: d["endpoints"][0].update(workload=workload, routing=bad)))
    (w,) = [m for m in said if ".routing" in m]
    assert w.startswith(f"fleet.yaml: endpoints[0](chat).routing: {bad} for workload {workload}")
    assert f"Set routing: {good}" in w or f"or {good}" in w


def test_unknown_workload_is_refused() -> None:
    (msg,) = _problems(_with(lambda d: d["endpoints"][0].update(workload="chat")))
    assert "endpoints[0](chat).workload" in msg and "multi-turn" in msg and "long-document" in msg


# --- the plan records the reasons ----------------------------------------------------------------------------

def test_a_production_cluster_plans_kyverno_with_the_reason() -> None:
    from kvfleet.fleet.plan import make_plan, render_plan_text

    inv = _parse(_with(lambda d: d["clusters"][0].update(production=True)))
    plan = make_plan(inv)
    c = plan.as_dict()["clusters"][0]
    assert c["l2_injection"]["mode"] == "kyverno" and c["l2_injection"]["why"].startswith("auto: production")
    assert c["curvine"] == {"workers": 2, "why": "default: one per GPU node (2 nodes)",
                            "capacity": "100Gi × 2 = 200Gi"}
    text = render_plan_text(plan)
    assert "L2 injection: kyverno — auto: production cluster → kyverno" in text
    assert "L2 capacity 100Gi × 2 = 200Gi" in text


def test_the_example_fleet_follows_the_sources() -> None:
    """fleet.example.yaml (the demo's fleet) follows the sources: it routes by workload as they advise, its production
    cluster plans kyverno (auto) and Curvine runs one worker per GPU node; validate has nothing to warn about."""
    from kvfleet.fleet.inventory import load_inventory

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inv = load_inventory(Path(__file__).resolve().parents[2] / "fleet.example.yaml")
    said = [str(w.message) for w in caught]
    assert all(e.workload for e in inv.endpoints) and said == []
    assert inv.cluster("ml-prod-use1").l2_injection == "kyverno"
    assert [(c.name, c.curvine_workers) for c in inv.clusters] == [("ml-prod-use1", 16), ("ml-stage-usw2", 12)]
    assert [e.size.catalogue_model for e in inv.endpoints] == ["qwen2-7b-instruct"] * 12
    assert inv.lob("support").notify.sns_topic_arn and inv.prices


# --- acceptance through the real CLI -------------------------------------------------------------------------

def _validate(tmp_path, doc: dict) -> subprocess.CompletedProcess[str]:  # type: ignore[type-arg,no-untyped-def]
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(doc))
    plugins = str(Path(__file__).resolve().parents[2] / "plugins")
    env = {**os.environ, "PYTHONPATH": plugins + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "kvfleet.cli", "validate", "--fleet", str(fleet)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_cli_validate_refuses_the_32b_model_on_one_g6e_gpu_and_hash_seed_random(tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load(_on_g6e(model="qwen2-5-32b-instruct"))
    doc["settings"] = {"hash_seed": "random"}
    proc = _validate(tmp_path, doc)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    err = proc.stderr
    assert "endpoints[0](chat).model: qwen2.5-32b-instruct (32.76 B parameters, bf16, catalogue) needs 61.0 GiB" in err, err
    assert "ml.g6e.4xlarge gets 1 × NVIDIA L40S 48 GiB = 48 GiB per replica" in err
    assert "settings.hash_seed: 'random' is not an integer string in 0–4294967295" in err


def test_cli_validate_warns_about_patch_on_production_and_exits_0(tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load(_with(lambda d: d["clusters"][0].update(production=True, l2_injection="patch")))
    proc = _validate(tmp_path, doc)
    assert proc.returncode == 0, proc.stderr
    assert "warning: fleet.yaml: clusters.c1.l2_injection: patch on a production cluster" in proc.stderr
    assert "1 warning(s) on stderr" in proc.stdout


@pytest.mark.parametrize("extra, mode", [({"production": True}, "kyverno"), ({}, "patch"),
                                         ({"production": True, "l2_injection": "patch"}, "patch"),
                                         ({"l2_injection": "kyverno"}, "kyverno")])
def test_the_twin_resolves_auto_as_the_inventory_does(extra: dict[str, object], mode: str) -> None:
    """The twin reads the fleet itself (it may import only fleet.constants): its mode must be kvfleet's."""
    from kvfleet_sandbox.fleet_reader import parse_fleet

    text = _with(lambda d: d["clusters"][0].update(extra))
    assert parse_fleet(text).clusters[0].l2_injection == mode == _parse(text).clusters[0].l2_injection
