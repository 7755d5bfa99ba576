"""``KubeStore``: the in-memory object store behind one emulated EKS cluster's Kubernetes API.

Called from ``server.KubeApiServer`` (every HTTP request), from the simulated controllers (which read and write
objects through ``get``/``list``/``create``/``update``/``patch``/``mutate`` and watch through ``subscribe``) and from
tests. It does what the apiserver and etcd do for kvfleet's purposes: metadata bookkeeping (uid,
creationTimestamp, a global ``resourceVersion`` counter, ``generation`` bumped when anything outside metadata and
status changes), optimistic concurrency (409 on a stale resourceVersion), namespaces that must exist, CRDs that
add served types, schema validation, admission hooks, subresources (status, scale) and watch events.
Deletion is immediate (no finalizers, no deletionTimestamp); deleting a namespace deletes what it holds.
The real apiserver creates ``default``, ``kube-system``, ``kube-public`` and ``kube-node-lease`` itself, so the
store starts with them.
"""

from __future__ import annotations

import collections
import datetime as dt
import inspect
import queue
import secrets
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvfleet_sandbox.kube import patching
from kvfleet_sandbox.kube.documents import clone
from kvfleet_sandbox.kube.errors import ApiError, already_exists, conflict, not_found
from kvfleet_sandbox.kube.label_selectors import field_matcher, label_matcher, match_labels_to_selector
from kvfleet_sandbox.kube.resources import ResourceType, builtin_types, crd_type
from kvfleet_sandbox.kube.validation import validate_builtin, validate_custom

__all__ = ["ApiError", "KubeStore", "ProxyResponse", "RequestRecord", "WatchEvent"]

AdmissionHook = Callable[[str, str, str, dict[str, Any], dict[str, Any] | None], dict[str, Any] | None]
Subscriber = Callable[[str, str, str, dict[str, Any]], None]
_T = TypeVar("_T")
AppliedKey = tuple[str, str, str, str, str]  # group, resource, namespace, name, field manager
Events = list["WatchEvent"]  # a module-level name: inside KubeStore, ``list`` is the method
HISTORY_LIMIT = 5000
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request as the server saw it: verb is the RBAC-style verb, or ``discovery`` / ``unauthorized``
    (both logged, neither counted by ``request_counts``)."""

    verb: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None
    dry_run: bool
    user_agent: str
    user: str = ""
    allowed: bool = True  # False: refused by RBAC (403)


@dataclass
class ProxyResponse:
    """What a pod-proxy handler answers; an iterable ``body`` is streamed chunk by chunk as produced."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | Iterable[bytes] = b""


