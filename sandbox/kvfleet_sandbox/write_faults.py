"""The ``fail_write`` fault of the sandbox's admin API: the Nth write of one resource kind (optionally one object)
of a cluster is refused with a chosen status, once. It replaces test hooks in product code such as "fail the
rollout right after the wave is scaled down": counting the wave's Deployment writes, the product's own scale-downs
go through and the write after them fails, exactly as an API server that starts refusing would make it fail.

What counts as a write: each PUT or PATCH of the object by a client of the cluster's API (``KubeStore.update``
and ``KubeStore.patch`` outside the simulated controllers' own loops): the product's, kubectl's and helm's
requests, including writes of the ``scale`` subresource. The simulated controllers' writes (the Inference
Operator's re-render, made from its ``ReconcileLoop``) do not count, so that ``nth`` counts what the client under
test does whatever the controllers do meanwhile; server dry runs (``dryRun=All``, e.g. the product's pre-pause patch
check), ``status`` writes, CREATE and DELETE do not count either.

Armed through ``POST /fault {"kind": "fail_write", ...}`` (``kvfleet_sandbox.admin``); ``clear`` disarms it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from kvfleet_sandbox.controllers._objects import in_controller_loop
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

    def matches(self, resource: str, name: str | None, namespace: str | None) -> bool:
        return (resource == self.resource and self.name in (None, name)
                and self.namespace in (None, namespace))


class WriteFaults:
    """The armed ``fail_write`` faults of one cluster's store: wraps its ``update`` and ``patch`` (inert while none
    is armed)."""

    def __init__(self, store: KubeStore) -> None:
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []
        update, patch = store.update, store.patch

        def counted_update(group: str, resource: str, obj: dict[str, Any], *, subresource: str | None = None,
                           dry_run: bool = False) -> dict[str, Any]:
            if not dry_run and subresource in (None, "scale") and not in_controller_loop():
                meta = obj.get("metadata") or {}
                self._count(resource, meta.get("name"), meta.get("namespace"))
            return update(group, resource, obj, subresource=subresource, dry_run=dry_run)

        def counted_patch(group: str, resource: str, name: str, namespace: str | None, patch_body: Any,
                          patch_type: str, *, subresource: str | None = None, dry_run: bool = False,
                          field_manager: str | None = None) -> dict[str, Any]:
            if not dry_run and subresource in (None, "scale") and not in_controller_loop():
                self._count(resource, name, namespace)
            return patch(group, resource, name, namespace, patch_body, patch_type, subresource=subresource,
                         dry_run=dry_run, field_manager=field_manager)

        setattr(store, "update", counted_update)  # noqa: B010 (an instance attribute shadows the method)
        setattr(store, "patch", counted_patch)  # noqa: B010

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

    def _count(self, resource: str, name: str | None, namespace: str | None) -> None:
        """Count one write; raise the armed refusal if it is the nth."""
        with self._lock:
            for armed in list(self._armed):
                if not armed.matches(resource, name, namespace):
                    continue
                armed.seen += 1
                if armed.seen == armed.nth:
                    self._armed.remove(armed)
                    raise ApiError(armed.code, REASONS[armed.code],
                                   f'{resource} "{name}": write {armed.nth} refused (sandbox fault fail_write)')
