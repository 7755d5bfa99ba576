"""The fleet inventory: what platform teams declare, read, validated in full; its models are the values kvfleet uses.

The package, by concern (each module imports only those above it):

==================  ===============================================================================================
``vocabulary``      the patterns, limits and choices a value must match; how a message quotes a value
``fields``          the field checks: a value in, the kept value or the kvfleet message out
``messages``        from pydantic's errors to kvfleet's messages (the YAML path a user reads, one text per type)
``derived``         what a validated inventory implies: the L2 injection run, the GPU budget, a model's size
``rules``           the checks across fields and objects, on the objects that validated (accounts, and which
                    cluster, by its key account/region/name, each endpoint is on)
``base``            the strict frozen mapping every model is, a field's description, the two spellings of a collection
``schema``          the models (pydantic, frozen): every key with its type, default, bounds and description, and
                    what the rest of kvfleet reads of them (``Inventory``, ``Cluster``, ``Endpoint``, ``Lob``, …)
``loader``          reading the file, the bounded YAML loader, the top level, validation and the JSON Schema
==================  ===============================================================================================

What the rest of kvfleet imports is below; the twin (``kvfleet_sandbox.fleet_reader``) reads the same models.
"""

from kvfleet.fleet.inventory.derived import gpu_demand, model_fit
from kvfleet.fleet.inventory.loader import InventoryWarning, load_inventory, parse_inventory, read_inventory_text
from kvfleet.fleet.inventory.schema import AddonSpec, Cluster, CurvineSpec, Endpoint, Inventory, Lob, Settings

__all__ = ["AddonSpec", "Cluster", "CurvineSpec", "Endpoint", "Inventory", "InventoryWarning", "Lob", "Settings",
           "gpu_demand", "load_inventory", "model_fit", "parse_inventory", "read_inventory_text"]
