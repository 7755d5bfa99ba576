"""The scheduler of a sandbox cluster: binds each Pending pod without a node, oldest first, to a node chosen by
``_scheduling.choose`` (free GPUs, node selector and affinity, taints, required pod anti-affinity), or marks it
``PodScheduled=False/Unschedulable`` with the scheduler's message and a ``FailedScheduling`` event. A pod whose
PersistentVolumeClaim is missing or unbound waits, as the volume binding plugin makes it. Among equally good nodes a
StatefulSet pod goes back to the node its name last ran on (``_scheduling`` explains why: the real scheduler's
random tie-break, made deterministic), so a replaced pod's node does not depend on what else its pass schedules.

Run by ``kvfleet_sandbox.controllers.workloads.WorkloadController`` in every pass, after the kubelet; the two share
the pass's node slots (``node_slots``).
"""

from __future__ import annotations

from typing import Any

from kvfleet_sandbox.controllers._objects import controller_uid, stamp, uid_of
from kvfleet_sandbox.controllers._scheduling import (
    NodeSlot,
    account,
    choose,
    gpu_request,
    node_slot,
    unschedulable_message,
)
from kvfleet_sandbox.controllers.workloads._cache import Snapshot, claims_of, condition
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter
from kvfleet_sandbox.twin import ClusterTwin, gpus_per_instance


def node_slots(twin: ClusterTwin, snap: Snapshot) -> dict[str, NodeSlot]:
    """Every node with what its pods already use (GPU nodes offer their instance type's GPUs)."""
    default_gpus = gpus_per_instance(twin.gpu_instance_type)
    slots = {n["metadata"]["name"]: node_slot(n, default_gpus if n["metadata"]["name"] in twin.gpu_nodes else 0)
             for n in snap.nodes}
    account(slots, snap.pods)
    return slots


def by_age(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(pods, key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))


class Scheduler:
    """See the module docstring; one per cluster twin."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer
        # (namespace, name) of every StatefulSet pod seen on a node -> that node: the tie-break of ``choose``.
        self._last_node: dict[tuple[str, str], str] = {}

    def run(self, snap: Snapshot, slots: dict[str, NodeSlot]) -> list[str]:
        """Bind what can be bound; returns the uids of the pods bound in this pass."""
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in snap.pvcs}
        for pod in snap.pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                self._remember(pod, node)
        bound: list[str] = []
        for pod in by_age(snap.pods):
            if (pod.get("status") or {}).get("phase", "Pending") != "Pending" or (pod.get("spec") or {}).get(
                    "nodeName"):
                continue
            problem = self._claim_problem(pod, claims)
            if problem:
                self._unschedulable(pod, unschedulable_message(len(slots), extra=problem))
                continue
            ns = pod["metadata"].get("namespace", "default")
            previous = self._last_node.get((ns, pod["metadata"]["name"]))
            target, message = choose(slots, pod.get("spec") or {}, ns, previous)
            if target is None:
                self._unschedulable(pod, message)
                continue
            self._bind(pod, target)
            bound.append(uid_of(pod))
        return bound

    def _remember(self, pod: dict[str, Any], node: str) -> None:
        """A StatefulSet pod's name is its identity: the pod its controller creates in its place has it too."""
        if controller_uid(pod, "StatefulSet") is not None:
            self._last_node[(pod["metadata"].get("namespace", "default"), pod["metadata"]["name"])] = node

    @staticmethod
    def _claim_problem(pod: dict[str, Any], claims: dict[tuple[str, str], dict[str, Any]]) -> str | None:
        ns = pod["metadata"]["namespace"]
        for claim in claims_of(pod):
            pvc = claims.get((ns, claim))
            if pvc is None:
                return f'persistentvolumeclaim "{claim}" not found'
            if (pvc.get("status") or {}).get("phase") != "Bound":
                return "pod has unbound immediate PersistentVolumeClaims"
        return None

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        def mark(p: dict[str, Any]) -> dict[str, Any] | None:
            status = p.setdefault("status", {})
            conds = status.get("conditions") or []
            cond = condition(conds, "PodScheduled", "False", "Unschedulable", message, stamp(self.w.clock))
            cond.pop("lastUpdateTime", None)
            cond.setdefault("lastProbeTime", None)
            if cond in conds:
                return None
            status["conditions"] = [c for c in conds if c.get("type") != "PodScheduled"] + [cond]
            return p
        self.w.store.mutate("", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"], mark)
        self.w.events.record(pod, "FailedScheduling", message)

    def _bind(self, pod: dict[str, Any], slot: NodeSlot) -> None:
        slot.gpus_used += gpu_request(pod.get("spec") or {})
        slot.pods += 1
        slot.pod_labels.append((pod["metadata"].get("namespace", ""), dict(pod["metadata"].get("labels") or {})))
        now = stamp(self.w.clock)

        def bind(p: dict[str, Any]) -> dict[str, Any] | None:
            if (p.get("spec") or {}).get("nodeName"):
                return None
            p["spec"]["nodeName"] = slot.name
            status = p.setdefault("status", {})
            status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            status["conditions"].append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                         "lastTransitionTime": now})
            status["hostIP"] = slot.ip
            return p
        self.w.store.mutate("", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"], bind)
        self._remember(pod, slot.name)
        self.w.events.record(pod, "Scheduled", f"Successfully assigned {pod['metadata']['namespace']}/"
                                               f"{pod['metadata']['name']} to {slot.name}", warning=False)
