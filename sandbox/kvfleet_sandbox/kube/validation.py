"""Validation on write: structural-schema checks for custom resources, minimal checks for core objects.

Called from ``store.KubeStore`` before admission hooks and before anything is stored (dry-run included).
Custom resources are checked against the CRD's openAPIV3Schema of the requested version with ``jsonschema``
after translating the Kubernetes extensions: unknown fields are pruned (unless
``x-kubernetes-preserve-unknown-fields``), ``default``s are applied, ``x-kubernetes-int-or-string`` is honoured,
and int32/int64 formats are range-checked. Messages follow the apiserver's wording, e.g.
``spec.instanceType: Invalid value: "g5": spec.instanceType in body should match '^ml\\..*'``.
CEL ``x-kubernetes-validations`` of the form ``self == oldSelf`` (immutability) are enforced on update;
other CEL rules are ignored (the shipped InferenceEndpointConfig CRD has none).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema

from kvfleet_sandbox.kube.documents import clone
from kvfleet_sandbox.kube.errors import invalid
from kvfleet_sandbox.kube.resources import ResourceType

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_FORMATS = jsonschema.FormatChecker()


def _int32(value: Any) -> bool:
    return not isinstance(value, int) or _INT_RANGES["int32"][0] <= value <= _INT_RANGES["int32"][1]


def _int64(value: Any) -> bool:
    return not isinstance(value, int) or _INT_RANGES["int64"][0] <= value <= _INT_RANGES["int64"][1]


_FORMATS.checks("int32")(_int32)  # registered by call: the decorator form is untyped in jsonschema's stubs
_FORMATS.checks("int64")(_int64)


_KEEP = {"type", "properties", "items", "required", "enum", "pattern", "maxLength", "minLength", "maximum",
         "minimum", "exclusiveMaximum", "exclusiveMinimum", "maxItems", "minItems", "uniqueItems",
         "additionalProperties", "format", "oneOf", "anyOf", "allOf", "not", "maxProperties", "minProperties",
         "multipleOf"}


def to_jsonschema(schema: dict[str, Any]) -> dict[str, Any]:
    """Translate a Kubernetes structural schema into a plain JSON schema (draft 4 semantics)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in _KEEP:
            continue
        if key == "properties":
            out[key] = {k: to_jsonschema(v) for k, v in value.items()}
        elif (key == "items" and isinstance(value, dict)) or (key in ("additionalProperties", "not") \
                and isinstance(value, dict)):
            out[key] = to_jsonschema(value)
        elif key in ("oneOf", "anyOf", "allOf"):
            out[key] = [to_jsonschema(v) for v in value]
        elif key == "exclusiveMaximum" and isinstance(value, bool):
            continue  # draft-4 boolean form; draft 7 needs a number: checked loosely
        elif key == "exclusiveMinimum" and isinstance(value, bool):
            continue
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def prune_and_default(value: Any, schema: dict[str, Any]) -> Any:
    """Drop fields the schema does not know and fill in ``default``s, as the apiserver does before validating."""
    if isinstance(value, dict) and schema.get("type", "object") == "object" and "properties" in schema:
        props = schema["properties"]
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in schema
        for key in list(value):
            if key in props:
                value[key] = prune_and_default(value[key], props[key])
            elif not keep_unknown:
                del value[key]
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = prune_and_default(clone(sub["default"]), sub)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key in value:
            value[key] = prune_and_default(value[key], schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_default(v, schema["items"]) for v in value]
    return value


