"""The kubelets of a sandbox cluster: a pod bound to a node starts (Running and Ready, container statuses, a pod
IP) ``settings.pod_startup_s`` model seconds after it was bound, if its node is Ready; a pod on a lost node is
Failed with ``NodeLost`` (its controller then replaces it elsewhere). Start-up times are model time.

Run by ``kvfleet_sandbox.controllers.workloads.WorkloadController`` in every pass, before the scheduler, which
tells it when it bound a pod (``bound``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvfleet_sandbox.controllers._objects import stamp, uid_of
from kvfleet_sandbox.controllers._scheduling import NodeSlot
from kvfleet_sandbox.controllers.workloads._cache import Snapshot
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter
from kvfleet_sandbox.controllers.workloads.scheduler import by_age


class Kubelet:
    """See the module docstring; one per cluster twin (the kubelets of all its nodes)."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer
        self._bound_at: dict[str, float] = {}  # pod uid -> model time it was bound to a node
        self._ip_seq = 0

    def bound(self, uids: list[str], now: float) -> float | None:
        """The scheduler bound these pods at model time ``now``: model seconds until the first may start."""
        for uid in uids:
            self._bound_at[uid] = now
        return self.w.twin.settings.pod_startup_s if uids else None

    def run(self, snap: Snapshot, slots: dict[str, NodeSlot], now: float) -> float | None:
        """Start or fail the pods bound to nodes; returns model seconds until the next start is due."""
        due: float | None = None
        startup = self.w.twin.settings.pod_startup_s
        for pod in by_age(snap.pods):
            status = pod.get("status") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            slot = slots.get(node or "")
            phase = status.get("phase", "Pending")
            if not node or not (phase == "Pending" or (phase == "Running" and slot is not None and slot.lost)):
                continue
            if slot is not None and slot.lost:
                self.w.fail_pod(pod, "NodeLost", f"Node {node} which was running pod {pod['metadata']['name']} "
                                                 "is unresponsive")
                continue
            ready_at = self._bound_at.setdefault(uid_of(pod), now) + startup
            if now >= ready_at and slot is not None and slot.ready:
                self._start(pod, slot)
            else:
                due = ready_at - now if due is None else min(due, ready_at - now)
        for uid in set(self._bound_at) - {uid_of(p) for p in snap.pods}:
            del self._bound_at[uid]
        return due

    def _start(self, pod: dict[str, Any], slot: NodeSlot) -> None:
        now = stamp(self.w.clock)
        self._ip_seq += 1
        host_network = bool((pod.get("spec") or {}).get("hostNetwork"))
        pod_ip = slot.ip if host_network else f"10.2.{self._ip_seq // 250}.{self._ip_seq % 250 + 1}"

        def start(p: dict[str, Any]) -> dict[str, Any] | None:
            status = p.setdefault("status", {})
            if status.get("phase", "Pending") != "Pending":
                return None
            status.update(phase="Running", hostIP=slot.ip, podIP=pod_ip, podIPs=[{"ip": pod_ip}],
                          startTime=status.get("startTime") or now)
            status["conditions"] = [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
            status["containerStatuses"] = [_container_status(p, c, now)
                                           for c in (p.get("spec") or {}).get("containers") or []]
            return p
        self.w.store.mutate("", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"], start)


def _container_status(pod: dict[str, Any], c: dict[str, Any], now: str) -> dict[str, Any]:
    image = c.get("image", "")
    return {"name": c["name"], "image": image,
            "imageID": f"{image}@sha256:" + hashlib.sha256(image.encode()).hexdigest(),
            "containerID": "containerd://" + hashlib.sha256(f"{uid_of(pod)}/{c['name']}".encode()).hexdigest(),
            "ready": True, "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}}}
