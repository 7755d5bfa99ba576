"""The ``fail_write`` fault of the sandbox's admin API: the Nth write of one resource kind (optionally one object)
of a cluster is refused with a chosen status, once. It replaces test hooks in product code such as "fail the
rollout right after the wave is scaled down": counting the wave's Deployment writes, the product's own scale-downs
go through and the write after them fails, exactly as an API server that starts refusing would make it fail.

What counts as a write: every UPDATE that passes admission on the cluster's API store, i.e. each PUT or PATCH of
the object through the API server (the product's, kubectl's, helm's), each write of its ``scale`` subresource,
and writes of in-cluster controllers that go through admission (the Inference Operator's re-render, which a real
API server also admits). Status writes and the simulated controllers' own bookkeeping do not pass admission and do
not count. CREATE and DELETE do not count.

Armed through ``POST /fault {"kind": "fail_write", ...}`` (``kvfleet_sandbox.admin``); ``clear`` disarms it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from kvfleet_sandbox.kube.errors import ApiError
from kvfleet_sandbox.kube.store import KubeStore

# The statuses a test may ask for, with the reason Kubernetes gives each (metav1.StatusReason).
REASONS = {409: "Conflict", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
           503: "ServiceUnavailable"}


@dataclass
class _Armed:
    resource: str
    nth: int
    code: int
    name: str | None
    namespace: str | None
    seen: int = 0

    def matches(self, resource: str, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return (resource == self.resource and self.name in (None, meta.get("name"))
                and self.namespace in (None, meta.get("namespace")))


class WriteFaults:
    """The armed ``fail_write`` faults of one cluster's store (an admission hook, inert while none is armed)."""

    def __init__(self, store: KubeStore) -> None:
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []
        store.add_admission(self._admit)

    def arm(self, resource: str, nth: int, code: int = 500, name: str | None = None,
            namespace: str | None = None) -> dict[str, Any]:
        if nth < 1:
            raise ValueError(f"nth must be at least 1 (the first write is 1), not {nth}")
        if code not in REASONS:
            raise ValueError(f"code must be one of {', '.join(map(str, REASONS))}, not {code}")
        with self._lock:
            self._armed.append(_Armed(resource, nth, code, name, namespace))
            return {"armed": [self._describe(a) for a in self._armed]}

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()

    def armed(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._describe(a) for a in self._armed]

    @staticmethod
    def _describe(a: _Armed) -> dict[str, Any]:
        return {"resource": a.resource, "nth": a.nth, "code": a.code, "name": a.name, "namespace": a.namespace,
                "seen": a.seen}

    def _admit(self, op: str, group: str, resource: str, new: dict[str, Any],
               old: dict[str, Any] | None) -> dict[str, Any] | None:
        if op != "UPDATE":
            return None
        with self._lock:
            for armed in list(self._armed):
                if not armed.matches(resource, new):
                    continue
                armed.seen += 1
                if armed.seen == armed.nth:
                    self._armed.remove(armed)
                    name = (new.get("metadata") or {}).get("name", "")
                    raise ApiError(armed.code, REASONS[armed.code],
                                   f'{resource} "{name}": write {armed.nth} refused (sandbox fault fail_write)')
        return None