def _path(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _render(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else json.dumps(value)


_TYPE_NAMES = {"object": "object", "array": "array", "string": "string", "integer": "integer",
               "number": "number", "boolean": "boolean"}


def _cause(error: jsonschema.ValidationError) -> tuple[str, str]:
    path, v, rule = _path(error), error.instance, error.validator
    where = path or "<root>"
    if rule == "required":
        missing = re.search(r"'([^']+)' is a required property", error.message)
        name = missing.group(1) if missing else "?"
        return (f"{path}.{name}" if path else name, "Required value")
    if rule == "pattern":
        return (where, f"Invalid value: {_render(v)}: {where} in body should match '{error.validator_value}'")
    if rule == "enum":
        supported = ", ".join(_render(x) for x in error.validator_value)
        return (where, f"Unsupported value: {_render(v)}: supported values: {supported}")
    if rule == "type":
        want = error.validator_value
        want = want[0] if isinstance(want, list) else want
        actual = type(v).__name__.replace("str", "string").replace("dict", "object").replace("list", "array")
        return (where, f'Invalid value: "{actual}": {where} in body must be of type {_TYPE_NAMES.get(want, want)}: '
                       f'"{actual}"')
    if rule == "maxLength":
        return (where, f"Too long: may not be more than {error.validator_value} bytes")
    if rule == "minLength":
        return (where, f"Invalid value: {_render(v)}: {where} in body should be at least "
                       f"{error.validator_value} chars long")
    if rule == "maximum":
        return (where, f"Invalid value: {_render(v)}: {where} in body should be less than or equal to "
                       f"{error.validator_value}")
    if rule == "minimum":
        return (where, f"Invalid value: {_render(v)}: {where} in body should be greater than or equal to "
                       f"{error.validator_value}")
    if rule == "format":
        return (where, f"Invalid value: {_render(v)}: {where} in body must be of type {error.validator_value}")
    return (where, f"Invalid value: {_render(v)}: {error.message}")


def _immutability(new: Any, old: Any, schema: dict[str, Any], path: str) -> list[tuple[str, str]]:
    causes = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if rule.get("rule", "").replace(" ", "") == "self==oldSelf" and old is not None and new != old:
            causes.append((path, f"Invalid value: {_render(new) if not isinstance(new, dict | list) else 'object'}: "
                                 f"{rule.get('message') or 'Value is immutable'}"))
    props = schema.get("properties") or {}
    if isinstance(new, dict) and isinstance(old, dict):
        for key, sub in props.items():
            if key in new and key in old:
                causes += _immutability(new[key], old[key], sub, f"{path}.{key}" if path else key)
    return causes


def validate_custom(rtype: ResourceType, version: str, obj: dict[str, Any],
                    old: dict[str, Any] | None) -> dict[str, Any]:
    """Prune, default and validate a custom resource; returns the cleaned object or raises 422."""
    schema = rtype.schemas.get(version) or {}
    if not schema:
        return obj
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    body = prune_and_default(body, {**schema, "properties": {
        k: v for k, v in (schema.get("properties") or {}).items() if k not in ("apiVersion", "kind", "metadata")}})
    plain = to_jsonschema(schema)
    for k in ("apiVersion", "kind", "metadata"):
        plain.get("properties", {}).pop(k, None)
    plain["required"] = [r for r in plain.get("required", []) if r not in ("apiVersion", "kind", "metadata")]
    validator = jsonschema.Draft7Validator(plain, format_checker=_FORMATS)
    causes = [_cause(e) for e in sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))]
    if old is not None:
        causes += _immutability(body, old, schema, "")
    if causes:
        name = (obj.get("metadata") or {}).get("name", "")
        raise invalid(rtype.kind, rtype.group, name, causes)
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": obj.get("metadata"), **body}


# --- core objects ---------------------------------------------------------------------------------------

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _containers(spec: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    causes = []
    containers = spec.get("containers")
    if not containers:
        causes.append((f"{prefix}.containers", "Required value"))
    for i, c in enumerate(containers or []):
        for key in ("name", "image"):
            if not (c or {}).get(key):
                causes.append((f"{prefix}.containers[{i}].{key}", "Required value"))
    return causes


def _workload(obj: dict[str, Any]) -> list[tuple[str, str]]:
    spec = obj.get("spec") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    causes = []
    if not spec.get("selector"):
        causes.append(("spec.selector", "Required value"))
    elif any(labels.get(k) != v for k, v in selector.items()):
        causes.append(("spec.template.metadata.labels",
                       f"Invalid value: {json.dumps(labels)}: `selector` does not match template `labels`"))
    return causes + _containers(template.get("spec") or {}, "spec.template.spec")


def _pod(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return _containers(obj.get("spec") or {}, "spec")


_CORE_CHECKS: dict[tuple[str, str], Callable[[dict[str, Any]], list[tuple[str, str]]]] = {
    ("apps", "deployments"): _workload, ("apps", "statefulsets"): _workload,
    ("apps", "daemonsets"): _workload, ("apps", "replicasets"): _workload,
    ("", "pods"): _pod,
}


def validate_builtin(rtype: ResourceType, obj: dict[str, Any]) -> None:
    name = (obj.get("metadata") or {}).get("name", "")
    causes: list[tuple[str, str]] = []
    if not _DNS_SUBDOMAIN.match(name or "") and rtype.plural not in ("events",) and ":" not in name:
        causes.append(("metadata.name", f"Invalid value: {_render(name)}: a lowercase RFC 1123 subdomain must "
                                        "consist of lower case alphanumeric characters, '-' or '.'"))
    check = _CORE_CHECKS.get(rtype.key)
    if check:
        causes += check(obj)
    if causes:
        raise invalid(rtype.kind, rtype.group, name, causes)
