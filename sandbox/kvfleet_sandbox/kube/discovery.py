"""Discovery documents (``/version``, ``/api``, ``/apis``, group versions) and server-side ``Table`` rendering.

Called from ``server`` for the first requests every client makes: kubectl and helm build their REST mapping from
the legacy discovery documents served here (when kubectl asks for aggregated discovery,
``application/json;g=apidiscovery.k8s.io;v=v2``, it also accepts plain ``application/json`` and falls back to the
legacy form, which is what it gets). ``kubectl get`` asks for ``Table`` output; ``table()`` renders a NAME/AGE table
plus a few well-known columns.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kvfleet_sandbox.kube.resources import ALL_VERBS, ResourceType

SERVER_VERSION = {
    "major": "1", "minor": "33", "gitVersion": "v1.33.0-eks-kvfleet-sandbox", "gitCommit": "sandbox",
    "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
    "platform": "linux/amd64",
}

_SUB_KINDS = {"scale": ("autoscaling", "v1", "Scale", ["get", "patch", "update"]),
              "status": (None, None, None, ["get", "patch", "update"]),
              "log": ("", "v1", "Pod", ["get"]),
              "proxy": ("", "v1", "PodProxyOptions", ["create", "delete", "get", "patch", "update"])}


def core_versions() -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}


def _groups(types: list[ResourceType]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for t in types:
        if not t.group:
            continue
        versions = groups.setdefault(t.group, [])
        for v in t.versions:
            if v not in versions:
                versions.append(v)
    return groups


def _preferred(types: list[ResourceType], group: str, versions: list[str]) -> str:
    storage = [t.storage_version for t in types if t.group == group]
    return storage[0] if storage and storage[0] in versions else versions[0]


def api_group_list(types: list[ResourceType]) -> dict[str, Any]:
    out = []
    for group, versions in sorted(_groups(types).items()):
        preferred = _preferred(types, group, versions)
        out.append({"name": group,
                    "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                    "preferredVersion": {"groupVersion": f"{group}/{preferred}", "version": preferred}})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": out}


def api_group(types: list[ResourceType], group: str) -> dict[str, Any] | None:
    versions = _groups(types).get(group)
    if not versions:
        return None
    preferred = _preferred(types, group, versions)
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group,
            "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{group}/{preferred}", "version": preferred}}


def resource_list(types: list[ResourceType], group: str, version: str) -> dict[str, Any] | None:
    served = [t for t in types if t.group == group and version in t.versions]
    if not served:
        return None
    resources = []
    for t in sorted(served, key=lambda t: t.plural):
        entry = {"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
                 "verbs": list(ALL_VERBS)}
        if t.short_names:
            entry["shortNames"] = t.short_names
        if t.is_custom:
            entry["categories"] = ["all"]
        resources.append(entry)
        for sub in sorted(t.subresources):
            sgroup, sversion, skind, verbs = _SUB_KINDS[sub]
            item = {"name": f"{t.plural}/{sub}", "singularName": "", "namespaced": t.namespaced,
                    "kind": skind or t.kind, "verbs": verbs}
            if sgroup is not None and (sgroup, sversion) != (group, version):
                item.update(group=sgroup, version=sversion)
            resources.append(item)
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": resources}


# --- tables ---------------------------------------------------------------------------------------------

def _age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    created = dt.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    seconds = max(0, int((dt.datetime.now(dt.UTC) - created).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * 2:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _extra_columns(kind: str) -> list[tuple[str, Any]]:
    def ready(obj: dict[str, Any]) -> str:
        status = obj.get("status") or {}
        return f"{status.get('readyReplicas', 0)}/{(obj.get('spec') or {}).get('replicas', 0)}"

    def node_status(obj: dict[str, Any]) -> str:
        conds = (obj.get("status") or {}).get("conditions") or []
        ok = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
        return "Ready" if ok else "NotReady"

    return {
        "Node": [("Status", node_status)],
        "Pod": [("Status", lambda o: (o.get("status") or {}).get("phase", "Pending"))],
        "Deployment": [("Ready", ready)], "StatefulSet": [("Ready", ready)],
        "Namespace": [("Status", lambda o: (o.get("status") or {}).get("phase", "Active"))],
    }.get(kind, [])


def table(kind: str, objects: list[dict[str, Any]], resource_version: str) -> dict[str, Any]:
    extra = _extra_columns(kind)
    columns = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    columns += [{"name": n, "type": "string", "format": "", "description": n, "priority": 0} for n, _ in extra]
    columns.append({"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0})
    rows = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        cells = [meta.get("name", "")] + [fn(obj) for _, fn in extra] + [_age(meta.get("creationTimestamp"))]
        rows.append({"cells": cells, "object": obj})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns, "rows": rows}


# --- OpenAPI v3 (just enough for kubectl) ---------------------------------------------------------------
# kubectl's default ``--validate=strict`` downloads /openapi/v3 to learn whether the server honours the
# ``fieldValidation`` query parameter for a kind (it looks for a PATCH operation tagged with the kind's
# x-kubernetes-group-version-kind that lists the parameter). Declaring support makes kubectl leave validation
# to the server, so no component schemas are needed; without the document, kubectl apply refuses to run.

def openapi_v3_root(types: list[ResourceType]) -> dict[str, Any]:
    paths = {}
    for gv in sorted({(t.group, v) for t in types for v in t.versions}):
        rel = f"apis/{gv[0]}/{gv[1]}" if gv[0] else f"api/{gv[1]}"
        paths[rel] = {"serverRelativeURL": f"/openapi/v3/{rel}?hash=sandbox"}
    return {"paths": paths}


def openapi_v3_group_version(types: list[ResourceType], group: str, version: str) -> dict[str, Any] | None:
    served = [t for t in types if t.group == group and version in t.versions]
    if not served:
        return None
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    params = [{"name": n, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
              for n in ("dryRun", "fieldManager", "fieldValidation", "force")]
    paths = {}
    for t in served:
        scope = "/namespaces/{namespace}" if t.namespaced else ""
        gvk = {"group": group, "version": version, "kind": t.kind}
        op = {"operationId": f"patch{t.kind}", "parameters": params,
              "responses": {"200": {"description": "OK"}},
              "x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk}
        post = {**op, "operationId": f"create{t.kind}", "x-kubernetes-action": "post"}
        paths[f"{prefix}{scope}/{t.plural}/{{name}}"] = {"patch": op, "put": {**op, "x-kubernetes-action": "put"}}
        paths[f"{prefix}{scope}/{t.plural}"] = {"post": post}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]},
            "paths": paths, "components": {"schemas": {}}}
