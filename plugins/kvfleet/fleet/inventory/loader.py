"""Reading an inventory: the file (at most ``MAX_INVENTORY_BYTES``, a regular file), the bounded YAML loader, the top
level, the model's validation with its messages, and the JSON Schema.

Called from the CLI (`kvfleet validate|plan`), from every DAG's first task, from the drift watch and from the twin.
Validation collects *every* problem before it raises, because a platform team fixing a 12-endpoint file one error
per run would rightly give up. Each message names the file, the path inside it, the value, what is allowed and the
fix, e.g. ``fleet.yaml: clusters.ml-prod-1.tiered_storage.memory_percent: 15 is below 20 (HyperPod accepts 20–100);
set it to 20 or more``.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvfleet.errors import InventoryError
from kvfleet.fleet import yaml_safe
from kvfleet.fleet.inventory.messages import FleetProblems, message, where, yaml_path
from kvfleet.fleet.inventory.schema import Inventory, normalised
from kvfleet.fleet.inventory.vocabulary import MAX_INVENTORY_BYTES, MAX_PROBLEMS, NAMED, TOP_KEYS, type_name


class InventoryWarning(UserWarning):
    """A legal but useless setting (for example L2 on a one-node cluster)."""


def _fleet_document(raw: Any, source: str) -> dict[str, Any]:
    """The top level: a mapping with at least one inventory key. A file that is not one is refused without quoting
    any of its content (``--fleet`` given the wrong file must not print what that file holds)."""
    why = ""
    if raw is None:
        return {}  # an empty document: an inventory that declares nothing (refused below: no cluster)
    if not isinstance(raw, dict):
        why = f"its top level is {type_name(raw)}, not a mapping"
    elif raw and not any(k in TOP_KEYS for k in raw if isinstance(k, str)):
        why = f"none of its {len(raw)} top-level keys is {', '.join(TOP_KEYS[:-1])} or {TOP_KEYS[-1]}"
    if why:
        raise FleetProblems([f"{source}: (top level): not a kvfleet inventory: {why}; --fleet takes the fleet's "
                             "YAML file (see fleet.example.yaml and docs/inventory.md)"])
    return dict(raw)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error without the document's text: PyYAML's message quotes the offending line and its tokens."""
    if isinstance(exc, yaml_safe.UnsafeYaml):
        return str(exc)[:400]
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = re.sub(r"'[^']*'|\"[^\"]*\"", "(…)", str(getattr(exc, "problem", None) or type(exc).__name__))
    context = re.sub(r"'[^']*'|\"[^\"]*\"", "(…)", str(getattr(exc, "context", None) or ""))
    return f"{problem}{where}" + (f" ({context})" if context else "") + "; fix the YAML syntax there"


def load_document(text: str, source: str) -> Any:
    """The YAML document, through the bounded loader (size, aliases, depth, duplicate keys)."""
    if len(text) > MAX_INVENTORY_BYTES:
        raise FleetProblems([f"{source}: the inventory has {len(text)} characters, more than the "
                             f"{MAX_INVENTORY_BYTES} allowed; split the fleet into several files"])
    try:
        return yaml_safe.load(text)
    except yaml.YAMLError as exc:
        raise FleetProblems([f"{source}: not valid YAML: {_yaml_problem(exc)}"]) from None
    except (ValueError, OverflowError, RecursionError, MemoryError) as exc:
        # a constructor's own failure (an integer of more than 4300 digits, a bad timestamp): no document text
        raise FleetProblems([f"{source}: not valid YAML: a value YAML cannot build ({type(exc).__name__})"]) from None


def validate_document(raw: Any, source: str = "fleet.yaml") -> Inventory:
    """Validate a loaded YAML document against :class:`Inventory`; :class:`FleetProblems` lists every problem."""
    data = normalised(_fleet_document(raw, source))
    try:
        fleet = Inventory.model_validate(data, context={"source": source})
    except ValidationError as exc:
        lines = [f"{source}: {yaml_path(where(tuple(e['loc'])), data) or '(top level)'}: {message(e, Inventory)}"
                 for e in exc.errors()]
        shown = lines[:MAX_PROBLEMS]
        if len(lines) > MAX_PROBLEMS:
            shown.append(f"{source}: … and {len(lines) - MAX_PROBLEMS} more problems")
        raise FleetProblems(shown) from None
    return fleet


