"""What every workload controller of a sandbox cluster shares: the pass's read of the store (the informer cache
kube-controller-manager's controllers share), the names and hashes Kubernetes gives generated objects, and the
small status helpers.

Used only inside ``kvfleet_sandbox.controllers.workloads``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvfleet_sandbox.controllers._objects import controller_uid
from kvfleet_sandbox.twin import ClusterTwin

TICK_MODEL_S = 5.0
HASH_LABEL = "pod-template-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
STS_REVISION_LABEL = "controller-revision-hash"
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet Kubernetes uses for generated name suffixes


class Snapshot:
    """The objects of one pass, read once."""

    def __init__(self, twin: ClusterTwin) -> None:
        store = twin.store
        self.rv = store.resource_version  # every write bumps it: an unchanged value means the lists are current
        self.nodes = store.list("", "nodes")
        self.pods = store.list("", "pods")
        self.deployments = store.list("apps", "deployments")
        self.replicasets = store.list("apps", "replicasets")
        self.statefulsets = store.list("apps", "statefulsets")
        self.daemonsets = store.list("apps", "daemonsets")
        self.jobs = store.list("batch", "jobs")
        self.pvcs = store.list("", "persistentvolumeclaims")
        self.pvs = store.list("", "persistentvolumes")
        self.classes = {c["metadata"]["name"]: c for c in store.list("storage.k8s.io", "storageclasses")}

    def owned(self, owner_uid: str, items: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        return [o for o in (self.pods if items is None else items) if controller_uid(o) == owner_uid]


def _safe_encode(digest: bytes, length: int) -> str:
    n = int.from_bytes(digest[:8], "big")
    out = []
    for _ in range(length):
        n, r = divmod(n, len(SAFE_ALPHABET))
        out.append(SAFE_ALPHABET[r])
    return "".join(out)


def template_hash(template: dict[str, Any]) -> str:
    """A stable hash of a pod template (the ``pod-template-hash`` label and ReplicaSet name suffix)."""
    return _safe_encode(hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest(), 10)


def condition(conds: list[dict[str, Any]], ctype: str, status: str, reason: str, message: str,
              now: str) -> dict[str, Any]:
    """The condition ``ctype`` as it should now read: the old one if unchanged, else a new one whose transition
    time moves only when the status does."""
    old = next((c for c in conds if c.get("type") == ctype), None)
    if old and (old.get("status"), old.get("reason"), old.get("message")) == (status, reason, message):
        return old
    transition = old.get("lastTransitionTime") if old and old.get("status") == status else now
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastUpdateTime": now, "lastTransitionTime": transition}


def omit_zero(status: dict[str, Any]) -> dict[str, Any]:
    """What the API server shows of a status whose counters are ``omitempty``."""
    return {k: v for k, v in status.items() if v not in (0, None)}


def claims_of(pod: dict[str, Any]) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"] for v in (pod.get("spec") or {}).get("volumes") or []
            if (v.get("persistentVolumeClaim") or {}).get("claimName")]


def replicas_of(obj: dict[str, Any]) -> int:
    """``spec.replicas`` of a ReplicaSet (0 when unset: the Deployment controller always sets it)."""
    return int((obj.get("spec") or {}).get("replicas", 0))
