"""The list form and the mapping form (keyed by name) of `clusters:`/`endpoints:`/`lobs:` give the same fleet, read by
the validator (`load_inventory`), by the CLI (`kvfleet validate --json`), by the drift watch in the triggerer
(`fleet_watch.watched`) and by the twin's reader."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import load_inventory
from kvfleet_sandbox.fleet_reader import read_fleet

ROOT = Path(__file__).resolve().parents[2]


def _mapping_form(doc: dict[str, Any]) -> dict[str, Any]:
    """The same fleet keyed by name. Endpoint names repeat across clusters, so endpoints are keyed by a unique
    key and keep their own `name` (an item's `name` wins over its key)."""
    out = dict(doc)
    out["clusters"] = {c["name"]: {k: v for k, v in c.items() if k != "name"} for c in doc["clusters"]}
    out["lobs"] = {x["name"]: {k: v for k, v in x.items() if k != "name"} for x in doc["lobs"]}
    out["endpoints"] = {f"{e['cluster']}-{e['name']}": e for e in doc["endpoints"]}
    return out


@pytest.fixture(params=["fleet.example.yaml", "tests/fleets/twin.yaml"])
def forms(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    doc = yaml.safe_load((ROOT / request.param).read_text())
    as_list, as_map = tmp_path / "list.yaml", tmp_path / "map.yaml"
    as_list.write_text(yaml.safe_dump(doc, sort_keys=False))
    as_map.write_text(yaml.safe_dump(_mapping_form(doc), sort_keys=False))
    assert isinstance(yaml.safe_load(as_map.read_text())["clusters"], dict)
    return as_list, as_map


def _cli_json(path: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "kvfleet.cli", "validate", "--json", "--fleet", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _load(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_inventory(path)


def test_the_validator_reads_both_forms_alike(forms: tuple[Path, Path]) -> None:
    a, b = (_load(p) for p in forms)
    assert a.clusters == b.clusters and a.endpoints == b.endpoints and a.lobs == b.lobs
    assert len(a.clusters) == 2 and len(a.endpoints) == 12


def test_the_cli_reads_both_forms_alike(forms: tuple[Path, Path]) -> None:
    a, b = (_cli_json(p) for p in forms)
    assert (a["clusters"], a["endpoints"], a["lobs"]) == (b["clusters"], b["endpoints"], b["lobs"])
    inv = _load(forms[0])
    assert a["clusters"] == [c.model_dump(mode="json") for c in inv.clusters]
    assert a["endpoints"] == [e.model_dump(mode="json") for e in inv.endpoints]


def test_the_drift_watch_reads_both_forms_alike(forms: tuple[Path, Path]) -> None:
    from kvfleet.airflow.triggers.fleet_watch import watched

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = ([c for c, _ in watched(str(p), None)] for p in forms)
    assert a == b == _load(forms[0]).clusters
    assert len(a) == 2  # the mapping form once gave the watch zero clusters


def test_the_twin_reads_both_forms_alike(forms: tuple[Path, Path]) -> None:
    a, b = (read_fleet(p) for p in forms)
    assert a.clusters == b.clusters and a.endpoints == b.endpoints
    inv = _load(forms[0])
    assert [(c.name, c.region, c.gpu_nodes.count, c.gpu_nodes.instance_type, c.l2_injection, c.ebs_storage_class)
            for c in a.clusters] == [(c.name, c.region, c.gpu_nodes.count, c.gpu_nodes.instance_type, c.l2_injection,
                                      c.ebs_storage_class) for c in inv.clusters]
    assert [(e.name, e.namespace, e.cluster) for e in a.endpoints] == [
        (e.name, e.namespace, e.cluster) for e in inv.endpoints]


def test_a_bad_mapping_form_names_the_item(tmp_path: Path) -> None:
    doc = _mapping_form(yaml.safe_load((ROOT / "fleet.example.yaml").read_text()))
    doc["clusters"]["ml-prod-use1"]["gpu_nodes"]["count"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert any(p.startswith("bad.yaml: clusters.ml-prod-use1.gpu_nodes.count: 0 is below 1")
               for p in err.value.problems), err.value.problems
