"""Wave planning: canary first (one endpoint per LOB per cluster), bounded waves, deterministic."""

from __future__ import annotations

import json
import random

import pytest

from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import Inventory, load_inventory
from kvfleet.fleet.plan import make_plan


@pytest.fixture
def inv(example_fleet) -> Inventory:  # type: ignore[no-untyped-def]
    return load_inventory(example_fleet)


def test_each_cluster_runs_stages_then_canary_then_bounded_waves(inv: Inventory) -> None:
    plan = make_plan(inv, wave_size=2)
    for cp in plan.clusters:
        assert cp.stages == ("tiered_storage", "operator_addons", "curvine")
        canary, *rest = cp.waves
        assert canary.kind == "canary"
        lobs = [e.lob for e in canary.endpoints]
        assert sorted(lobs) == sorted(set(lobs)) == sorted({e.lob for e in inv.endpoints_of(cp.cluster)})
        assert all(w.kind == "wave" and 1 <= len(w.endpoints) <= 2 for w in rest)
        moved = [e.ref for w in cp.waves for e in w.endpoints]
        assert sorted(moved) == sorted(e.ref for e in inv.endpoints_of(cp.cluster))
        assert len(moved) == len(set(moved))


def test_plan_is_deterministic_whatever_the_inventory_order(inv: Inventory) -> None:
    shuffled = list(inv.endpoints)
    random.Random(7).shuffle(shuffled)
    other = inv.model_copy(update={"clusters": list(reversed(inv.clusters)), "endpoints": shuffled})
    a = json.dumps(make_plan(inv).as_dict())
    assert a == json.dumps(make_plan(inv).as_dict()) == json.dumps(make_plan(other).as_dict())


def test_no_canary_means_plain_waves(inv: Inventory) -> None:
    plan = make_plan(inv, wave_size=3, canary=False)
    assert all(w.kind == "wave" for c in plan.clusters for w in c.waves)


def test_scope_by_lob_and_cluster(inv: Inventory) -> None:
    scoped = inv.select(lobs=["payments"], clusters=["ml-stage-usw2"])
    plan = make_plan(scoped)
    assert [c.cluster for c in plan.clusters] == ["ml-stage-usw2"]
    assert {e.lob for c in plan.clusters for w in c.waves for e in w.endpoints} == {"payments"}


def test_unknown_scope_names_are_refused_with_the_known_ones(inv: Inventory) -> None:
    with pytest.raises(InventoryError) as err:
        inv.select(clusters=["ml-prod-euw1"], lobs=["hr"])
    text = str(err.value)
    assert "unknown cluster 'ml-prod-euw1'" in text and "ml-prod-use1" in text and "unknown lob 'hr'" in text
