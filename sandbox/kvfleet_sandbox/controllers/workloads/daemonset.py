"""The DaemonSet controller of a sandbox cluster: one pod per Ready node that matches the pod template's node
selector and affinity, RollingUpdate one stale pod at a time once all are Ready (kubernetes
``pkg/controller/daemon``), and its status.

Run by ``kvfleet_sandbox.controllers.workloads.WorkloadController`` in every pass.
"""

from __future__ import annotations

import copy
from typing import Any

from kvfleet_sandbox.controllers._objects import delete_quietly, is_ready, is_terminal, uid_of
from kvfleet_sandbox.controllers._scheduling import NodeSlot, node_slot, selector_matches
from kvfleet_sandbox.controllers.workloads._cache import STS_REVISION_LABEL, Snapshot, template_hash
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter


def _eligible_nodes(ds: dict[str, Any], snap: Snapshot) -> list[NodeSlot]:
    pod_spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    slots = [node_slot(n, 0) for n in snap.nodes]
    return [s for s in slots if s.ready and not s.lost and selector_matches(pod_spec, s.labels)]


class DaemonSetController:
    """See the module docstring; one per cluster twin."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer

    def sync(self, ds: dict[str, Any], snap: Snapshot) -> None:
        spec = ds.get("spec") or {}
        ns = ds["metadata"]["namespace"]
        h = template_hash(spec.get("template") or {})
        eligible = {s.name for s in _eligible_nodes(ds, snap)}
        by_node: dict[str, dict[str, Any]] = {}
        for pod in snap.owned(uid_of(ds)):
            node = (pod.get("spec") or {}).get("nodeName")
            if (pod.get("status") or {}).get("phase") == "Failed" or node not in eligible or node in by_node:
                delete_quietly(self.w.store, "", "pods", pod["metadata"]["name"], ns)
            else:
                by_node[node] = pod
        for node in sorted(eligible - set(by_node)):
            template = copy.deepcopy(spec.get("template") or {})
            template.setdefault("metadata", {}).setdefault("labels", {})[STS_REVISION_LABEL] = h
            template.setdefault("spec", {})["nodeName"] = node
            self.w.create_pod(ds, template, self.w.random_suffix(ds["metadata"]["name"]))
        strategy = (spec.get("updateStrategy") or {}).get("type", "RollingUpdate")
        if strategy != "RollingUpdate" or len(by_node) < len(eligible) or not all(map(is_ready, by_node.values())):
            return
        stale = sorted(p["metadata"]["name"] for p in by_node.values()
                       if p["metadata"].get("labels", {}).get(STS_REVISION_LABEL) != h)
        if stale:
            delete_quietly(self.w.store, "", "pods", stale[0], ns)

    def status(self, ds: dict[str, Any], snap: Snapshot) -> None:
        h = template_hash((ds.get("spec") or {}).get("template") or {})
        eligible = {s.name for s in _eligible_nodes(ds, snap)}
        active = [p for p in snap.owned(uid_of(ds)) if not is_terminal(p)]
        on = [p for p in active if (p.get("spec") or {}).get("nodeName") in eligible]
        ready = sum(1 for p in on if is_ready(p))
        status = {"observedGeneration": ds["metadata"].get("generation", 1),
                  "desiredNumberScheduled": len(eligible), "currentNumberScheduled": len(on),
                  "numberReady": ready, "numberAvailable": ready, "numberMisscheduled": len(active) - len(on),
                  "updatedNumberScheduled": sum(1 for p in on if p["metadata"].get("labels", {})
                                                .get(STS_REVISION_LABEL) == h)}
        if len(eligible) - ready > 0:
            status["numberUnavailable"] = len(eligible) - ready
        self.w.set_status("apps", "daemonsets", ds, status)
