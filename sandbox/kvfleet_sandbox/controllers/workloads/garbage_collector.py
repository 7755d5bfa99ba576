"""The garbage collector of a sandbox cluster, for cascading deletes: pods of a deleted ReplicaSet, StatefulSet,
DaemonSet or Job, ReplicaSets of a deleted Deployment, and PVs whose claim is gone (reclaimPolicy Delete; Retain
leaves them Released).

Run by ``kvfleet_sandbox.controllers.workloads.WorkloadController`` first in every pass.
"""

from __future__ import annotations

from kvfleet_sandbox.controllers._objects import controller_uid, delete_quietly, uid_of
from kvfleet_sandbox.controllers.workloads._cache import Snapshot
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter

POD_OWNER_KINDS = frozenset({"ReplicaSet", "StatefulSet", "DaemonSet", "Job"})


class GarbageCollector:
    """See the module docstring; one per cluster twin."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer

    def run(self, snap: Snapshot) -> None:
        store = self.w.store
        live = {uid_of(o) for o in snap.replicasets + snap.statefulsets + snap.daemonsets + snap.jobs}
        for pod in snap.pods:
            owner = controller_uid(pod)
            kinds = {r.get("kind") for r in pod["metadata"].get("ownerReferences") or []}
            if owner and kinds & POD_OWNER_KINDS and owner not in live:
                delete_quietly(store, "", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
        deployments = {uid_of(d) for d in snap.deployments}
        for rs in snap.replicasets:
            owner = controller_uid(rs, "Deployment")
            if owner and owner not in deployments:
                delete_quietly(store, "apps", "replicasets", rs["metadata"]["name"], rs["metadata"]["namespace"])
        self._release_volumes(snap)

    def _release_volumes(self, snap: Snapshot) -> None:
        claims = {uid_of(c) for c in snap.pvcs}
        for pv in snap.pvs:
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            if not ref.get("uid") or ref["uid"] in claims:
                continue
            if (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy", "Delete") == "Delete":
                delete_quietly(self.w.store, "", "persistentvolumes", pv["metadata"]["name"], None)
            elif (pv.get("status") or {}).get("phase") != "Released":
                self.w.set_status("", "persistentvolumes", pv, {"phase": "Released"})
