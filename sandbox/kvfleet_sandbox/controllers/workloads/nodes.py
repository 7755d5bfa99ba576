"""Node faults of a sandbox cluster, what the node lifecycle controller and HyperPod do to nodes: a node lost
(NotReady, tainted unreachable, its pods Failed), restored, or new GPU nodes joining (a scale-out), shaped and
named like the existing ones.

Reached through ``twin.services["workloads"]`` (``lose_node``, ``restore_node``, ``add_nodes``), which wakes the
workload controllers after each change.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from kvfleet_sandbox.controllers._objects import is_terminal, stamp
from kvfleet_sandbox.controllers._scheduling import LOST_ANNOTATION, TAINT_UNREACHABLE
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter
from kvfleet_sandbox.twin import gpus_per_instance


class NodeFaults:
    """See the module docstring; one per cluster twin."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer

    def lose(self, node: str) -> list[str]:
        """The node stops answering: NotReady, tainted unreachable, its pods Failed. Returns the failed pods."""
        clock = self.w.clock

        def mark(obj: dict[str, Any]) -> dict[str, Any]:
            obj["metadata"].setdefault("annotations", {})[LOST_ANNOTATION] = "true"
            spec = obj.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_UNREACHABLE]
            now = stamp(clock)
            spec["taints"] = taints + [{"key": TAINT_UNREACHABLE, "effect": e, "timeAdded": now}
                                       for e in ("NoSchedule", "NoExecute")]
            for cond in (obj.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "Ready":
                    cond.update(status="Unknown", reason="NodeStatusUnknown",
                                message="Kubelet stopped posting node status.", lastTransitionTime=now)
            return obj

        if self.w.store.mutate("", "nodes", node, None, mark) is None:
            raise KeyError(f"no node {node!r} in cluster {self.w.twin.name}")
        failed = []
        for pod in self.w.store.list("", "pods", field_selector=f"spec.nodeName={node}"):
            if not is_terminal(pod):
                self.w.fail_pod(pod, "NodeLost", f"Node {node} which was running pod {pod['metadata']['name']} "
                                                 "is unresponsive")
                failed.append(pod["metadata"]["name"])
        return failed

    def restore(self, node: str) -> None:
        clock = self.w.clock

        def unmark(obj: dict[str, Any]) -> dict[str, Any]:
            (obj["metadata"].get("annotations") or {}).pop(LOST_ANNOTATION, None)
            spec = obj.setdefault("spec", {})
            spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_UNREACHABLE]
            for cond in (obj.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "Ready":
                    cond.update(status="True", reason="KubeletReady", message="kubelet is posting ready status",
                                lastTransitionTime=stamp(clock))
            return obj

        if self.w.store.mutate("", "nodes", node, None, unmark) is None:
            raise KeyError(f"no node {node!r} in cluster {self.w.twin.name}")

    def add(self, n: int) -> list[str]:
        """``n`` more GPU nodes join (a scale-out), shaped and named like the existing ones."""
        twin = self.w.twin
        existing = {o["metadata"]["name"]: o for o in twin.store.list("", "nodes")}
        template_name = next((name for name in twin.gpu_nodes if name in existing), None)
        added = []
        for _ in range(n):
            name = self._new_name(template_name, set(existing))
            node = self._like(existing.get(template_name or ""), name, len(existing))
            created = twin.store.create("", "nodes", node)
            existing[name] = created
            twin.gpu_nodes.append(name)
            added.append(name)
        return added

    def _new_name(self, like: str | None, taken: set[str]) -> str:
        rng = self.w.twin.rng
        for _ in range(1000):
            if like and (m := re.match(r"^(.*-i-)([0-9a-f]+)$", like)):
                name = m.group(1) + "".join(rng.choice("0123456789abcdef") for _ in m.group(2))
            elif like and (m := re.match(r"^(.*?)(\d+)$", like)):
                name = f"{m.group(1)}{int(m.group(2)) + len(taken) + 1:0{len(m.group(2))}d}"
            else:
                name = f"{like or 'gpu-node'}-{len(taken) + 1}"
            if name not in taken:
                return name
        raise RuntimeError("could not find a free node name")

    def _like(self, template: dict[str, Any] | None, name: str, index: int) -> dict[str, Any]:
        ip = f"10.1.{200 + index // 250}.{index % 250 + 1}"
        if template is None:
            return self._fresh_node(name, ip)
        node = copy.deepcopy(template)
        meta = node["metadata"]
        node["metadata"] = {"name": name, "labels": dict(meta.get("labels") or {}, **{"kubernetes.io/hostname": name})}
        old = meta["name"]
        node["spec"] = {k: v for k, v in (node.get("spec") or {}).items() if k not in ("taints", "unschedulable")}
        if "providerID" in node["spec"]:
            node["spec"]["providerID"] = node["spec"]["providerID"].replace(old.removeprefix("hyperpod-"),
                                                                            name.removeprefix("hyperpod-"))
        status = node.setdefault("status", {})
        status["addresses"] = [{"type": "InternalIP", "address": ip}] + [
            {**a, "address": a["address"].replace(old, name)} for a in status.get("addresses") or []
            if a.get("type") != "InternalIP"]
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Ready":
                cond.update(status="True", reason="KubeletReady", message="kubelet is posting ready status")
        return node

    def _fresh_node(self, name: str, ip: str) -> dict[str, Any]:
        instance_type = self.w.twin.gpu_instance_type
        gpus = str(gpus_per_instance(instance_type))
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": instance_type}},
                "status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus},
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                           "addresses": [{"type": "InternalIP", "address": ip}]}}
