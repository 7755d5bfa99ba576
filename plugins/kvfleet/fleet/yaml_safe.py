"""A bounded YAML loader for inventories: refuses duplicate keys, alias bombs, deep nesting and huge scalars.

Pure. ``yaml.safe_load`` has none of these bounds: it keeps the last of two equal mapping keys silently, and an
alias bomb (``a: &a [x, x]``, ``b: &b [*a, *a]``, ...) composes into a small graph whose *expansion* is
exponential. PyYAML shares the constructed objects, so loading costs little, but anything that walks the value
afterwards (validation, ``repr`` in a message, a ``--set`` rendering) builds the expansion and runs out of memory.

This loader decides on the composed node graph, before any Python object is built:

- every mapping key must be unique (after YAML's own key resolution: ``1`` and ``"1"`` differ, ``on`` is a
  string under the YAML 1.1 safe schema's bool rules only as PyYAML resolves it), merge keys ``<<`` excepted;
- at most ``MAX_ALIASES`` aliases, and the expanded document (each alias counted as a full copy of what it
  points at) at most ``MAX_EXPANDED_NODES`` nodes; a self-referencing anchor is refused;
- nesting at most ``MAX_DEPTH`` levels (PyYAML's composer recurses per level);
- a scalar at most ``MAX_SCALAR_CHARS`` characters.

Each refusal is a :class:`UnsafeYaml` naming the line and column.
"""

from __future__ import annotations

from typing import Any, Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_ALIASES: Final = 100
MAX_EXPANDED_NODES: Final = 100_000
MAX_DEPTH: Final = 50
MAX_SCALAR_CHARS: Final = 64 * 1024


class UnsafeYaml(yaml.YAMLError):  # type: ignore[misc]
    """The document is valid YAML but kvfleet refuses to load it (a duplicate key or an unbounded structure)."""


def _at(node: Node | None) -> str:
    if node is None or node.start_mark is None:
        return ""
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


class BoundedSafeLoader(yaml.SafeLoader):  # type: ignore[misc]
    """``yaml.SafeLoader`` with the bounds of this module (see the module docstring)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._nodes = 0

    # --- composition: depth, alias count ---------------------------------------------------------------
    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                event = self.peek_event()
                raise UnsafeYaml(f"more than {MAX_ALIASES} YAML aliases (*name) at line {event.start_mark.line + 1}; "
                                 "write the values out instead of referencing anchors")
        self._nodes += 1
        if self._nodes > MAX_EXPANDED_NODES:
            event = self.peek_event()
            raise UnsafeYaml(f"more than {MAX_EXPANDED_NODES} values (at line {event.start_mark.line + 1}); "
                             "no inventory is that large — split the fleet into several files")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event = self.peek_event()
                raise UnsafeYaml(f"nested more than {MAX_DEPTH} levels deep at line {event.start_mark.line + 1}; "
                                 "an inventory needs at most a few levels")
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, ScalarNode) and len(node.value) > MAX_SCALAR_CHARS:
            raise UnsafeYaml(f"a scalar of {len(node.value)} characters at {_at(node)} (at most "
                             f"{MAX_SCALAR_CHARS}); no inventory value is that long")
        return node

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node

    # --- construction: duplicate keys ------------------------------------------------------------------
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # the base class refuses unhashable keys with its own message
                marker = (type(key).__name__, key)
                if marker in seen:
                    raise UnsafeYaml(f"duplicate key {_short(key)} at {_at(key_node)} (first at "
                                     f"{_at(seen[marker])}); YAML keeps only the last copy, so remove or "
                                     "rename one")
                seen[marker] = key_node
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str | int | float | bool) or value is None else type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def _check_expansion(root: Node) -> None:
    """Count the nodes of the fully expanded document without building it; refuse cycles and bombs."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # Iterative post-order walk: a deep document must not hit Python's recursion limit here either.
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            total = 1 + sum(sizes[id(c)] for c in children)
            if total > MAX_EXPANDED_NODES:
                raise UnsafeYaml(f"the document expands to more than {MAX_EXPANDED_NODES} values through its "
                                 f"aliases (at {_at(node)}); an alias bomb is refused — write the values out")
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise UnsafeYaml(f"an anchor that contains an alias to itself at {_at(node)}; a recursive value "
                             "cannot be an inventory value")
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise UnsafeYaml(f"an anchor that contains an alias to itself at {_at(child)}; a recursive "
                                 "value cannot be an inventory value")
            if id(child) not in sizes:
                stack.append((child, False))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load(text: str) -> Any:
    """Load one YAML document with the bounds above. Raises ``yaml.YAMLError`` (``UnsafeYaml`` for a bound)."""
    loader = BoundedSafeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