@dataclass(frozen=True)
class WatchEvent:
    """One change as watchers see it; ``prev`` is what selectors can test of the object before a MODIFIED change
    (the cacher's ``PrevObject``; labels and the supported field-selector fields only), so a watch with a selector
    can turn an object leaving it into DELETED and one entering it into ADDED."""

    rv: int
    type: str
    group: str
    resource: str
    obj: dict[str, Any]
    prev: dict[str, Any] | None = None


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    """What ``generation`` tracks: everything outside metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _selector_view(obj: dict[str, Any]) -> dict[str, Any]:
    """What a watch's selectors can test on the previous version of an object (labels and the field selectors
    the apiserver supports for common kinds), kept instead of a full copy so the history stays small."""
    meta = obj.get("metadata") or {}
    view: dict[str, Any] = {"metadata": {k: clone(meta[k]) for k in ("name", "namespace", "labels")
                                         if k in meta}}
    for section, keys in (("spec", ("nodeName", "schedulerName", "serviceAccountName")), ("status", ("phase",))):
        part = obj.get(section) or {}
        if isinstance(part, dict) and any(k in part for k in keys):
            view[section] = {k: part[k] for k in keys if k in part}
    for key in ("type", "involvedObject", "reason"):
        if key in obj:
            view[key] = clone(obj[key])
    return view


def _dotted(path: str) -> list[str]:
    return [p for p in path.strip(".").split(".") if p]


def _get_path(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in _dotted(path):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = _dotted(path)
    cur = obj
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value


class KubeStore:
    """In-memory, thread-safe (one RLock) object store for ONE cluster."""

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name
        self._lock = threading.RLock()
        self._types: dict[tuple[str, str], ResourceType] = {t.key: t for t in builtin_types()}
        self._objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = collections.defaultdict(dict)
        self._rv = 0
        self._admission: list[AdmissionHook] = []
        self._subscribers: list[Subscriber] = []
        self._watchers: list[queue.Queue[WatchEvent | None]] = []
        self._streams = 0  # watches opened and not yet closed (their stream's end written): ``wait_streams_ended``
        self._streams_ended = threading.Condition(self._lock)
        self._history: collections.deque[WatchEvent] = collections.deque(maxlen=HISTORY_LIMIT)
        self._proxies: list[Callable[..., ProxyResponse | None]] = []
        self._log_sources: list[Callable[..., str | None]] = []
        self.request_log: list[RequestRecord] = []
        # Server-side apply: the last configuration each field manager applied, per object.
        self._applied: dict[AppliedKey, dict[str, Any]] = {}
        for ns in SYSTEM_NAMESPACES:
            self.create("", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # --- types ------------------------------------------------------------------------------------------

    def resource_type(self, group: str, resource: str) -> ResourceType:
        with self._lock:
            rtype = self._types.get((group, resource))
        if rtype is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rtype

    def resource_types(self) -> list[ResourceType]:
        with self._lock:
            return list(self._types.values())

    def register_crd_resource(self, crd: dict[str, Any] | None, *, remove: tuple[str, str] | None = None) -> None:
        """Serve (or stop serving) the type a CRD declares; called when a CRD object is written or deleted."""
        with self._lock:
            if remove is not None:
                self._types.pop(remove, None)
                self._objects.pop(remove, None)
            if crd is not None:
                rtype = crd_type(crd)
                self._types[rtype.key] = rtype

    # --- hooks --------------------------------------------------------------------------------------------

    def add_admission(self, fn: AdmissionHook) -> None:
        self._admission.append(fn)

    def subscribe(self, fn: Subscriber) -> None:
        self._subscribers.append(fn)

    def register_pod_proxy(self, fn: Callable[..., ProxyResponse | None]) -> None:
        self._proxies.append(fn)

    def register_log_source(self, fn: Callable[..., str | None]) -> None:
        self._log_sources.append(fn)

    def pod_proxy(self, *args: Any, received: float | None = None) -> ProxyResponse | None:
        """Offer a proxied request to each handler until one answers. ``received`` (``time.monotonic()``) is when the
        API server read it: handlers that declare a ``received`` keyword (the simulated vLLM and Curvine servers)
        get it; a plain handler ``(namespace, pod, port, method, path, query, headers, body)`` is called without."""
        for fn in list(self._proxies):
            resp = fn(*args, received=received) if _takes_received(fn) else fn(*args)
            if resp is not None:
                return resp
        return None

    def pod_log(self, *args: Any) -> str | None:
        for fn in list(self._log_sources):
            text = fn(*args)
            if text is not None:
                return text
        return None

    # --- instrumentation -------------------------------------------------------------------------------

    def record_request(self, record: RequestRecord) -> None:
        with self._lock:
            self.request_log.append(record)

    def request_counts(self) -> collections.Counter[tuple[str, str]]:
        with self._lock:
            records = list(self.request_log)
        return collections.Counter(
            (r.verb, f"{r.resource}/{r.subresource}" if r.subresource else r.resource)
            for r in records if r.verb not in ("discovery", "unauthorized"))

    def reset_request_log(self) -> None:
        with self._lock:
            self.request_log.clear()

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    # --- internals ----------------------------------------------------------------------------------------

    def _run(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        events: list[WatchEvent] = []
        with self._lock:
            result = fn(events, *args, **kwargs)
        for ev in events:
            for sub in list(self._subscribers):
                sub(ev.type, ev.group, ev.resource, clone(ev.obj))
        return result

    def _emit(self, events: list[WatchEvent], kind: str, rtype: ResourceType, obj: dict[str, Any],
              prev: dict[str, Any] | None = None) -> None:
        ev = WatchEvent(self._rv, kind, rtype.group, rtype.plural, clone(obj),
                        _selector_view(prev) if prev is not None else None)
        self._history.append(ev)
        for q in list(self._watchers):
            q.put(ev)
        events.append(ev)

    def _bucket(self, rtype: ResourceType) -> dict[tuple[str, str], dict[str, Any]]:
        return self._objects[rtype.key]

    def _key(self, rtype: ResourceType, name: str, namespace: str | None) -> tuple[str, str]:
        return ((namespace or "default") if rtype.namespaced else "", name)

    def _version_of(self, rtype: ResourceType, obj: dict[str, Any]) -> str:
        api_version = obj.get("apiVersion") or ""
        version = api_version.rsplit("/", 1)[-1] if api_version else rtype.storage_version
        return version if version in rtype.versions else rtype.storage_version

    def _require_namespace(self, rtype: ResourceType, namespace: str) -> None:
        if rtype.namespaced and ("", namespace) not in self._objects[("", "namespaces")]:
            raise not_found("", "namespaces", namespace)

    def _admit(self, op: str, rtype: ResourceType, new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        for hook in list(self._admission):
            result = hook(op, rtype.group, rtype.plural, clone(new), clone(old))
            if result is not None:
                new = result
        return new

    def _validate(self, rtype: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        if rtype.is_custom:
            return validate_custom(rtype, self._version_of(rtype, obj), obj, old)
        validate_builtin(rtype, obj)
        return obj

    def _normalise(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """Store in the storage version: only apiVersion is rewritten (no field conversion)."""
        obj["apiVersion"] = rtype.api_version()
        obj["kind"] = rtype.kind
        return obj

    # --- create -------------------------------------------------------------------------------------------

    def create(self, group: str, resource: str, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        return self._run(self._create, group, resource, obj, dry_run=dry_run)

    def _create(self, events: list[WatchEvent], group: str, resource: str, obj: dict[str, Any], *,
                dry_run: bool = False) -> dict[str, Any]:
        rtype = self.resource_type(group, resource)
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", f"{rtype.kind} is invalid: metadata.name: Required value: "
                                           "name or generateName is required")
        if rtype.namespaced:
            meta["namespace"] = meta.get("namespace") or "default"
            self._require_namespace(rtype, meta["namespace"])
        else:
            meta.pop("namespace", None)
        obj.setdefault("apiVersion", rtype.api_version())
        obj.setdefault("kind", rtype.kind)
        obj = self._admit("CREATE", rtype, obj, None)
        obj = self._validate(rtype, obj, None)
        meta = obj["metadata"]
        key = self._key(rtype, meta["name"], meta.get("namespace"))
        if key in self._bucket(rtype):
            raise already_exists(group, resource, meta["name"])
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        for k in ("deletionTimestamp", "managedFields", "selfLink"):
            meta.pop(k, None)
        self._defaults_on_create(rtype, obj)
        obj = self._normalise(rtype, obj)
        if dry_run:
            meta["resourceVersion"] = str(self._rv)
            return clone(obj)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._bucket(rtype)[key] = obj
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self.register_crd_resource(obj)
        self._emit(events, "ADDED", rtype, obj)
        return clone(obj)

    def _defaults_on_create(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        if rtype.key == ("", "namespaces"):
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        elif rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            spec = obj.get("spec") or {}
            storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
            obj["status"] = {
                "acceptedNames": spec.get("names") or {}, "storedVersions": storage,
                "conditions": [
                    {"type": t, "status": "True", "reason": r, "message": "", "lastTransitionTime": now_rfc3339()}
                    for t, r in (("NamesAccepted", "NoConflicts"), ("Established", "InitialNamesAccepted"))],
            }
        elif rtype.key == ("", "secrets"):
            obj["type"] = obj.get("type") or "Opaque"
        elif rtype.key == ("", "services"):
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if spec.get("clusterIP") != "None":
                spec.setdefault("clusterIP", f"10.100.{secrets.randbelow(250)}.{secrets.randbelow(250) + 1}")

    # --- read -----------------------------------------------------------------------------------------

    def get(self, group: str, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        rtype = self.resource_type(group, resource)
        with self._lock:
            obj = self._bucket(rtype).get(self._key(rtype, name, namespace))
            return clone(obj) if obj is not None else None

    def list(self, group: str, resource: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict[str, Any]]:
        rtype = self.resource_type(group, resource)
        by_label, by_field = label_matcher(label_selector), field_matcher(field_selector)
        with self._lock:
            items = [o for (ns, _), o in sorted(self._bucket(rtype).items())
                     if (namespace is None or not rtype.namespaced or ns == namespace)
                     and by_label(o) and by_field(o)]
            return clone(items)

    def _existing(self, rtype: ResourceType, name: str, namespace: str | None) -> dict[str, Any]:
        obj = self._bucket(rtype).get(self._key(rtype, name, namespace))
        if obj is None:
            raise not_found(rtype.group, rtype.plural, name)
        return obj

    # --- update -----------------------------------------------------------------------------------------

    def update(self, group: str, resource: str, obj: dict[str, Any], *, subresource: str | None = None,
               dry_run: bool = False) -> dict[str, Any]:
        return self._run(self._update, group, resource, obj, subresource=subresource, dry_run=dry_run)

    def _update(self, events: Events, group: str, resource: str, obj: dict[str, Any], *,
                subresource: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        rtype = self.resource_type(group, resource)
        meta = obj.get("metadata") or {}
        old = self._existing(rtype, meta.get("name", ""), meta.get("namespace"))
        if subresource == "scale":
            return self._write_scale(events, rtype, old, obj, dry_run=dry_run)
        if meta.get("resourceVersion") and meta["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise conflict(group, resource, old["metadata"]["name"])
        new = self._merge_for_subresource(rtype, old, clone(obj), subresource)
        if subresource is None:
            new = self._admit("UPDATE", rtype, new, old)
        new = self._validate(rtype, new, old)
        return self._commit_update(events, rtype, old, new, dry_run=dry_run)

    def _merge_for_subresource(self, rtype: ResourceType, old: dict[str, Any], new: dict[str, Any],
                               subresource: str | None) -> dict[str, Any]:
        if subresource == "status":
            merged = clone(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            return merged
        if subresource is not None:
            raise ApiError(405, "MethodNotAllowed", f"subresource {subresource!r} cannot be updated")
        if "status" in rtype.subresources:
            if "status" in old:
                new["status"] = clone(old["status"])
            else:
                new.pop("status", None)
        return new

    def _commit_update(self, events: Events, rtype: ResourceType, old: dict[str, Any],
                       new: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
        meta = new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "name", "namespace", "generation", "resourceVersion"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
        meta.pop("managedFields", None)
        new = self._normalise(rtype, new)
        if new == old:
            return clone(old)  # a no-op write does not bump resourceVersion, like the apiserver
        if _content(new) != _content(old):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if dry_run:
            return clone(new)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._bucket(rtype)[self._key(rtype, meta["name"], meta.get("namespace"))] = new
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self.register_crd_resource(new)
        self._emit(events, "MODIFIED", rtype, new, old)
        return clone(new)

    # --- patch ------------------------------------------------------------------------------------------

    def patch(self, group: str, resource: str, name: str, namespace: str | None, patch_body: Any,
              patch_type: str, *, subresource: str | None = None, dry_run: bool = False,
              field_manager: str | None = None) -> dict[str, Any]:
        return self._run(self._patch, group, resource, name, namespace, patch_body, patch_type,
                         subresource=subresource, dry_run=dry_run, field_manager=field_manager)

    def _patch(self, events: Events, group: str, resource: str, name: str, namespace: str | None,
               patch_body: Any, patch_type: str, *, subresource: str | None, dry_run: bool,
               field_manager: str | None) -> dict[str, Any]:
        rtype = self.resource_type(group, resource)
        current = self._bucket(rtype).get(self._key(rtype, name, namespace))
        applied_key = (group, resource, *self._key(rtype, name, namespace), field_manager or "")
        if patch_type == patching.APPLY_PATCH and subresource is None:
            if not isinstance(patch_body, dict):
                raise ApiError(400, "BadRequest", "an apply patch must be an object")
            result = self._apply(events, rtype, current, name, namespace, patch_body, applied_key, dry_run)
            if not dry_run:
                self._applied[applied_key] = clone(patch_body)
            return result
        if current is None:
            raise not_found(group, resource, name)
        if subresource == "scale":
            patched = patching.apply_any(self._scale_of(rtype, current), patch_body,
                                         patching.MERGE_PATCH if patch_type == patching.STRATEGIC_PATCH
                                         else patch_type, custom=True)
            return self._write_scale(events, rtype, current, patched, dry_run=dry_run)
        patched = patching.apply_any(clone(current), patch_body, patch_type, custom=rtype.is_custom)
        return self._write_patched(events, rtype, current, patched, subresource, dry_run)

    def _write_patched(self, events: Events, rtype: ResourceType, current: dict[str, Any],
                       patched: dict[str, Any], subresource: str | None, dry_run: bool) -> dict[str, Any]:
        pmeta = patched.setdefault("metadata", {})
        wanted_rv = pmeta.get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise conflict(rtype.group, rtype.plural, current["metadata"]["name"])
        pmeta.update(name=current["metadata"]["name"], resourceVersion=current["metadata"]["resourceVersion"])
        if rtype.namespaced:
            pmeta["namespace"] = current["metadata"]["namespace"]
        return self._update(events, rtype.group, rtype.plural, patched, subresource=subresource, dry_run=dry_run)

    def _apply(self, events: Events, rtype: ResourceType, current: dict[str, Any] | None, name: str,
               namespace: str | None, body: dict[str, Any], applied_key: AppliedKey,
               dry_run: bool) -> dict[str, Any]:
        if current is None:
            body = clone(body)
            body.setdefault("metadata", {}).update(name=name, **({"namespace": namespace} if namespace else {}))
            return self._create(events, rtype.group, rtype.plural, body, dry_run=dry_run)
        patched = patching.apply_any(clone(current), body, patching.APPLY_PATCH, custom=rtype.is_custom,
                                     previous=self._applied.get(applied_key))
        return self._write_patched(events, rtype, current, patched, None, dry_run)

    # --- scale subresource --------------------------------------------------------------------------------

    def _scale_paths(self, rtype: ResourceType) -> dict[str, str]:
        if "scale" not in rtype.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rtype.scale_paths or {"specReplicasPath": ".spec.replicas",
                                     "statusReplicasPath": ".status.replicas"}

    def _scale_of(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        paths = self._scale_paths(rtype)
        meta = obj["metadata"]
        if rtype.is_custom:
            selector = _get_path(obj, paths.get("labelSelectorPath", "")) if paths.get("labelSelectorPath") else ""
        else:
            selector = match_labels_to_selector((obj.get("spec") or {}).get("selector"))
        return {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": _get_path(obj, paths["specReplicasPath"]) or 0},
            "status": {"replicas": _get_path(obj, paths.get("statusReplicasPath", ".status.replicas")) or 0,
                       "selector": selector or ""},
        }

    def get_scale(self, group: str, resource: str, name: str, namespace: str | None) -> dict[str, Any]:
        rtype = self.resource_type(group, resource)
        with self._lock:
            return self._scale_of(rtype, self._existing(rtype, name, namespace))

    def _write_scale(self, events: Events, rtype: ResourceType, current: dict[str, Any],
                     scale: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
        wanted_rv = (scale.get("metadata") or {}).get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise conflict(rtype.group, rtype.plural, current["metadata"]["name"])
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, "Invalid", f'Scale.autoscaling "{current["metadata"]["name"]}" is invalid: '
                                           f"spec.replicas: Invalid value: {replicas}: must be greater than or "
                                           "equal to 0")
        new = clone(current)
        _set_path(new, self._scale_paths(rtype)["specReplicasPath"], replicas)
        new = self._admit("UPDATE", rtype, new, current)
        written = self._commit_update(events, rtype, current, new, dry_run=dry_run)
        return self._scale_of(rtype, written)

    # --- delete -----------------------------------------------------------------------------------------

    def delete(self, group: str, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self._run(self._delete, group, resource, name, namespace)

    def _delete(self, events: Events, group: str, resource: str, name: str,
                namespace: str | None, *, dry_run: bool = False) -> dict[str, Any] | None:
        rtype = self.resource_type(group, resource)
        key = self._key(rtype, name, namespace)
        obj = self._bucket(rtype).get(key)
        if obj is None or dry_run:
            return clone(obj)
        if rtype.key == ("", "namespaces"):
            self._empty_namespace(events, name)
        del self._bucket(rtype)[key]
        for applied_key in [k for k in self._applied if k[:4] == (group, resource, *key)]:
            del self._applied[applied_key]
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            gone = crd_type(obj)
            for (ns, n) in list(self._objects.get(gone.key, {})):
                self._delete(events, gone.group, gone.plural, n, ns)
            self.register_crd_resource(None, remove=gone.key)
        self._emit(events, "DELETED", rtype, obj)
        return clone(obj)

    def _empty_namespace(self, events: Events, namespace: str) -> None:
        for rkey, bucket in list(self._objects.items()):
            rtype = self._types.get(rkey)
            if rtype is None or not rtype.namespaced:
                continue
            for (ns, n) in [k for k in bucket if k[0] == namespace]:
                self._delete(events, rtype.group, rtype.plural, n, ns)

    # --- controller-side writes ---------------------------------------------------------------------------

    def mutate(self, group: str, resource: str, name: str, namespace: str | None,
               fn: Callable[[dict[str, Any]], dict[str, Any] | None], *,
               admission: bool = False) -> dict[str, Any] | None:
        """Atomic read-modify-write for simulated controllers: ``fn`` gets a copy and returns the new object
        (or None: no change). Bookkeeping and watch events apply; validation, request counters and (unless
        ``admission=True``) admission hooks do not. Returns the stored object, or None if it is absent."""
        return self._run(self._mutate, group, resource, name, namespace, fn, admission=admission)

    def _mutate(self, events: Events, group: str, resource: str, name: str, namespace: str | None,
                fn: Callable[[dict[str, Any]], dict[str, Any] | None], *,
                admission: bool) -> dict[str, Any] | None:
        rtype = self.resource_type(group, resource)
        current = self._bucket(rtype).get(self._key(rtype, name, namespace))
        if current is None:
            return None
        new = fn(clone(current))
        if new is None:
            return clone(current)
        if admission:
            new = self._admit("UPDATE", rtype, new, current)
        return self._commit_update(events, rtype, current, new, dry_run=False)

    # --- watch ------------------------------------------------------------------------------------------

    def open_watch(self, group: str, resource: str, since: str | None) -> tuple[
            queue.Queue[WatchEvent | None], Events]:
        """Register a watch queue; returns it with the events to send first (history after ``since``, or a
        synthetic ADDED per current object when ``since`` is empty or "0"). 410 Gone if history is too short."""
        rtype = self.resource_type(group, resource)
        q: queue.Queue[WatchEvent | None] = queue.Queue()
        with self._lock:
            if since in (None, "", "0"):
                initial = [WatchEvent(self._rv, "ADDED", rtype.group, rtype.plural, clone(o))
                           for _, o in sorted(self._bucket(rtype).items())]
            else:
                start = int(since)
                oldest = self._history[0].rv if self._history else self._rv + 1
                if start < oldest - 1 and start < self._rv:
                    raise ApiError(410, "Expired", f"too old resource version: {start} ({oldest - 1})")
                initial = [ev for ev in self._history
                           if ev.rv > start and (ev.group, ev.resource) == rtype.key]
            self._watchers.append(q)
            self._streams += 1
        return q, initial

    def close_watch(self, q: queue.Queue[WatchEvent | None]) -> None:
        """The watch's handler is done with ``q`` (its stream's end is written): unregistered and counted out."""
        with self._lock:
            if q in self._watchers:
                self._watchers.remove(q)
            self._streams = max(0, self._streams - 1)
            self._streams_ended.notify_all()
        q.put(None)

    def wait_streams_ended(self, timeout_s: float) -> bool:
        """Until every open watch's handler has written its stream's end (after ``close_all_watches``), so that a
        server stopping closes no connection in the middle of a chunked response; False after ``timeout_s``."""
        with self._lock:
            return self._streams_ended.wait_for(lambda: self._streams == 0, timeout=timeout_s)

    def close_all_watches(self) -> None:
        with self._lock:
            watchers, self._watchers = self._watchers, []
        for q in watchers:
            q.put(None)


def _takes_received(fn: Callable[..., Any]) -> bool:
    """Whether a pod-proxy handler accepts the ``received`` keyword (by name or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "received" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
