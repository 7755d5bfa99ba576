"""Label and field selectors, parsed and matched the way the real apiserver does.

Called from ``store.KubeStore.list`` (and so from every list and watch request). A malformed selector raises
``ApiError`` 400 BadRequest, as the apiserver does, so client code that builds selectors is tested for real.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kvfleet_sandbox.kube.errors import ApiError

Matcher = Callable[[dict[str, Any]], bool]

_SET_TERM = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s+(in|notin)\s+\((.*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|!=|=)\s*([A-Za-z0-9._-]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside the parentheses of an ``in``/``notin`` set."""
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


def _label_term(term: str) -> Callable[[dict[str, str]], bool]:
    m = _SET_TERM.match(term)
    if m:
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    m = _EQ_TERM.match(term)
    if m:
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    m = _EXISTS_TERM.match(term)
    if m:
        negate, key = m.groups()
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise ApiError(400, "BadRequest", f"unable to parse requirement: invalid label selector term {term!r}")


def label_matcher(selector: str | None) -> Matcher:
    """A predicate over whole objects for ``labelSelector``; empty or None matches everything."""
    terms = [_label_term(t) for t in _split_terms(selector or "")]

    def match(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(t(labels) for t in terms)

    return match


def field_value(obj: dict[str, Any], path: str) -> str:
    """The string form of a dotted field path; absent fields compare as the empty string."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def field_matcher(selector: str | None) -> Matcher:
    """A predicate for ``fieldSelector`` (``a=b``, ``a==b``, ``a!=b`` joined by commas) over any dotted path."""
    checks: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector or ""):
        m = re.match(r"^\s*([A-Za-z0-9._]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        checks.append((m.group(1), m.group(2) != "!=", m.group(3)))

    def match(obj: dict[str, Any]) -> bool:
        return all((field_value(obj, p) == v) == want for p, want, v in checks)

    return match


def match_labels_to_selector(selector: dict[str, Any] | None) -> str:
    """Render a LabelSelector object (matchLabels/matchExpressions) as the string form Scale.status uses."""
    selector = selector or {}
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)
