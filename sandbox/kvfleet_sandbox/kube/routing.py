"""Request routing for ``server.KubeApiServer``: URL → (group, version, resource, namespace, name, subresource),
then the verb's handler against the ``KubeStore``.

Called from the server's request handler for every request. It renders what clients expect: objects in the
requested version, lists with ``limit``/``continue``, ``Table`` output when kubectl asks for it, ``Status`` on
delete, watch streams (``watching``), text for ``pods/log``, and the pod and Service proxies (``services``) with
streamed bodies.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from kvfleet_sandbox.kube import discovery, patching, protobuf, services, watching
from kvfleet_sandbox.kube.errors import ApiError, not_found
from kvfleet_sandbox.kube.rbac import Attributes, acting_as, forbidden
from kvfleet_sandbox.kube.resources import ResourceType
from kvfleet_sandbox.kube.store import ProxyResponse, RequestRecord

if TYPE_CHECKING:
    from kvfleet_sandbox.kube.server import KubeApiServer, _Handler

PROXY_METHODS = ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS")  # proxyMethods of the pod and service proxy
_VERB_BY_METHOD = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass
class Route:
    group: str
    version: str
    resource: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    rest: str = ""  # the path after ``proxy/``


def _discovery(api: KubeApiServer, path: str) -> Any | None:
    types = api.store.resource_types()
    parts = [p for p in path.split("/") if p]
    if parts in (["version"],):
        return discovery.SERVER_VERSION
    if parts == ["api"]:
        return discovery.core_versions()
    if parts == ["api", "v1"]:
        return discovery.resource_list(types, "", "v1")
    if parts == ["apis"]:
        return discovery.api_group_list(types)
    if len(parts) == 2 and parts[0] == "apis":
        return discovery.api_group(types, parts[1]) or _no_resource()
    if len(parts) == 3 and parts[0] == "apis":
        return discovery.resource_list(types, parts[1], parts[2]) or _no_resource()
    if parts and parts[0] in ("healthz", "livez", "readyz"):
        return "ok"
    if parts and parts[0] == "openapi":
        return _openapi(types, parts)
    return None


def _openapi(types: list[ResourceType], parts: list[str]) -> Any:
    if parts == ["openapi", "v3"]:
        return discovery.openapi_v3_root(types)
    if parts[:2] == ["openapi", "v3"]:
        gv = parts[3:5] if len(parts) >= 5 else ["", parts[3] if len(parts) > 3 else ""]
        return discovery.openapi_v3_group_version(types, *gv) or _no_resource()
    return _no_resource()


def _no_resource() -> Any:
    raise ApiError(404, "NotFound", "the server could not find the requested resource")


def parse_route(path: str) -> Route:
    parts = [urllib.parse.unquote(p) for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    if not rest:
        _no_resource()
    namespace = None
    is_ns_object = group == "" and rest[0] == "namespaces" and (len(rest) <= 2 or rest[2] in ("status", "finalize"))
    if rest[0] == "namespaces" and len(rest) >= 3 and not is_ns_object:
        namespace, rest = rest[1], rest[2:]
    route = Route(group, version, rest[0], namespace)
    if len(rest) >= 2:
        route.name = rest[1]
    if len(rest) >= 3:
        route.subresource = rest[2]
        route.rest = "/".join(rest[3:])
    return route


def _verb(method: str, route: Route, params: dict[str, str]) -> str:
    if method == "GET":
        if route.name is None:
            return "watch" if params.get("watch", "").lower() in ("true", "1") else "list"
        return "get"
    if method == "DELETE" and route.name is None:
        return "deletecollection"
    return _VERB_BY_METHOD.get(method, method.lower())


def handle(api: KubeApiServer, req: _Handler) -> None:
    if api.latency_s:
        time.sleep(api.latency_s)
    path, query, params = req.query()
    user_agent = req.headers.get("User-Agent", "")
    user = api.authenticator.authenticate(req.headers.get("Authorization"))
    if user is None:
        req.read_body()
        api.store.record_request(RequestRecord("unauthorized", "", "", None, None, None, False, user_agent))
        raise ApiError(401, "Unauthorized", "Unauthorized")
    # Discovery and /version are open to every authenticated user (the system:discovery and
    # system:public-info-viewer bindings of every cluster).
    doc = _discovery(api, path)
    if doc is not None:
        api.store.record_request(RequestRecord("discovery", "", "", None, None, None, False, user_agent,
                                               user.name))
        req.send_json(200, doc)
        return
    route = parse_route(path)
    verb = _verb(req.command, route, params)
    body = req.read_body()
    dry_run = params.get("dryRun") == "All" or _body_dry_run(body, verb)
    attrs = request_attributes(user, verb, route, params)
    allowed = api.authorizer.allowed(attrs)
    api.store.record_request(RequestRecord(verb, route.group, route.resource, route.subresource, route.namespace,
                                           route.name, dry_run, user_agent, user.name, allowed))
    if not allowed:
        raise forbidden(attrs.resource, attrs.name, attrs.group, attrs.describe())
    fault = api.inject_fault()
    if fault is not None:
        raise fault
    mutation_fault = api.take_mutation_fault(verb, route.resource, dry_run)
    if mutation_fault == "drop":  # a network failure: the connection closes and no answer is sent
        req.close_connection = True
        return
    if mutation_fault == "conflict":
        raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on {route.resource} "
                                        f"\"{route.name or ''}\": injected conflict (sandbox fault api_conflict)")
    rtype = api.store.resource_type(route.group, route.resource)
    if route.version not in rtype.versions:
        _no_resource()
    if rtype.namespaced is False and route.namespace is not None:
        _no_resource()
    with acting_as(user, api.authorizer, route.name if verb != "create" else None):
        Request(api, req, route, rtype, params, query, body, dry_run).dispatch(verb)


def request_attributes(user: Any, verb: str, route: Route, params: dict[str, str]) -> Attributes:
    """Kubernetes' ``RequestInfo`` as RBAC sees it: ``resource/subresource``; a namespace object is in its own
    namespace; a list or watch narrowed by ``fieldSelector=metadata.name=<n>`` carries that name."""
    resource = f"{route.resource}/{route.subresource}" if route.subresource else route.resource
    namespace, name = route.namespace, route.name
    if route.group == "" and route.resource == "namespaces" and name:
        namespace = name
    if verb in ("list", "watch") and name is None:
        for term in (params.get("fieldSelector") or "").split(","):
            key, sep, value = term.partition("=")
            if key.strip() == "metadata.name" and sep and not value.startswith("="):
                name = value.strip()
            elif key.strip() == "metadata.name" and value.startswith("="):
                name = value[1:].strip()
    if verb == "create" and route.subresource is None:
        name = None
    return Attributes(user, verb, route.group, resource, namespace, name)


def _body_dry_run(body: bytes, verb: str) -> bool:
    if verb not in ("delete", "deletecollection") or not body:
        return False
    try:
        return "All" in (json.loads(body).get("dryRun") or [])
    except (ValueError, AttributeError):
        return False


class Request:
    """One resource request, after routing and authentication."""

    def __init__(self, api: KubeApiServer, req: _Handler, route: Route, rtype: ResourceType,
                 params: dict[str, str], query: str, body: bytes, dry_run: bool) -> None:
        self.api, self.store, self.req, self.route, self.rtype = api, api.store, req, route, rtype
        self.params, self.query, self.body, self.dry_run = params, query, body, dry_run

    # --- helpers --------------------------------------------------------------------------------------

    def out(self, obj: dict[str, Any]) -> dict[str, Any]:
        """An object as seen in the requested version (only apiVersion differs between versions)."""
        if obj.get("kind") == self.rtype.kind:
            obj["apiVersion"] = self.rtype.api_version(self.route.version)
        return obj

    def wants_table(self) -> bool:
        return "as=Table" in (self.req.headers.get("Accept") or "")

    def decode_body(self) -> Any:
        ctype = (self.req.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        try:
            if ctype == "application/vnd.kubernetes.protobuf":
                return protobuf.decode(self.body)
            if ctype in ("application/yaml", patching.APPLY_PATCH):
                return yaml.safe_load(self.body.decode() or "{}")
            return json.loads(self.body.decode() or "{}")
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(400, "BadRequest", f"the body of the request could not be decoded: {exc}") from None

    def ns(self) -> str | None:
        return self.route.namespace if self.rtype.namespaced else None

    def dispatch(self, verb: str) -> None:
        sub = self.route.subresource
        if sub == "proxy":
            return self.proxy()
        if sub == "log":
            return self.log()
        handler = {"get": self.get, "list": self.list, "watch": self.watch, "create": self.create,
                   "update": self.update, "patch": self.patch, "delete": self.delete,
                   "deletecollection": self.delete_collection}.get(verb)
        if handler is None:
            raise ApiError(405, "MethodNotAllowed", f"{verb} is not supported")
        if sub is not None and sub not in self.rtype.subresources:
            _no_resource()
        return handler()

    # --- verbs ----------------------------------------------------------------------------------------

    def get(self) -> None:
        name = self.route.name or ""
        if self.route.subresource == "scale":
            self.req.send_json(200, self.store.get_scale(self.rtype.group, self.rtype.plural, name, self.ns()))
            return
        obj = self.store.get(self.rtype.group, self.rtype.plural, name, self.ns())
        if obj is None:
            raise not_found(self.rtype.group, self.rtype.plural, name)
        obj = self.out(obj)
        if self.wants_table():
            self.req.send_json(200, discovery.table(self.rtype.kind, [obj], obj["metadata"]["resourceVersion"]))
            return
        self.req.send_json(200, obj)

    def list(self) -> None:
        rv = str(self.store.resource_version)
        items = [self.out(o) for o in self.store.list(
            self.rtype.group, self.rtype.plural, self.route.namespace,
            self.params.get("labelSelector"), self.params.get("fieldSelector"))]
        start = _decode_continue(self.params.get("continue"))
        limit = int(self.params.get("limit") or 0)
        page = items[start:start + limit] if limit else items[start:]
        meta: dict[str, Any] = {"resourceVersion": rv}
        if limit and start + limit < len(items):
            meta["continue"] = base64.urlsafe_b64encode(json.dumps({"start": start + limit}).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        if self.wants_table():
            table = discovery.table(self.rtype.kind, page, rv)
            table["metadata"] = meta
            self.req.send_json(200, table)
            return
        self.req.send_json(200, {"kind": f"{self.rtype.kind}List",
                                 "apiVersion": self.rtype.api_version(self.route.version),
                                 "metadata": meta, "items": page})

    def create(self) -> None:
        obj = self.decode_body()
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be an object")
        meta = obj.setdefault("metadata", {})
        if self.rtype.namespaced:
            if meta.get("namespace") and meta["namespace"] != self.route.namespace:
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                                                  "namespace sent on the request")
            meta["namespace"] = self.route.namespace or "default"
        created = self.store.create(self.rtype.group, self.rtype.plural, obj, dry_run=self.dry_run)
        self.req.send_json(201, self.out(created))

    def update(self) -> None:
        obj = self.decode_body()
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be an object")
        meta = obj.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != self.route.name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        meta["name"] = self.route.name
        if self.rtype.namespaced:
            meta["namespace"] = self.route.namespace
        if self.store.get(self.rtype.group, self.rtype.plural, self.route.name or "", self.ns()) is None \
                and self.route.subresource is None:
            meta.pop("resourceVersion", None)
            self.req.send_json(201, self.out(self.store.create(self.rtype.group, self.rtype.plural, obj,
                                                               dry_run=self.dry_run)))
            return
        updated = self.store.update(self.rtype.group, self.rtype.plural, obj,
                                    subresource=self.route.subresource, dry_run=self.dry_run)
        self.req.send_json(200, self.out(updated))

    def patch(self) -> None:
        ctype = (self.req.headers.get("Content-Type") or "").split(";")[0].strip()
        body = self.decode_body()
        result = self.store.patch(self.rtype.group, self.rtype.plural, self.route.name or "", self.ns(), body,
                                  ctype, subresource=self.route.subresource, dry_run=self.dry_run,
                                  field_manager=self.params.get("fieldManager"))
        self.req.send_json(200, self.out(result))

    def delete(self) -> None:
        name = self.route.name or ""
        if self.dry_run:
            obj = self.store.get(self.rtype.group, self.rtype.plural, name, self.ns())
        else:
            obj = self.store.delete(self.rtype.group, self.rtype.plural, name, self.ns())
        if obj is None:
            raise not_found(self.rtype.group, self.rtype.plural, name)
        self.req.send_json(200, {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "group": self.rtype.group, "kind": self.rtype.plural,
                        "uid": obj["metadata"].get("uid")}})

    def delete_collection(self) -> None:
        items = self.store.list(self.rtype.group, self.rtype.plural, self.route.namespace,
                                self.params.get("labelSelector"), self.params.get("fieldSelector"))
        if not self.dry_run:
            for obj in items:
                meta = obj["metadata"]
                self.store.delete(self.rtype.group, self.rtype.plural, meta["name"], meta.get("namespace"))
        self.req.send_json(200, {"kind": f"{self.rtype.kind}List", "apiVersion": self.rtype.api_version(),
                                 "metadata": {"resourceVersion": str(self.store.resource_version)},
                                 "items": [self.out(o) for o in items]})

    # --- watch ------------------------------------------------------------------------------------------

    def watch(self) -> None:
        watching.WatchStream(self).run()

    # --- pods/log and pod proxy -------------------------------------------------------------------------

    def _pod(self, name: str) -> dict[str, Any]:
        if self.rtype.key != ("", "pods"):
            _no_resource()
        pod = self.store.get("", "pods", name, self.route.namespace)
        if pod is None:
            raise not_found("", "pods", name)
        return pod

    def log(self) -> None:
        pod = self._pod(self.route.name or "")
        container = self.params.get("container") or None
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        if container and names and container not in names:
            raise ApiError(400, "BadRequest",
                           f"container {container} is not valid for pod {pod['metadata']['name']}")
        since_time = _parse_time(self.params.get("sinceTime"))
        since_seconds = int(self.params["sinceSeconds"]) if self.params.get("sinceSeconds") else None
        tail = int(self.params["tailLines"]) if self.params.get("tailLines") else None
        text = self.store.pod_log(self.route.namespace, pod["metadata"]["name"], container, since_time,
                                  since_seconds, tail) or ""
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail:] if tail > 0 else [])
        self.req.send_bytes(200, text.encode(), {"Content-Type": "text/plain"})

    def _port(self, pod: dict[str, Any], port: str | None) -> int:
        ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
        if port is None or port == "":
            return int(ports[0]["containerPort"]) if ports else 80
        if port.isdigit():
            return int(port)
        named = [p for p in ports if p.get("name") == port]
        if not named:
            raise ApiError(400, "BadRequest", f"no such port {port!r} on pod {pod['metadata']['name']}")
        return int(named[0]["containerPort"])

    def _forward(self, pod: str, port: int) -> ProxyResponse | None:
        """Hand the request to the pod's handler with ``received``: when the API server read it (plus the
        injected ``latency_s``, which a slow network would add before the pod sees it), in ``time.monotonic()``."""
        return self.store.pod_proxy(self.route.namespace, pod, port, self.req.command, "/" + self.route.rest,
                                    self.query, dict(self.req.headers.items()), self.body,
                                    received=self.req.received + self.api.latency_s)

    def _pod_proxy(self, raw: str) -> ProxyResponse:
        name, _, port = raw.partition(":")
        resp = self._forward(name, self._port(self._pod(name), port or None))
        if resp is None:
            raise ApiError(503, "ServiceUnavailable",
                           f'no endpoints available for pod "{name}": no handler serves this pod')
        return resp

    def _service_proxy(self, raw: str) -> ProxyResponse:
        """One Ready endpoint of the Service. A pod deleted between the choice and the delivery would, on a real
        cluster, still be running its termination grace period and answer; the twin deletes at once, so the
        request goes to another Ready endpoint instead (a few tries), never to a pod that is gone."""
        namespace = self.route.namespace or "default"
        for _ in range(3):
            backend = services.resolve(self.store, namespace, raw)
            resp = self._forward(backend.pod, backend.port)
            if resp is not None:
                return resp
            if self.store.get("", "pods", backend.pod, namespace) is not None:
                break
        raise ApiError(503, "ServiceUnavailable", f'error trying to reach service: pod "{backend.pod}" does not '
                                                  f"answer on port {backend.port}")

    def proxy(self) -> None:
        """``pods/{name}[:port]/proxy/...`` to that pod, or ``services/{id}/proxy/...`` to one Ready endpoint of the
        Service (``services.resolve``); both end in the store's pod-proxy handlers."""
        if self.req.command not in PROXY_METHODS:
            raise ApiError(405, "MethodNotAllowed", f"{self.req.command} is not supported by the proxy subresource")
        raw = self.route.name or ""
        resp = self._service_proxy(raw) if self.rtype.key == ("", "services") else self._pod_proxy(raw)
        if isinstance(resp.body, bytes | bytearray):
            self.req.send_bytes(resp.status, bytes(resp.body), resp.headers)
            return
        self.req.start_chunked(resp.status, resp.headers)
        for chunk in resp.body:
            self.req.write_chunk(chunk.encode() if isinstance(chunk, str) else chunk)
        self.req.end_chunked()


def _decode_continue(token: str | None) -> int:
    if not token:
        return 0
    try:
        return int(json.loads(base64.urlsafe_b64decode(token.encode()))["start"])
    except (ValueError, KeyError, TypeError):
        raise ApiError(400, "BadRequest", "invalid continue token") from None


def _parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ApiError(400, "BadRequest", f"invalid sinceTime {value!r}: want RFC3339") from None
