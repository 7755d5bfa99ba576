"""From pydantic's errors to kvfleet's messages: the YAML path a user reads, and one text per error type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import InitErrorDetails, PydanticCustomError

from kvfleet.fleet.inventory.vocabulary import NAMED, key_text, show, type_name

Loc = tuple[str | int, ...]


@dataclass
class Found:
    """What the cross checks found: (location, message) problems and full warning lines."""

    problems: list[tuple[tuple[str | int, ...], str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class FleetProblems(ValueError):
    """A fleet document that is not a valid inventory; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


MISSING: Final = {
    "gpu_nodes": "is required: declare {count: N, instance_type: ml.…}",
    "count": "is required; add a whole number in 1–10000",
}


def _item_label(kind: str, index: int, items: Any) -> str:
    item = items[index] if isinstance(items, list) and 0 <= index < len(items) else None
    name = item.get("name") if isinstance(item, dict) else None
    shared = isinstance(name, str) and isinstance(items, list) and sum(
        isinstance(x, dict) and x.get("name") == name for x in items) > 1
    if kind == "endpoints" or shared:  # endpoints, and a cluster name two accounts or regions both have
        return f"{kind}[{index}]({key_text(name)})" if isinstance(name, str) and name else f"{kind}[{index}]"
    return f"{kind}.{key_text(name)}" if isinstance(name, str) and name else f"{kind}[{index}]"


def yaml_path(loc: tuple[str | int, ...], data: Any) -> str:
    """The path a user reads for a pydantic location: names for list items, ``[key]`` segments dropped."""
    out = ""
    node = data
    i = 0
    while i < len(loc):
        seg = loc[i]
        items = node.get(seg) if isinstance(node, dict) and isinstance(seg, str) else None
        if isinstance(seg, str) and seg in (*NAMED, "addons") and i + 1 < len(loc) \
                and isinstance(loc[i + 1], int) and isinstance(items, list):
            index = int(loc[i + 1])
            label = _item_label(seg, index, items)
            out = f"{out}.{label}" if out else label
            node = items[index] if 0 <= index < len(items) else None
            i += 2
            continue
        if seg == "[key]":
            i += 1
            continue
        text = f"[{seg}]" if isinstance(seg, int) else key_text(seg)
        out = f"{out}{text}" if text.startswith("[") or not out else f"{out}.{text}"
        node = node.get(seg) if isinstance(node, dict) else node[seg] if isinstance(node, list) and \
            isinstance(seg, int) and 0 <= seg < len(node) else None
        i += 1
    return out


def _model_at(loc: tuple[str | int, ...], root: type[BaseModel]) -> type[BaseModel] | None:
    """The model class a location's mapping is validated by (for the allowed keys of an unknown one)."""
    cls: Any = root
    for seg in loc:
        if isinstance(seg, int):
            continue
        fields = getattr(cls, "model_fields", None)
        if not fields or seg not in fields:
            return None
        cls = _inner_model(fields[seg].annotation)
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def message(error: Any, root: type[BaseModel]) -> str:
    """The kvfleet text of one pydantic error of a document validated by ``root`` (and, on the first error of an
    object that failed, that the object is left out of the checks across objects)."""
    return _text(error, root) + str((error.get("ctx") or {}).get("left_out", ""))


def _text(error: Any, root: type[BaseModel]) -> str:
    kind, loc, value = error["type"], tuple(error["loc"]), error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "kvfleet":
        return str(ctx["detail"])
    if kind == "missing":
        return MISSING.get(str(loc[-1]) if loc else "", "is required; add it")
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1], root)
        keys = sorted(f.alias or k for k, f in model.model_fields.items()) if model else ["see docs/inventory.md"]
        allowed = ", ".join(keys)
        return f"unknown field; allowed fields: {allowed}"
    if kind == "too_long":
        return f"has {ctx.get('actual_length')} entries; at most {ctx.get('max_length')}"
    if kind in ("list_type", "dict_type"):
        want = "a list or mapping" if loc and loc[-1] in (*NAMED, "addons") else \
            "a list" if kind == "list_type" else "a mapping"
        return f"expected {want}, got {type_name(value)} {show(value)}"
    return f"{show(value)}: {error['msg']}"


def where(loc: Loc) -> Loc:
    """An unknown add-on is the add-on's own problem (``clusters.c1.addons.nope``), not its name field's."""
    return loc[:-1] if len(loc) >= 3 and loc[-1] == "name" and loc[-3] == "addons" else loc


LEFT_OUT: Final = {"accounts": "this account is", "lobs": "this line of business is", "clusters": "this cluster is",
                   "endpoints": "this endpoint is", "settings": "the settings are"}


def left_out(errors: list[Any]) -> list[Any]:
    """The field errors, the first one of each object that failed saying that the object is left out of the checks
    across objects (references, capacity, model sizes) until it is fixed."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for error in errors:
        loc = tuple(error["loc"])
        owner = loc[:2] if loc and loc[0] in NAMED and len(loc) >= 2 else \
            loc[:1] if loc and loc[0] == "settings" else None
        if owner is not None and owner not in seen:
            seen.add(owner)
            note = f" ({LEFT_OUT[str(owner[0])]} left out of the checks across objects until this is fixed)"
            error = {**error, "ctx": {**(error.get("ctx") or {}), "left_out": note}}
        out.append(error)
    return out


def again(error: Any) -> InitErrorDetails:
    """A collected error, carried into the combined ValidationError unchanged in substance."""
    ctx = {k: v for k, v in (error.get("ctx") or {}).items() if k != "error"}
    if error["type"] != "kvfleet":
        ctx["detail"] = error["msg"]
    return InitErrorDetails(type=PydanticCustomError(error["type"], "{detail}", ctx), loc=error["loc"],
                            input=error.get("input"))
