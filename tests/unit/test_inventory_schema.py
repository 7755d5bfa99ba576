"""The inventory's keys come from one model: the JSON Schema (`kvfleet schema`) and docs/inventory.md's key table."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kvfleet.fleet import inventory_doc
from kvfleet.fleet.inventory.loader import json_schema

ROOT = Path(__file__).resolve().parents[2]
FLEETS = [ROOT / "fleet.example.yaml", *sorted((ROOT / "tests" / "fleets").glob("*.yaml"))]


def _validator() -> jsonschema.Draft202012Validator:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _cli_schema() -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "kvfleet.cli", "schema"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout)  # JSON alone on stdout
    return out


def test_kvfleet_schema_prints_the_models_schema() -> None:
    assert _cli_schema() == json.loads(json.dumps(json_schema()))


@pytest.mark.parametrize("path", FLEETS, ids=[p.name for p in FLEETS])
def test_the_fleets_validate_against_the_schema(path: Path) -> None:
    errors = [e.message for e in _validator().iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


def test_the_mapping_form_validates_against_the_schema() -> None:
    doc = yaml.safe_load((ROOT / "fleet.example.yaml").read_text())
    doc["clusters"] = {c.pop("name"): c for c in doc["clusters"]}
    doc["lobs"] = {x.pop("name"): x for x in doc["lobs"]}
    assert [e.message for e in _validator().iter_errors(doc)] == []


@pytest.mark.parametrize("mutate, word", [
    (lambda d: d["clusters"][0]["gpu_nodes"].update(count=0), "minimum"),
    (lambda d: d["endpoints"][0].update(routing="fast"), "enum"),
    (lambda d: d["clusters"][0].update(memory_pct=20), "additionalProperties"),
    (lambda d: d["settings"].update(wave_size="3"), "type"),
    (lambda d: d["clusters"][0].pop("region"), "required"),
])
def test_the_schema_rejects_a_bad_copy(mutate: Any, word: str) -> None:
    doc = copy.deepcopy(yaml.safe_load((ROOT / "fleet.example.yaml").read_text()))
    mutate(doc)
    errors = list(_validator().iter_errors(doc))
    assert errors, "a bad copy passed the schema"
    assert any(word in (e.validator or "") or any(word in str(c.validator) for c in e.context or [])
               for e in errors), [(e.validator, e.message[:120]) for e in errors]


def test_the_docs_key_table_is_up_to_date() -> None:
    assert inventory_doc.main(["--check"]) == 0, "run: python -m kvfleet.fleet.inventory_doc"


def test_the_docs_check_fails_on_a_stale_table(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "inventory.md").read_text(encoding="utf-8")
    assert "| `clusters[].gpu_nodes.count` | integer 1–10000 | **required** |" in page
    stale = tmp_path / "inventory.md"
    stale.write_text(page.replace("| `settings.wave_size` |", "| `settings.wave_sizes` |"), encoding="utf-8")
    assert inventory_doc.main(["--check", str(stale)]) == 1
    assert inventory_doc.main([str(stale)]) == 0 and stale.read_text(encoding="utf-8") == page


def test_every_model_field_is_in_the_table() -> None:
    from kvfleet.fleet.inventory.schema import Cluster, Endpoint, Settings

    table = inventory_doc.table()
    for prefix, model in (("settings.", Settings), ("clusters[].", Cluster), ("endpoints[].", Endpoint)):
        for name, field in model.model_fields.items():  # a field's key in the file is its alias, if it has one
            assert f"| `{prefix}{field.alias or name}` |" in table, name
