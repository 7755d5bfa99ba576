"""What every model of the inventory is built on: a strict, frozen mapping that refuses unknown keys, a field's
description with its default, the two spellings of a named collection, and the field types several models share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from kvfleet.fleet.inventory.fields import _bool, _enum, _name, _text, _update_strategy
from kvfleet.fleet.inventory.vocabulary import DNS_LABEL, UPDATE_STRATEGIES, _fail, show, type_name

Text = Annotated[str, _text()]
Bool = Annotated[bool, BeforeValidator(_bool)]
AccountName = Annotated[str | None, _name(DNS_LABEL, "account name")]
UpdateStrategy = Annotated[str | None, _enum(_update_strategy, UPDATE_STRATEGIES, nullable=True)]


_REQUIRED: Any = ...


def _described(text: str, default: Any = _REQUIRED, default_factory: Callable[[], Any] | None = None) -> Any:
    """A field's description (the docs table and the schema read it) and its default."""
    if default_factory is not None:
        value = default_factory()
        shown = value if isinstance(value, list | dict) else None  # the schema and the docs show plain defaults
        return Field(default_factory=default_factory, description=text,
                     json_schema_extra=None if shown is None else {"default": shown})
    return Field(default, description=text)


class _Model(BaseModel):
    """A mapping of the inventory: unknown keys are refused, values are typed strictly (YAML's ``"3"`` is no 3)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=False)

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, data: Any) -> Any:
        if data is None:
            return {}  # `tiered_storage:` with nothing under it: every default
        if isinstance(data, BaseModel):
            return data
        if not isinstance(data, dict):
            raise _fail(f"expected a mapping, got {type_name(data)} {show(data)}")
        bad = next((k for k in data if not isinstance(k, str)), None)
        if bad is not None:
            raise _fail(f"the key {show(bad)} is {type_name(bad)}; field names are strings (YAML 1.1 reads on/off/"
                        "yes/no as booleans and 0x1F as a number) — quote it")
        return data


def named_items(raw: Any) -> Any:
    """The two spellings of a named collection, normalised to a list: a list of mappings with ``name`` stays as it
    is; a mapping keyed by name becomes a list whose items carry the key as ``name`` (an item's own ``name`` wins).
    Anything else is returned unchanged, for pydantic to refuse."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        out = []
        for key, body in raw.items():
            if body is None:
                body = {}
            out.append({**body, "name": body.get("name", key)} if isinstance(body, dict) else body)
        return out
    return raw
