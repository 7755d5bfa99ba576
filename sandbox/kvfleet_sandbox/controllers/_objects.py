"""Small pieces the workload, operator and Kyverno simulations share: the reconcile loop thread, owner
references, model-time stamps, Events and quantity parsing.

Private to ``kvfleet_sandbox.controllers``: each controller module builds on :class:`ReconcileLoop` (one thread,
woken by store events, ticking on the twin's model clock) so that every simulated controller stops the same way.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from kvfleet_sandbox.kube.errors import ApiError
from kvfleet_sandbox.kube.store import KubeStore
from kvfleet_sandbox.twin import Clock

log = logging.getLogger(__name__)

MIN_WAIT_S = 0.005  # real seconds: a floor so a busy model clock cannot spin a core


_LOOP_THREAD = threading.local()


def in_controller_loop() -> bool:
    """Whether the calling thread is a simulated controller's own loop (not a client request's handler)."""
    return bool(getattr(_LOOP_THREAD, "active", False))


class ReconcileLoop:
    """One daemon thread running ``pass_fn`` when woken (store events) or every ``tick_model_s`` model seconds.

    ``pass_fn`` returns the model seconds until it next has something due (a pod finishing start-up), or None;
    the loop sleeps until the earlier of that and the tick. Exceptions are logged and the loop goes on: a
    simulated controller that dies silently would freeze the fleet in a state no real cluster reaches.
    """

    def __init__(self, name: str, clock: Clock, tick_model_s: float, pass_fn: Callable[[], float | None]) -> None:
        self._clock = clock
        self._tick = tick_model_s
        self._pass = pass_fn
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Condition()
        self._passes = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self, *_: Any) -> None:
        self._wake.set()

    def _run(self) -> None:
        _LOOP_THREAD.active = True
        while not self._stop.is_set() and not self._clock.stopped:
            self._wake.clear()
            due: float | None = None
            try:
                due = self._pass()
            except Exception:
                log.exception("%s: reconcile pass failed", self._thread.name)
            with self._done:
                self._passes += 1
                self._done.notify_all()
            model_wait = self._tick if due is None else max(0.0, min(self._tick, due))
            self._wake.wait(max(MIN_WAIT_S, self._clock.real(model_wait)))

    @property
    def passes(self) -> int:
        """How many passes have finished (failed ones included)."""
        return self._passes

    def wait_passes(self, n: int, timeout: float) -> bool:
        """Block until ``n`` passes have finished in all, or ``timeout`` real seconds went by (then False)."""
        with self._done:
            return self._done.wait_for(lambda: self._passes >= n, timeout)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


def stamp(clock: Clock, model_epoch: float | None = None) -> str:
    """RFC 3339 of a model-time instant (what the controllers write into status timestamps)."""
    value = clock.now() if model_epoch is None else model_epoch
    return dt.datetime.fromtimestamp(value, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def owner_ref(obj: dict[str, Any], *, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": controller, "blockOwnerDeletion": True}


def controller_uid(obj: dict[str, Any], kind: str | None = None) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and (kind is None or ref.get("kind") == kind):
            uid = ref.get("uid")
            return str(uid) if uid is not None else None
    return None


def uid_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


def create_quietly(store: KubeStore, group: str, resource: str, obj: dict[str, Any]) -> dict[str, Any] | None:
    """Create, treating AlreadyExists as done (controllers are idempotent); other refusals are logged."""
    try:
        return store.create(group, resource, obj)
    except ApiError as err:
        if err.reason != "AlreadyExists":
            log.warning("%s: creating %s %s refused: %s", store.cluster_name, resource,
                        obj.get("metadata", {}).get("name"), err.message)
        return None


def delete_quietly(store: KubeStore, group: str, resource: str, name: str, namespace: str | None) -> None:
    try:
        store.delete(group, resource, name, namespace)
    except ApiError as err:
        log.debug("%s: deleting %s %s: %s", store.cluster_name, resource, name, err.message)


def ensure_namespace(store: KubeStore, name: str, labels: dict[str, str] | None = None) -> None:
    if store.get("", "namespaces", name) is None:
        create_quietly(store, "", "namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": name, "labels": dict(labels or {})}})


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40}


def quantity(value: Any) -> float:
    """A Kubernetes resource quantity as a number ("1" → 1, "500m" → 0.5, "10Gi" → 10737418240)."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    match = _QUANTITY.match(str(value).strip())
    if not match or match.group(2) not in _SUFFIX:
        return 0.0
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def is_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def is_terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class EventRecorder:
    """Writes core/v1 Events once per (object, reason, message), as ``kubectl describe`` shows them."""

    def __init__(self, store: KubeStore, clock: Clock, component: str) -> None:
        self._store = store
        self._clock = clock
        self._component = component
        self._sent: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        self._seq = 0

    def record(self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = True) -> None:
        meta = obj["metadata"]
        key = (meta.get("uid", ""), reason, message)
        with self._lock:
            if key in self._sent:
                return
            self._sent.add(key)
            self._seq += 1
            seq = self._seq
        namespace = meta.get("namespace") or "default"
        when = stamp(self._clock)
        create_quietly(self._store, "", "events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{seq:08x}{abs(hash(key)) % 0xFFFFFF:06x}", "namespace": namespace},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta["name"],
                               "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
            "source": {"component": self._component}, "reportingComponent": self._component,
            "firstTimestamp": when, "lastTimestamp": when, "count": 1,
        })
