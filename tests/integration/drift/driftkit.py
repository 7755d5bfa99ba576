"""Names and inventory shared by the drift scenarios (a module with a unique name: ``conftest`` is ambiguous when
several test folders run together)."""

from __future__ import annotations

from pathlib import Path

from kvfleet.fleet.inventory import Inventory, load_inventory

ROOT = Path(__file__).resolve().parents[3]
PROD = "ml-prod-use1"
STAGE = "ml-stage-usw2"
# Three endpoints on the patch-mode cluster (one per LOB) keep a rollout under a few seconds.
ROLLED = ("retail-assistant", "payments-disputes", "support-chat")


def small_inventory() -> Inventory:
    inv = load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")
    eps = tuple(e for e in inv.endpoints if e.cluster != PROD or e.name in ROLLED)
    return inv.model_copy(update={"endpoints": eps})
