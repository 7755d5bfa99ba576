"""Copies of the API server's documents.

Every object the store holds is a JSON document (dicts with string keys, lists, strings, numbers, booleans, None):
it came in as JSON or YAML and goes out as JSON. :func:`clone` copies such a document about three times faster than
``copy.deepcopy`` (no memo, no dispatch table), which matters because the store copies every object it hands out or
notifies about: with a few controllers subscribed and four test workers sharing two cores, ``copy.deepcopy`` was
half of the twin's CPU during a rollout. A value of any other type falls back to ``copy.deepcopy``.
"""

from __future__ import annotations

import copy
from typing import TypeVar

T = TypeVar("T")

_ATOMS = (str, int, float, bool, type(None))


def clone(value: T) -> T:
    """A deep copy of a JSON document: no part of the result is shared with ``value``."""
    kind = type(value)
    if kind is dict:
        return {k: clone(v) for k, v in value.items()}  # type: ignore[attr-defined,return-value]
    if kind is list:
        return [clone(v) for v in value]  # type: ignore[attr-defined,return-value]
    if kind in _ATOMS:
        return value
    return copy.deepcopy(value)


__all__ = ["clone"]
