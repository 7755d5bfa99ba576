"""Watch streams (``?watch=1`` / ``watch=true``) as kube-apiserver's watch cache serves them; facts and sources in
``tests/conformance/facts/kube_watch.yaml``.

Called from ``routing.Request.watch``. One stream, one thread: chunked JSON lines ``{"type", "object"}`` until
``timeoutSeconds`` ends it (no ``timeoutSeconds``: a random duration in [1800 s, 3600 s), the apiserver's
min-request-timeout rule), or the server stops. What clients rely on:

- **resourceVersion**: empty or "0" start with an ADDED event per current object; ``N`` replays every change after
  ``N`` from the store's history, then streams live changes. A version older than the history holds is answered
  with HTTP 200 and one ``ERROR`` event carrying a 410 ``Expired`` Status ("too old resource version"), which
  makes client-go's reflector re-list (the cacher's ``newErrWatcher``).
- **sendInitialEvents=true** (WatchList, KEP-3157): ADDED events for the current objects, then a BOOKMARK
  annotated ``k8s.io/initial-events-end``.
- **allowWatchBookmarks=true**: a BOOKMARK (an object of the kind with only ``metadata.resourceVersion``)
  roughly every ``KubeApiServer.bookmark_interval_s`` (60 s, the cacher's frequency) and 2 s before the deadline,
  sent only while no change is pending, so its version is never ahead of an undelivered event.
- **selectors**: a MODIFIED object that stops matching the label/field selector is sent as DELETED, one that
  starts matching as ADDED (the cacher's ``convertToWatchEvent``).
"""

from __future__ import annotations

import json
import queue
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvfleet_sandbox.kube import discovery
from kvfleet_sandbox.kube.documents import clone
from kvfleet_sandbox.kube.errors import ApiError
from kvfleet_sandbox.kube.label_selectors import field_matcher, label_matcher
from kvfleet_sandbox.kube.store import WatchEvent

if TYPE_CHECKING:
    from kvfleet_sandbox.kube.routing import Request

MIN_REQUEST_TIMEOUT_S = 1800.0  # kube-apiserver --min-request-timeout default
PRE_TIMEOUT_BOOKMARK_S = 2.0
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
Matcher = Callable[[dict[str, Any]], bool]


def _flag(params: dict[str, str], name: str) -> bool:
    return params.get(name, "").lower() in ("true", "1")


def timeout_of(params: dict[str, str]) -> float:
    """``timeoutSeconds`` (a non-negative integer; 400 otherwise), or the apiserver's randomized default."""
    raw = params.get("timeoutSeconds")
    if raw in (None, ""):
        return MIN_REQUEST_TIMEOUT_S * (1.0 + random.random())
    if not raw.isdigit():
        raise ApiError(400, "BadRequest", f"invalid timeoutSeconds {raw!r}: want a non-negative integer "
                                          "number of seconds, e.g. timeoutSeconds=300")
    return float(raw)


def _expired(err: ApiError) -> dict[str, Any]:
    return {"type": "ERROR", "object": err.status()}


class WatchStream:
    """One watch request's stream over the store's change queue."""

    def __init__(self, request: Request) -> None:
        self.request = request
        params = request.params
        self.by_label: Matcher = label_matcher(params.get("labelSelector"))
        self.by_field: Matcher = field_matcher(params.get("fieldSelector"))
        self.timeout = timeout_of(params)
        self.bookmarks = _flag(params, "allowWatchBookmarks")
        self.streaming = _flag(params, "sendInitialEvents")
        self.table = request.wants_table()
        self.key = request.rtype.key

    # --- framing ------------------------------------------------------------------------------------------

    def _write(self, event: dict[str, Any]) -> None:
        self.request.req.write_chunk(json.dumps(event).encode() + b"\n")

    def _bookmark(self, rv: int, *, initial_end: bool = False) -> None:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        rtype = self.request.rtype
        self._write({"type": "BOOKMARK", "object": {
            "kind": rtype.kind, "apiVersion": rtype.api_version(self.request.route.version), "metadata": meta}})

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        ns = (obj.get("metadata") or {}).get("namespace")
        route = self.request.route
        if route.namespace and self.request.rtype.namespaced and ns != route.namespace:
            return False
        return self.by_label(obj) and self.by_field(obj)

    def _type_for(self, ev: WatchEvent) -> str | None:
        now, before = self._matches(ev.obj), ev.prev is not None and self._matches(ev.prev)
        if ev.type != "MODIFIED" or ev.prev is None:
            return ev.type if now else None
        if now:
            return "MODIFIED" if before else "ADDED"
        return "DELETED" if before else None

    def send(self, ev: WatchEvent) -> None:
        kind = self._type_for(ev)
        if kind is None:
            return
        obj = self.request.out(clone(ev.obj))
        if self.table:
            obj = discovery.table(self.request.rtype.kind, [obj], obj["metadata"].get("resourceVersion", ""))
        self._write({"type": kind, "object": obj})

    # --- the stream ---------------------------------------------------------------------------------------

    def run(self) -> None:
        req, store = self.request.req, self.request.store
        since = None if self.streaming else self.request.params.get("resourceVersion")
        deadline = time.monotonic() + self.timeout
        try:
            q, initial = store.open_watch(*self.key, since)
        except ApiError as err:
            if err.code != 410:
                raise
            req.start_chunked(200, {"Content-Type": "application/json"})
            self._write(_expired(err))
            req.end_chunked()
            req.close_connection = True
            return
        try:
            req.start_chunked(200, {"Content-Type": "application/json"})
            for ev in initial:
                self.send(ev)
            if self.streaming:
                self._bookmark(max([ev.rv for ev in initial], default=store.resource_version), initial_end=True)
            self._follow(q, deadline)
            req.end_chunked()
        finally:
            store.close_watch(q)
        req.close_connection = True

    def _next_bookmark(self, now: float, deadline: float) -> float:
        interval = self.request.api.bookmark_interval_s
        return min(now + interval, deadline - PRE_TIMEOUT_BOOKMARK_S)

    def _follow(self, q: queue.Queue[WatchEvent | None], deadline: float) -> None:
        api, store = self.request.api, self.request.store
        next_bookmark = self._next_bookmark(time.monotonic(), deadline)
        while not api.stopping.is_set():
            now = time.monotonic()
            if now >= deadline:
                return
            if self.bookmarks and now >= next_bookmark and q.empty():
                self._bookmark(store.resource_version)
                next_bookmark = self._next_bookmark(now, deadline) if now < deadline - PRE_TIMEOUT_BOOKMARK_S \
                    else deadline
            wait = min(0.25, max(0.01, min(deadline, next_bookmark if self.bookmarks else deadline) - now))
            try:
                ev = q.get(timeout=wait)
            except queue.Empty:
                continue
            if ev is None:
                return
            if (ev.group, ev.resource) == self.key:
                self.send(ev)
