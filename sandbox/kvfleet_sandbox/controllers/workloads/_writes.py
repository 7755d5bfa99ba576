"""The writes the workload controllers share: a pod made from a template, a pod failed, an annotation, a status
(written only when it changed, and never onto a newer object of the same name), and a generated name.

Used only inside ``kvfleet_sandbox.controllers.workloads``; one per cluster twin, shared by its controllers.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from kvfleet_sandbox.controllers._objects import EventRecorder, create_quietly, owner_ref, stamp, uid_of
from kvfleet_sandbox.controllers.workloads._cache import SAFE_ALPHABET
from kvfleet_sandbox.kube.errors import ApiError
from kvfleet_sandbox.twin import ClusterTwin

log = logging.getLogger(__name__)


class ObjectWriter:
    """Writes to one cluster twin's store, with the events and the model clock its controllers share."""

    def __init__(self, twin: ClusterTwin) -> None:
        self.twin = twin
        self.store = twin.store
        self.clock = twin.clock
        self.events = EventRecorder(twin.store, twin.clock, "default-scheduler")

    def random_suffix(self, prefix: str) -> str:
        """``<prefix>-`` and five characters of Kubernetes' name alphabet, from the twin's seeded generator."""
        return f"{prefix}-" + "".join(self.twin.rng.choice(SAFE_ALPHABET) for _ in range(5))

    def create_pod(self, owner: dict[str, Any], template: dict[str, Any], name: str) -> None:
        """A pod is a copy of the template *now*: later template changes never reach it."""
        tmeta = template.get("metadata") or {}
        spec = copy.deepcopy(template.get("spec") or {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("serviceAccountName", "default")
        pod: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": owner["metadata"]["namespace"],
                         "labels": dict(tmeta.get("labels") or {}),
                         "annotations": dict(tmeta.get("annotations") or {}),
                         "ownerReferences": [owner_ref(owner)]},
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "Burstable"},
        }
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        create_quietly(self.store, "", "pods", pod)

    def fail_pod(self, pod: dict[str, Any], reason: str, message: str) -> None:
        def fail(p: dict[str, Any]) -> dict[str, Any]:
            status = p.setdefault("status", {})
            status.update(phase="Failed", reason=reason, message=message)
            for cond in status.get("conditions") or []:
                if cond.get("type") in ("Ready", "ContainersReady"):
                    cond.update(status="False", lastTransitionTime=stamp(self.clock))
            for cs in status.get("containerStatuses") or []:
                cs["ready"] = False
            return p
        self.store.mutate("", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"], fail)

    def annotate(self, obj: dict[str, Any], group: str, resource: str, key: str, value: str) -> None:
        def set_it(o: dict[str, Any]) -> dict[str, Any] | None:
            annotations = o["metadata"].setdefault("annotations", {})
            if annotations.get(key) == value:
                return None
            annotations[key] = value
            return o
        self.store.mutate(group, resource, obj["metadata"]["name"], obj["metadata"].get("namespace"), set_it)

    def set_status(self, group: str, resource: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
        if (obj.get("status") or {}) == status:
            return

        def write(o: dict[str, Any]) -> dict[str, Any] | None:
            if o["metadata"].get("uid") != uid_of(obj) or (o.get("status") or {}) == status:
                return None
            o["status"] = status
            return o
        try:
            self.store.mutate(group, resource, obj["metadata"]["name"], obj["metadata"].get("namespace"), write)
        except ApiError as err:
            log.debug("status write of %s %s: %s", resource, obj["metadata"]["name"], err.message)
