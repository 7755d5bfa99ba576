"""``KubeWatchTrigger``: the drift watch of one cluster, in the triggerer.

Run by ``kvfleet.airflow.triggers.fleet_watch.FleetWatchTrigger``, one per inventory cluster. What it watches and
which change it reports are ``kvfleet.fleet.watch_rules``' (pure); this module is the I/O around them: the
official Kubernetes client's list and watch per collection, in daemon threads feeding an ``asyncio.Queue``, the
watermark in the asset's state store, and the events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from kvfleet.airflow.triggers.events import CHANGED, ERROR, classpath, event
from kvfleet.clients.identity import Identity
from kvfleet.fleet.cluster_ref import DEFAULT_ACCOUNT, ClusterRef
from kvfleet.fleet.constants import IEC_GROUP, IEC_PLURAL, IEC_VERSION
from kvfleet.fleet.watch_rules import WATCHED, Burst, Seen, Watched, judge, resync

log = logging.getLogger(__name__)
T = TypeVar("T")

# A stream's first list: an API server that accepts and never answers fails the start. Per try: the client's
# urllib3 retries a timed-out GET up to 3 times (its default), so a stalled server fails it after about 4 minutes.
LIST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Stream:
    """One watched collection (``watched``: its rules) and the client call that lists and watches it:
    ``access.<api>.<method>(*args)``."""

    watched: Watched
    api: str
    method: str
    args: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return self.watched.kind


def streams(curvine_namespace: str = "curvine") -> tuple[Stream, ...]:
    """What the drift watch watches on one cluster (``kvfleet.fleet.watch_rules.WATCHED``), as client calls."""
    calls: dict[str, tuple[str, str, tuple[str, ...]]] = {
        "InferenceEndpointConfig": ("custom", "list_cluster_custom_object", (IEC_GROUP, IEC_VERSION, IEC_PLURAL)),
        "Deployment": ("apps", "list_deployment_for_all_namespaces", ()),
        "Pod": ("core", "list_pod_for_all_namespaces", ()),
        "Secret": ("core", "list_namespaced_secret", (curvine_namespace,)),
    }
    return tuple(Stream(w, *calls[w.kind]) for w in WATCHED)


async def next_or_none(queue: asyncio.Queue[T], timeout_s: float) -> T | None:
    """The queue's next item, or None after ``timeout_s``. Not ``asyncio.wait_for``: on Python 3.11 it swallows a
    cancellation that arrives in the loop iteration in which the item does (CPython gh-86296, fixed in 3.12 by
    building ``wait_for`` on ``asyncio.timeout``). A watch's queue fills with every pod and bookmark event, so the
    triggerer's cancellation of a busy watch was lost now and then, and the watch ran on after its trigger was
    gone (``tests/unit/test_watch_queue.py``). ``asyncio.timeout`` tells its own timeout from a cancellation."""
    try:
        async with asyncio.timeout(timeout_s):
            return await queue.get()
    except TimeoutError:
        return None


class _Watcher:
    """One stream: its first list (``first_list``, called by the trigger's start), then its watch loop in a daemon
    thread (the official client's watch is blocking), feeding ``(kind, type, object)`` items to the trigger's
    queue. Resumes from ``rv``; a 410 Gone re-lists, in the thread."""

    def __init__(self, stream: Stream, access: Any, rv: str | None, put: Callable[[tuple[str, str, Any]], None],
                 timeout_s: int) -> None:
        self.stream, self.access, self.rv, self.put, self.timeout_s = stream, access, rv, put, timeout_s
        self.stop = threading.Event()
        self.refused = False  # its first list was refused (401/403): a FAILED item is queued
        self.watch: Any = None
        self.thread = threading.Thread(target=self._run, name=f"kvfleet-watch-{stream.kind}", daemon=True)

    def _fn(self) -> Callable[..., Any]:
        return getattr(getattr(self.access, self.stream.api), self.stream.method)  # type: ignore[no-any-return]

    def _kwargs(self) -> dict[str, Any]:
        selector = self.stream.watched.selector
        return {"label_selector": selector} if selector else {}

    def relist(self, timeout_s: float | None = None) -> None:
        timeout = {} if timeout_s is None else {"_request_timeout": (min(10.0, timeout_s), timeout_s)}
        resp = self._fn()(*self.stream.args, _preload_content=False, **timeout, **self._kwargs())
        try:
            raw = json.loads(resp.data or b"{}")
        finally:
            resp.release_conn()
        for obj in raw.get("items") or []:
            self.put((self.stream.kind, "LISTED", obj))
        self.rv = str((raw.get("metadata") or {}).get("resourceVersion") or "") or None

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        while not self.stop.is_set():
            try:
                if self.rv is None:
                    self.relist()
                self.watch = watch.Watch()
                for item in self.watch.stream(self._fn(), *self.stream.args, resource_version=self.rv,
                                              allow_watch_bookmarks=True, timeout_seconds=self.timeout_s,
                                              **self._kwargs()):
                    # raw_object: the dict as sent. (deserialize=False would skip building models, but the
                    # client's own 410 handling then reads a "raw_object" key that plain JSON lacks: KeyError.)
                    obj = item.get("raw_object") or {}
                    self.rv = str((obj.get("metadata") or {}).get("resourceVersion") or self.rv)
                    self.put((self.stream.kind, str(item.get("type")), obj))
                    if self.stop.is_set():
                        break
            except ApiException as exc:
                if self._failed(exc):
                    return
            except Exception as exc:  # network: back off, resume from self.rv
                log.warning("[%s] watch interrupted (%s), resuming from %s", self.stream.kind, exc, self.rv)
                self.stop.wait(1.0)

    def first_list(self) -> bool:
        """The stream's list before its watch thread starts, fresh or resumed, ``LIST_TIMEOUT_S`` a try: False
        when the stream is not to be watched (404: not served; 401/403: refused, reported as a ``FAILED`` item,
        and ``refused`` set). Any other failure (5xx, network, an API server that does not answer) raises, so that
        the watch's start fails and the fleet watch reports it and starts it again later, rather than a thread
        retrying unseen."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.relist(timeout_s=LIST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status in (401, 403):
                self.refused = True
            if exc.status in (401, 403, 404):
                self._failed(exc)
                return False
            raise
        return True

    def _failed(self, exc: Any) -> bool:
        if exc.status == 410:  # too old resource version: the history moved on; re-list
            log.info("[%s] 410 Gone at resourceVersion %s: re-listing", self.stream.kind, self.rv)
            self.rv = None
            self.put((self.stream.kind, "RESYNC", {}))
            return False
        if exc.status == 404:  # the type is not served (the operator's CRD not installed yet): nothing to watch
            log.warning("[%s] not served by this cluster: not watched (the drift check reports it)",
                        self.stream.kind)
            self.stop.set()
            return True
        if exc.status in (401, 403):
            try:
                detail = str(json.loads(exc.body or "{}").get("message") or exc.reason)
            except (TypeError, ValueError):
                detail = str(exc.reason)
            self.put((self.stream.kind, "FAILED", {"status": exc.status, "reason": detail}))
            return True
        log.warning("[%s] watch error %s, retrying", self.stream.kind, exc.status)
        self.stop.wait(1.0)
        return False


class KubeWatchTrigger(BaseEventTrigger):
    """A Kubernetes watch on one cluster for the drift check ("event-driven drift").

    Watches the InferenceEndpointConfigs, Deployments and Pods kvfleet manages (``managed-by=kvfleet``), the
    Inference Operator's controller Deployment and Curvine's Helm release Secrets (``owner=helm``, release name
    ``curvine*``), each with ``resourceVersion`` and ``allowWatchBookmarks``: a bookmark advances the version
    without an object, a 410 Gone re-lists (and reports a ``resync``: changes may have been missed). Which change
    counts is ``kvfleet.fleet.watch_rules.judge``'s: one that changes what the desired state covers (labels,
    annotations, spec / data; a status update does not) and that kvfleet's field manager did not write.

    One ``TriggerEvent`` per burst: after ``quiet_s`` without a further change (or ``max_burst_s`` of steady
    churn). Its payload names the cluster, so the DAG scheduled on the asset checks that cluster only.

    Restart: Airflow identifies an event trigger by its classpath and kwargs, so ``serialize()`` returns the
    constructor's kwargs. The watermark (each stream's last resourceVersion) goes to the asset's state store after
    every event (``asset_state_store``, injected by the triggerer); a restarted trigger resumes each watch from it
    (or from ``resource_versions`` passed in). A resumed watch compares replayed versions with a fresh list, so a
    change made while no triggerer ran still fires."""

    def __init__(self, cluster: str, region: str, *, identity: Mapping[str, Any] | None = None,
                 curvine_namespace: str = "curvine", quiet_s: float = 15.0, max_burst_s: float = 120.0,
                 watch_timeout_s: int = 300, resource_versions: Mapping[str, str] | None = None,
                 aws_conn_id: str | None = "aws_default", account: str = DEFAULT_ACCOUNT) -> None:
        """``identity``: who the watch reaches the cluster as (``Identity.as_dict``); ``aws_conn_id`` and
        ``account`` are read only without it (a trigger serialized before the identity was passed)."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.cluster, self.region = cluster, region
        self.identity = Identity.from_dict(identity) if identity else Identity(account=account, conn_id=aws_conn_id)
        self.ref = ClusterRef(self.identity.account, region, cluster)
        self.curvine_namespace = curvine_namespace
        self.quiet_s, self.max_burst_s, self.watch_timeout_s = float(quiet_s), float(max_burst_s), watch_timeout_s
        self.resource_versions: dict[str, str] = dict(resource_versions or {})
        self._watchers: list[_Watcher] = []
        self._access: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath(self), {"cluster": self.cluster, "region": self.region, "identity": self.identity.as_dict(),
                                 "curvine_namespace": self.curvine_namespace, "quiet_s": self.quiet_s,
                                 "max_burst_s": self.max_burst_s,
                                 "watch_timeout_s": self.watch_timeout_s,
                                 "resource_versions": dict(self.resource_versions)}

    def ready(self) -> bool:
        """Every stream listed (or resumed) and watching: a change from now on is seen."""
        return len(self._watchers) == len(streams(self.curvine_namespace)) and \
            all(w.rv or w.stop.is_set() for w in self._watchers)

    def checkpoint(self) -> tuple[str, dict[str, Any]]:
        """``serialize()`` with the watermark reached so far: a trigger re-created from it resumes there."""
        path, kwargs = self.serialize()
        kwargs["resource_versions"] = {w.stream.kind: w.rv for w in self._watchers if w.rv} or \
            kwargs["resource_versions"]
        return path, kwargs

    def _connect(self) -> Any:
        from kvfleet.clients.factory import kube_for

        return kube_for(self.ref, self.identity)

    async def _saved_versions(self) -> dict[str, str]:
        store = getattr(self, "asset_state_store", None)
        if store is not None:
            try:
                saved = await store.aget("resource_versions")
                if isinstance(saved, dict):
                    return {str(k): str(v) for k, v in saved.items()}
            except Exception as exc:  # the store is an optimisation: a fresh list is always correct
                self.log.warning("[%s] no saved resourceVersions: %s", self.cluster, exc)
        return dict(self.resource_versions)

    async def _save_versions(self, versions: dict[str, str]) -> None:
        self.resource_versions = versions
        store = getattr(self, "asset_state_store", None)
        if store is not None:
            try:
                await store.aset("resource_versions", versions)
            except Exception as exc:
                self.log.warning("[%s] resourceVersions not saved: %s", self.cluster, exc)

    async def _start(self, queue: asyncio.Queue[tuple[str, str, Any]]) -> None:
        loop = asyncio.get_running_loop()
        saved = await self._saved_versions()
        self._access = await asyncio.to_thread(self._connect)

        def put(item: tuple[str, str, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: this trigger has ended
                loop.call_soon_threadsafe(queue.put_nowait, item)

        for stream in streams(self.curvine_namespace):
            watcher = _Watcher(stream, self._access, saved.get(stream.kind), put, self.watch_timeout_s)
            self._watchers.append(watcher)
            # The current state first: the watch starts from the list's version, or, resuming, from the saved
            # one, its replayed versions compared with the list.
            if await asyncio.to_thread(watcher.first_list):
                if stream.kind in saved:
                    watcher.rv = saved[stream.kind]
                watcher.thread.start()
            elif watcher.refused:  # the FAILED item ends the run: the other streams are not started
                return

    async def run(self) -> AsyncIterator[TriggerEvent]:
        queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue()
        seen: Seen = {}
        kinds = {s.kind: s for s in streams(self.curvine_namespace)}
        burst = Burst()
        try:
            await self._start(queue)
            while True:
                item = await next_or_none(queue, min(self.quiet_s, 1.0))
                if item is not None:
                    failure = self._judge(item, kinds, seen, burst)
                    if failure is not None:
                        yield failure
                        return
                if burst.due(time.monotonic(), self.quiet_s, self.max_burst_s):
                    yield await self._emit(burst)
                    burst = Burst()
        finally:
            await self.cleanup()

    def _judge(self, item: tuple[str, str, Any], kinds: Mapping[str, Stream], seen: Seen,
               burst: Burst) -> TriggerEvent | None:
        """One queued item: a refusal ends the watch (the returned ``error`` event); a re-list or a change that
        ``watch_rules.judge`` reports joins the burst."""
        kind, etype, obj = item
        if etype == "FAILED":
            return event({"status": ERROR, "cluster": self.cluster, "kind": kind, "http_status": obj["status"],
                          "message": f"watching {kind} on {self.cluster} refused: HTTP {obj['status']} "
                                     f"{obj['reason']}; check kvfleet's RBAC (k8s/rbac) for list/watch"})
        if etype == "RESYNC":
            burst.add(resync(kind), time.monotonic())
            return None
        change = judge(kinds[kind].watched, etype, obj, seen)
        if change is not None:
            self.log.info("[%s] %s %s %s (rv %s)%s", self.cluster, change.kind, change.type, change.object,
                          change.resource_version, change.detail)
            burst.add(change, time.monotonic())
        return None

    async def _emit(self, burst: Burst) -> TriggerEvent:
        versions = {w.stream.kind: w.rv for w in self._watchers if w.rv}
        await self._save_versions(versions)
        return event({"status": CHANGED, "cluster": self.cluster, "changes": len(burst.changes),
                      "objects": burst.objects(), "burst_s": round(burst.last_at - burst.first_at, 3),
                      "emitted_at": datetime.now(UTC).isoformat(), "resource_versions": versions})

    async def cleanup(self) -> None:
        for watcher in self._watchers:
            watcher.stop.set()
            if watcher.watch is not None:
                watcher.watch.stop()
        self._watchers = []
        if self._access is not None:
            access, self._access = self._access, None
            await asyncio.to_thread(access.close)
