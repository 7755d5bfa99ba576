"""The StatefulSet controller of a sandbox cluster: ordinal pods ``<name>-<i>`` with their claims from
``volumeClaimTemplates``, created in order and one at a time under ``OrderedReady``, removed from the highest
ordinal; RollingUpdate replaces the highest-ordinal stale pod, one at a time, only while all are Ready (kubernetes
``pkg/controller/statefulset``); and its status with the current and update revisions.

Run by ``kvfleet_sandbox.controllers.workloads.WorkloadController`` in every pass.
"""

from __future__ import annotations

import copy
from typing import Any

from kvfleet_sandbox.controllers._objects import create_quietly, delete_quietly, is_ready, is_terminal, uid_of
from kvfleet_sandbox.controllers.workloads._cache import STS_REVISION_LABEL, Snapshot, template_hash
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter


def _ordinal(sts_name: str, pod_name: str) -> int:
    suffix = pod_name[len(sts_name) + 1:]
    return int(suffix) if suffix.isdigit() else -1


class StatefulSetController:
    """See the module docstring; one per cluster twin."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer

    def sync(self, sts: dict[str, Any], snap: Snapshot) -> None:
        meta, spec = sts["metadata"], sts.get("spec") or {}
        name, ns = meta["name"], meta["namespace"]
        replicas = int(spec.get("replicas", 1))
        revision = f"{name}-{template_hash(spec.get('template') or {})}"
        ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
        pods = {p["metadata"]["name"]: p for p in snap.owned(uid_of(sts))}
        for pod in list(pods.values()):
            if (pod.get("status") or {}).get("phase") == "Failed":
                delete_quietly(self.w.store, "", "pods", pod["metadata"]["name"], ns)
                pods.pop(pod["metadata"]["name"])
        for i in range(replicas):
            self._ensure_claims(sts, i, snap)
        self._create_missing(sts, pods, replicas, revision, ordered)
        extra = sorted((p for p in pods if _ordinal(name, p) >= replicas), key=lambda p: -_ordinal(name, p))
        for pod_name in extra[: 1 if ordered else len(extra)]:
            delete_quietly(self.w.store, "", "pods", pod_name, ns)
        if not extra:
            self._roll(sts, [pods.get(f"{name}-{i}") for i in range(replicas)], revision)

    def _create_missing(self, sts: dict[str, Any], pods: dict[str, dict[str, Any]], replicas: int, revision: str,
                        ordered: bool) -> None:
        """Create the missing ordinals; under OrderedReady only the first, and only once all before it are
        Ready."""
        name = sts["metadata"]["name"]
        for i in range(replicas):
            pod_name = f"{name}-{i}"
            if pod_name in pods:
                if ordered and not is_ready(pods[pod_name]):
                    break
                continue
            self._create_pod(sts, i, revision)
            if ordered:
                break

    def _roll(self, sts: dict[str, Any], current: list[dict[str, Any] | None], revision: str) -> None:
        """RollingUpdate: replace the highest-ordinal stale pod, one at a time, only while all are Ready."""
        strategy = (sts.get("spec") or {}).get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return
        if any(p is None or not is_ready(p) for p in current):
            return
        partition = int((strategy.get("rollingUpdate") or {}).get("partition", 0))
        for pod in reversed(current[partition:]):
            if pod is not None and pod["metadata"].get("labels", {}).get(STS_REVISION_LABEL) != revision:
                delete_quietly(self.w.store, "", "pods", pod["metadata"]["name"], sts["metadata"]["namespace"])
                break

    def _ensure_claims(self, sts: dict[str, Any], i: int, snap: Snapshot) -> None:
        meta = sts["metadata"]
        existing = {(c["metadata"]["namespace"], c["metadata"]["name"]) for c in snap.pvcs}
        selector_labels = ((sts.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        for tpl in (sts.get("spec") or {}).get("volumeClaimTemplates") or []:
            claim = f"{tpl['metadata']['name']}-{meta['name']}-{i}"
            if (meta["namespace"], claim) in existing:
                continue
            pvc = copy.deepcopy(tpl)
            pvc.update(apiVersion="v1", kind="PersistentVolumeClaim")
            pvc["metadata"] = {"name": claim, "namespace": meta["namespace"],
                               "labels": {**(tpl["metadata"].get("labels") or {}), **selector_labels}}
            pvc.pop("status", None)
            create_quietly(self.w.store, "", "persistentvolumeclaims", pvc)

    def _create_pod(self, sts: dict[str, Any], i: int, revision: str) -> None:
        meta, spec = sts["metadata"], sts.get("spec") or {}
        pod_name = f"{meta['name']}-{i}"
        template = copy.deepcopy(spec.get("template") or {})
        labels = template.setdefault("metadata", {}).setdefault("labels", {})
        labels.update({STS_REVISION_LABEL: revision, "statefulset.kubernetes.io/pod-name": pod_name,
                       "apps.kubernetes.io/pod-index": str(i)})
        pod_spec = template.setdefault("spec", {})
        pod_spec.setdefault("hostname", pod_name)
        if spec.get("serviceName"):
            pod_spec.setdefault("subdomain", spec["serviceName"])
        volumes = pod_spec.setdefault("volumes", [])
        names = {v.get("name") for v in volumes}
        for tpl in spec.get("volumeClaimTemplates") or []:
            if tpl["metadata"]["name"] not in names:
                volumes.append({"name": tpl["metadata"]["name"], "persistentVolumeClaim": {
                    "claimName": f"{tpl['metadata']['name']}-{meta['name']}-{i}"}})
        self.w.create_pod(sts, template, pod_name)

    def status(self, sts: dict[str, Any], snap: Snapshot) -> None:
        spec = sts.get("spec") or {}
        revision = f"{sts['metadata']['name']}-{template_hash(spec.get('template') or {})}"
        active = [p for p in snap.owned(uid_of(sts)) if not is_terminal(p)]
        ready = sum(1 for p in active if is_ready(p))
        updated = sum(1 for p in active if p["metadata"].get("labels", {}).get(STS_REVISION_LABEL) == revision)
        old_status = sts.get("status") or {}
        replicas = int(spec.get("replicas", 1))
        current_revision = revision if updated == len(active) == replicas else \
            old_status.get("currentRevision", revision)
        current = updated if current_revision == revision else len(active) - updated
        status = {"observedGeneration": sts["metadata"].get("generation", 1), "replicas": len(active),
                  "readyReplicas": ready, "availableReplicas": ready, "currentReplicas": current,
                  "updatedReplicas": updated, "currentRevision": current_revision, "updateRevision": revision,
                  "collisionCount": 0}
        self.w.set_status("apps", "statefulsets", sts, status)
