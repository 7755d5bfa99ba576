"""The fleet watch reads its inventory with kvfleet's validator (``load_inventory``): a ``clusters:`` list and the
same fleet as a mapping keyed by name give the watch the same clusters, regions and Curvine namespaces; an
invalid inventory is an ``error`` event listing its problems, read again later, never watched as an empty fleet."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.airflow.triggers.fleet_watch import FleetWatchTrigger, watched
from kvfleet.errors import InventoryError

pytestmark = pytest.mark.filterwarnings("ignore::kvfleet.fleet.inventory.InventoryWarning")
ROOT = Path(__file__).resolve().parents[2]
TWIN = ROOT / "tests" / "fleets" / "twin.yaml"


def _as_mapping(doc: dict[str, Any], path: Path) -> Path:
    """The same fleet with ``clusters:`` a mapping keyed by name (each body without its ``name``)."""
    assert isinstance(doc["clusters"], list) and len(doc["clusters"]) >= 2
    clusters = {c["name"]: {k: v for k, v in c.items() if k != "name"} for c in doc["clusters"]}
    path.write_text(yaml.safe_dump({**doc, "clusters": clusters}, sort_keys=False))
    return path


def _watched(path: Path) -> list[tuple[str, str, str]]:
    return [(c.name, c.region, c.curvine.namespace) for c, _ in watched(str(path), None)]


def test_the_list_and_the_mapping_form_of_a_fleet_give_the_watch_the_same_clusters(tmp_path: Path) -> None:
    doc = yaml.safe_load(TWIN.read_text())
    listed = _watched(TWIN)
    assert [(n, r) for n, r, _ in listed] == [(c["name"], c["region"]) for c in doc["clusters"]]
    assert _watched(_as_mapping(doc, tmp_path / "mapping.yaml")) == listed
    # a Curvine namespace of its own is kept in both forms
    doc["clusters"][0].setdefault("curvine", {})["namespace"] = "curvine-l2"
    (tmp_path / "list.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    own = _watched(tmp_path / "list.yaml")
    assert own[0][2] == "curvine-l2" and own[1:] == listed[1:]
    assert _watched(_as_mapping(doc, tmp_path / "mapping-l2.yaml")) == own


def test_an_invalid_inventory_is_an_error_not_an_empty_fleet(tmp_path: Path) -> None:
    doc = yaml.safe_load(TWIN.read_text())
    del doc["clusters"][0]["region"]  # once defaulted to us-east-1
    bad = tmp_path / "fleet.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(InventoryError, match="region"):
        watched(str(bad), None)


def test_the_fleet_watch_reports_an_invalid_inventory_and_reads_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first read fails: one ``error`` event with every problem; the same problems on the next read are not
    reported again (the trigger keeps reading, and watches nothing meanwhile)."""
    bad = tmp_path / "fleet.yaml"
    bad.write_text("clusters:\n  c1: {gpu_nodes: {count: 2, instance_type: ml.g6e.4xlarge}}\n")
    monkeypatch.setattr(FleetWatchTrigger, "RETRY_BASE_S", 0.01)
    trigger = FleetWatchTrigger(str(bad), aws_conn_id=None)

    async def scenario() -> tuple[dict[str, Any], int]:
        agen = trigger.run()
        first = dict((await asyncio.wait_for(agen.__anext__(), 30)).payload)
        nxt = asyncio.ensure_future(agen.__anext__())
        deadline = time.monotonic() + 30  # a guard against a hang, not a timed assertion
        while trigger.inventory_reads < 3:
            assert time.monotonic() < deadline, f"read {trigger.inventory_reads} time(s) in 30 s"
            await asyncio.sleep(0.01)
        assert not nxt.done(), nxt.result().payload  # the same problems: no second event
        nxt.cancel()
        await asyncio.gather(nxt, return_exceptions=True)
        await agen.aclose()  # type: ignore[attr-defined]
        return first, trigger.inventory_reads

    event, reads = asyncio.run(scenario())
    assert event["status"] == "error" and event["kind"] == "inventory" and "cluster" not in event, event
    assert str(bad) in event["message"]
    assert "region" in event["message"], event
    assert reads >= 3 and trigger.children == []
