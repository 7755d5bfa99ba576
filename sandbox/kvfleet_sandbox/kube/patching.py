"""The four patch formats the apiserver accepts: JSON patch, merge patch, strategic merge and server-side apply.

Called from ``store.KubeStore.patch``. Strategic merge uses the real merge keys of the built-in types for the
lists kvfleet and kubectl touch (containers/env/volumes by ``name``, volumeMounts by ``mountPath``, ports by
``containerPort``…); other lists are replaced, as the apiserver does for lists without a patch strategy.
Server-side apply is reduced to "remove what this field manager applied last time and no longer applies, then
merge the applied configuration into the live object like a strategic merge"; ownership across managers and
apply conflicts are not modelled (see the package docstring).
"""

from __future__ import annotations

from typing import Any, cast

from kvfleet_sandbox.kube.documents import clone
from kvfleet_sandbox.kube.errors import ApiError

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Field name -> merge key, from the Go types' `patchMergeKey` tags. Lists absent here are replaced whole.
MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "imagePullSecrets": "name", "hostAliases": "ip", "conditions": "type", "ownerReferences": "uid",
    "secrets": "name",
}
# Primitive lists with patchStrategy=merge (merged as sets).
MERGED_SETS = {"finalizers"}


def _bad(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


# --- RFC 7386 merge patch -------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- RFC 6902 JSON patch --------------------------------------------------------------------------------

def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _bad(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, list):
            doc = doc[int(part)]
        elif isinstance(doc, dict) and part in doc:
            doc = doc[part]
        else:
            raise _bad(f"path /{'/'.join(parts)} does not exist")
    return doc


def _index(container: list[Any], key: str, *, adding: bool) -> int:
    if key == "-" and adding:
        return len(container)
    try:
        idx = int(key)
    except ValueError:
        raise _bad(f"invalid array index {key!r}") from None
    if idx < 0 or idx > len(container) - (0 if adding else 1):
        raise _bad(f"array index {idx} out of range")
    return idx


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    if isinstance(parent, list):
        parent.insert(_index(parent, parts[-1], adding=True), value)
    elif isinstance(parent, dict):
        parent[parts[-1]] = value
    else:
        raise _bad("add target is not a container")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent = _walk(doc, parts[:-1])
    if isinstance(parent, list):
        return parent.pop(_index(parent, parts[-1], adding=False))
    if isinstance(parent, dict) and parts[-1] in parent:
        return parent.pop(parts[-1])
    raise _bad(f"unable to remove nonexistent key: {parts[-1]}")


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json patch must be a list of operations")
    doc = clone(doc)
    for op in ops:
        name, parts = op.get("op"), _pointer(op.get("path", ""))
        if name == "add":
            doc = _add(doc, parts, clone(op.get("value")))
        elif name == "remove":
            _remove(doc, parts)
        elif name == "replace":
            _walk(doc, parts)
            if parts:
                _remove(doc, parts)
            doc = _add(doc, parts, clone(op.get("value")))
        elif name in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            value = _remove(doc, src) if name == "move" else clone(_walk(doc, src))
            doc = _add(doc, parts, value)
        elif name == "test":
            if _walk(doc, parts) != op.get("value"):
                raise _bad(f"testing value {op.get('path')} failed")
        else:
            raise _bad(f"unknown json patch operation {name!r}")
    return doc


# --- strategic merge patch ------------------------------------------------------------------------------

def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items()
                if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _merge_key_for(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        sample = next((i for i in items if isinstance(i, dict)), {})
        return "containerPort" if "containerPort" in sample else "port"
    return MERGE_KEYS.get(field)


def _merge_keyed_list(live: list[Any], patch: list[Any], key: str) -> list[Any]:
    result = clone(live)
    for item in patch:
        if not isinstance(item, dict):
            raise _bad(f"strategic merge list item must be an object keyed by {key}")
        directive = item.get("$patch")
        if directive == "replace":
            return [_strip_directives({k: v for k, v in i.items() if k != "$patch"}) for i in patch
                    if i is not item]
        pos = next((i for i, cur in enumerate(result) if isinstance(cur, dict) and cur.get(key) == item.get(key)),
                   None)
        if directive == "delete":
            if pos is not None:
                result.pop(pos)
        elif pos is None:
            result.append(_strip_directives(item))
        else:
            result[pos] = strategic_merge(result[pos], item)
    return result


def _merge_list(field: str, live: Any, patch: list[Any]) -> list[Any]:
    key = _merge_key_for(field, patch)
    live_list = live if isinstance(live, list) else []
    if key is not None:
        return _merge_keyed_list(live_list, patch, key)
    if field in MERGED_SETS:
        return live_list + [v for v in patch if v not in live_list]
    return cast("list[Any]", _strip_directives(patch))


def strategic_merge(live: Any, patch: Any) -> Any:
    """Apply a strategic merge patch (directives ``$patch``, ``$setElementOrder``, ``$retainKeys``,
    ``$deleteFromPrimitiveList``) to ``live``; returns a new object."""
    if not isinstance(patch, dict):
        return clone(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives({k: v for k, v in patch.items() if k != "$patch"})
    if directive == "delete":
        return None
    result = clone(live) if isinstance(live, dict) else {}
    for key, value in patch.items():
        _merge_field(result, key, value)
    return result


def _merge_field(result: dict[str, Any], key: str, value: Any) -> None:
    """One key of a strategic merge patch into ``result`` (in place)."""
    if key.startswith("$deleteFromPrimitiveList/"):
        field = key.split("/", 1)[1]
        result[field] = [v for v in result.get(field) or [] if v not in value]
    elif key.startswith("$"):
        return  # $setElementOrder / $retainKeys: ordering and retention hints, not needed here
    elif value is None:
        result.pop(key, None)
    elif isinstance(value, list):
        result[key] = _merge_list(key, result.get(key), value)
    elif isinstance(value, dict):
        merged = strategic_merge(result.get(key), value)
        if merged is None:
            result.pop(key, None)
        else:
            result[key] = merged
    else:
        result[key] = value


def _removals(previous: Any, current: Any, custom: bool) -> Any:
    """A strategic-merge patch deleting what ``previous`` set and ``current`` no longer sets."""
    if not isinstance(previous, dict) or not isinstance(current, dict):
        return None
    patch: dict[str, Any] = {}
    for key, old in previous.items():
        if key not in current:
            patch[key] = None
            continue
        new = current[key]
        merge_key = None if custom or not isinstance(old, list) else _merge_key_for(key, old)
        if isinstance(old, dict):
            sub = _removals(old, new, custom)
            if sub:
                patch[key] = sub
        elif merge_key and isinstance(new, list):
            patch[key] = _keyed_removals(old, new, merge_key, custom)
            if not patch[key]:
                del patch[key]
    return patch


def _keyed_removals(old: list[Any], new: list[Any], merge_key: str, custom: bool) -> list[Any]:
    by_key = {i.get(merge_key): i for i in new if isinstance(i, dict)}
    out = []
    for item in old:
        if not isinstance(item, dict):
            continue
        if item.get(merge_key) not in by_key:
            out.append({merge_key: item.get(merge_key), "$patch": "delete"})
            continue
        sub = _removals(item, by_key[item.get(merge_key)], custom)
        if sub:
            out.append({merge_key: item.get(merge_key), **sub})
    return out


def _object(result: Any) -> dict[str, Any]:
    """A patched object must still be an object (a JSON patch replacing the root, or ``$patch: delete`` at the
    top, would make it something else): 422 then."""
    if not isinstance(result, dict):
        raise ApiError(422, "Invalid", "the patch does not leave an object: the result must be a JSON object")
    return result


def apply_patch(live: dict[str, Any], applied: dict[str, Any], *, custom: bool,
                previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Server-side apply, simplified: fields the same manager applied last time and no longer applies are
    removed, then the applied configuration is merged into the live object (merge keys for built-in types,
    plain merge for custom resources). Ownership by other managers and conflicts are not modelled."""
    if previous:
        live = strategic_merge(live, _removals(previous, applied, custom) or {})
    if custom:
        return _object(merge_patch(live, applied))
    return _object(strategic_merge(live, applied))


def apply_any(live: dict[str, Any], body: Any, patch_type: str, *, custom: bool,
              previous: dict[str, Any] | None = None) -> dict[str, Any]:
    if patch_type == JSON_PATCH:
        return _object(json_patch(live, body))
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "patch body must be a JSON object")
    if patch_type == MERGE_PATCH:
        return _object(merge_patch(live, body))
    if patch_type == STRATEGIC_PATCH:
        if custom:
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media types include: "
                           "application/json-patch+json, application/merge-patch+json, "
                           "application/apply-patch+yaml")
        return _object(strategic_merge(live, body))
    if patch_type == APPLY_PATCH:
        return apply_patch(live, body, custom=custom, previous=previous)
    raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {patch_type!r}")
