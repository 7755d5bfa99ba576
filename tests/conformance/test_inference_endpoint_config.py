"""Conformance: the InferenceEndpointConfig CRD's immutability notes (facts/inference_endpoint_config.yaml) are in
the CRD the twin serves, and kvfleet's stage-4 rules (``endpoint_spec.immutable_changes``) refuse exactly them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.fleet import endpoint_spec
from kvfleet.fleet.endpoint_spec import immutable_changes, render_iec
from kvfleet.fleet.inventory import Endpoint, Settings

ROOT = Path(__file__).resolve().parents[2]
FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "inference_endpoint_config.yaml").read_text())
CRD = yaml.safe_load((ROOT / FACTS["crd"]["local_copy"]).read_text())


def _schema(prop: str) -> dict[str, Any]:
    version = next(v for v in CRD["spec"]["versions"] if v["name"] == FACTS["crd"]["version"])
    node = version["schema"]["openAPIV3Schema"]
    for part in prop.split("."):
        node = node["properties"][part]
    return node


def _desired() -> dict[str, Any]:
    ep = Endpoint(name="chat", namespace="retail", lob="retail", cluster="c", model="qwen2-7b",
                  instance_type="ml.g5.4xlarge", routing="kvaware")
    return render_iec(ep, Settings())["spec"]


@pytest.mark.parametrize("fact", FACTS["immutability"], ids=lambda f: f["property"])
def test_the_crd_the_twin_serves_carries_the_recorded_notes(fact: dict[str, Any]) -> None:
    schema = _schema(fact["property"])
    for sentence in fact["description_says"]:
        assert sentence in " ".join(schema["description"].split())
    if "default" in fact:
        assert schema["default"] == fact["default"]
    if "enum" in fact:
        assert schema["enum"] == fact["enum"]


def test_kvfleets_rule_lists_follow_the_sheet() -> None:
    by_rule = {f["property"].removeprefix("spec."): f for f in FACTS["immutability"]}
    assert set(endpoint_spec.NOT_ADDABLE_SECTIONS) == {p for p, f in by_rule.items() if f["rule"] == "not addable"}
    assert set(endpoint_spec.IMMUTABLE_FIELDS) == {p for p, f in by_rule.items() if f["rule"] == "immutable"}
    for field, default in endpoint_spec.IMMUTABLE_DEFAULTS.items():
        assert by_rule[field]["default"] == default


def test_adding_the_not_addable_section_is_refused() -> None:
    desired = _desired()
    for fact in (f for f in FACTS["immutability"] if f["rule"] == "not addable"):
        section = fact["property"].removeprefix("spec.")
        live = copy.deepcopy(desired)
        del live[section]
        refused = immutable_changes(live, desired)
        assert len(refused) == 1 and refused[0].startswith(f"{fact['property']}: absent on the live endpoint")


def test_changing_an_immutable_field_is_refused_and_a_mutable_one_is_not() -> None:
    desired = _desired()
    for fact in FACTS["immutability"]:
        if fact["rule"] not in ("immutable", "mutable"):
            continue
        section, field = fact["property"].removeprefix("spec.").split(".")
        live = copy.deepcopy(desired)
        current = live[section][field]
        live[section][field] = (not current) if isinstance(current, bool) else \
            next(v for v in fact["enum"] if v != current)
        assert bool(immutable_changes(live, desired)) is (fact["rule"] == "immutable")