def validate_text(text: str, source: str = "fleet.yaml") -> Inventory:
    """Load and validate an inventory text; :class:`FleetProblems` lists every problem."""
    return validate_document(load_document(text, source), source)


def json_schema() -> dict[str, Any]:
    """The inventory's JSON Schema (draft 2020-12), generated from :class:`Inventory`."""
    schema: dict[str, Any] = Inventory.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "kvfleet fleet inventory"
    return _named_collections(schema)


def _named_collections(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema of `accounts`, `lobs`, `clusters`, `endpoints` and `addons` takes both spellings: the list, or a
    mapping keyed by name whose items may leave `name` out."""
    defs = schema.get("$defs", {})
    targets = [(schema, k) for k in NAMED]
    targets += [(defs["Cluster"], "addons")] if "Cluster" in defs else []
    for owner, key in targets:
        prop = owner["properties"][key]
        ref = prop["items"]["$ref"]
        name = ref.rsplit("/", 1)[-1]
        keyed = {k: v for k, v in defs[name].items() if k != "required"}
        keyed["required"] = [r for r in defs[name].get("required", []) if r != "name"]
        defs[f"{name}Keyed"] = keyed
        owner["properties"][key] = {
            "description": prop.get("description", ""),
            "anyOf": [{"type": "array", "items": {"$ref": ref}},
                      {"type": "object", "additionalProperties": {"$ref": f"#/$defs/{name}Keyed"}},
                      {"type": "null"}]}
    return schema


def parse_inventory(text: str, source: str = "fleet.yaml") -> Inventory:
    """Parse and validate an inventory text. Raises ``InventoryError`` listing every problem."""
    try:
        inventory = validate_text(text, source)
    except FleetProblems as exc:
        raise InventoryError(exc.problems) from None
    for w in inventory.warnings:
        warnings.warn(w, InventoryWarning, stacklevel=2)
    return inventory


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def read_inventory_text(path: str | Path) -> str:
    """The inventory's text: a regular file of at most ``MAX_INVENTORY_BYTES``, UTF-8. ``InventoryError`` else.

    The type is checked before the file is opened (``open`` would block on a FIFO and ``read`` never ends on
    /dev/zero), and the read itself stops one byte past the limit (the file may grow between stat and read).
    """
    p = Path(path)
    shown = _cut(str(p), 200)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise InventoryError([f"{shown}: cannot read the inventory: {exc.strerror}"]) from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise InventoryError([f"{shown}: is {kind}, not a regular file; --fleet takes a YAML file"])
    if st.st_size > MAX_INVENTORY_BYTES:
        raise InventoryError([f"{shown}: the inventory is {st.st_size} bytes, more than the "
                              f"{MAX_INVENTORY_BYTES} ({MAX_INVENTORY_BYTES // 1024 // 1024} MiB) allowed; "
                              "split the fleet into several files"])
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # swapped between stat and open
                raise InventoryError([f"{shown}: is not a regular file; --fleet takes a YAML file"])
            data = fh.read(MAX_INVENTORY_BYTES + 1)
    except OSError as exc:
        raise InventoryError([f"{shown}: cannot read the inventory: {exc.strerror}"]) from None
    if len(data) > MAX_INVENTORY_BYTES:
        raise InventoryError([f"{shown}: the inventory is more than {MAX_INVENTORY_BYTES} bytes; split it"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError([f"{shown}: is not UTF-8 text (byte {exc.start}); save it as UTF-8"]) from None


def load_inventory(path: str | Path) -> Inventory:
    p = Path(path)
    return parse_inventory(read_inventory_text(p), source=_cut(p.name, 200))
