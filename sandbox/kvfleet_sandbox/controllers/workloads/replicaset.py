"""The ReplicaSet controller of a sandbox cluster: keeps ``spec.replicas`` pods of a ReplicaSet, replaces Failed
ones, removes the surplus in the order kube-controller-manager's ReplicaSet controller prefers (unscheduled, then
not ready, then the newest), and writes its status.

Run by ``kvfleet_sandbox.controllers.workloads.WorkloadController`` in every pass.
"""

from __future__ import annotations

from typing import Any

from kvfleet_sandbox.controllers._objects import delete_quietly, is_ready, is_terminal, uid_of
from kvfleet_sandbox.controllers.workloads._cache import Snapshot, omit_zero, replicas_of
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter


def _victim_rank(p: dict[str, Any]) -> tuple[int, int, str]:
    return (0 if not (p.get("spec") or {}).get("nodeName") else 1, 1 if is_ready(p) else 0,
            "~" + p["metadata"].get("creationTimestamp", ""))


class ReplicaSetController:
    """See the module docstring; one per cluster twin."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer

    def sync(self, rs: dict[str, Any], snap: Snapshot) -> None:
        store = self.w.store
        pods = snap.owned(uid_of(rs))
        for pod in pods:
            if (pod.get("status") or {}).get("phase") == "Failed":
                delete_quietly(store, "", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
        active = [p for p in pods if not is_terminal(p)]
        want = replicas_of(rs)
        for _ in range(want - len(active)):
            self.w.create_pod(rs, (rs.get("spec") or {}).get("template") or {},
                              self.w.random_suffix(rs["metadata"]["name"]))
        if len(active) > want:
            for pod in sorted(active, key=_victim_rank)[: len(active) - want]:
                delete_quietly(store, "", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"])

    def status(self, rs: dict[str, Any], snap: Snapshot) -> None:
        active = [p for p in snap.owned(uid_of(rs)) if not is_terminal(p)]
        ready = sum(1 for p in active if is_ready(p))
        status = omit_zero({"replicas": len(active), "fullyLabeledReplicas": len(active), "readyReplicas": ready,
                            "availableReplicas": ready,
                            "observedGeneration": rs["metadata"].get("generation", 1)})
        status.setdefault("replicas", 0)
        self.w.set_status("apps", "replicasets", rs, status)
