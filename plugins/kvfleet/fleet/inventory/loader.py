"""Reading an inventory: the bounded YAML loader, the top level, the model, the messages, and the JSON Schema."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from kvfleet.fleet import yaml_safe
from kvfleet.fleet.inventory.messages import FleetProblems, message, where, yaml_path
from kvfleet.fleet.inventory.schema import FleetFile, normalised
from kvfleet.fleet.inventory.vocabulary import MAX_INVENTORY_BYTES, MAX_PROBLEMS, TOP_KEYS, type_name


@dataclass(frozen=True)
class Validated:
    fleet: FleetFile
    warnings: tuple[str, ...]


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


def validate_document(raw: Any, source: str = "fleet.yaml") -> Validated:
    """Validate a loaded YAML document against :class:`FleetFile`; :class:`FleetProblems` lists every problem."""
    data = normalised(_fleet_document(raw, source))
    context: dict[str, Any] = {"source": source, "warnings": []}
    try:
        fleet = FleetFile.model_validate(data, context=context)
    except ValidationError as exc:
        lines = [f"{source}: {yaml_path(where(tuple(e['loc'])), data) or '(top level)'}: {message(e, FleetFile)}"
                 for e in exc.errors()]
        shown = lines[:MAX_PROBLEMS]
        if len(lines) > MAX_PROBLEMS:
            shown.append(f"{source}: … and {len(lines) - MAX_PROBLEMS} more problems")
        raise FleetProblems(shown) from None
    return Validated(fleet, tuple(context["warnings"]))


def validate_text(text: str, source: str = "fleet.yaml") -> Validated:
    """Load and validate an inventory text; :class:`FleetProblems` lists every problem."""
    return validate_document(load_document(text, source), source)


def json_schema() -> dict[str, Any]:
    """The inventory's JSON Schema (draft 2020-12), generated from :class:`FleetFile`."""
    schema: dict[str, Any] = FleetFile.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "kvfleet fleet inventory"
    return _named_collections(schema)


def _named_collections(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema of `lobs`, `clusters`, `endpoints` and `addons` takes both spellings: the list, or a mapping keyed
    by name whose items may leave `name` out."""
    defs = schema.get("$defs", {})
    targets = [(schema, k) for k in ("lobs", "clusters", "endpoints")]
    targets += [(defs["ClusterIn"], "addons")] if "ClusterIn" in defs else []
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


