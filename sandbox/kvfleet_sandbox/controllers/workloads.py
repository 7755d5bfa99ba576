"""The workload controllers of a sandbox cluster: Deployments, ReplicaSets, StatefulSets, DaemonSets, the GPU
scheduler, the kubelet's start-up, PersistentVolumeClaim binding and the HyperPod ``ai-toolkit`` DaemonSet.

Attached by ``kvfleet_sandbox.runtime`` to every :class:`~kvfleet_sandbox.twin.ClusterTwin` (``attach(twin)``).
The other simulations depend on it: the Inference Operator's Deployments, Curvine's StatefulSets and the vLLM
pods only run because this module turns them into pods bound to nodes. What it reproduces, because kvfleet must
cope with it on a real cluster (DOMAIN.md):

- a pod requesting ``nvidia.com/gpu`` binds only to a Ready node with a free GPU, otherwise it stays Pending with
  ``PodScheduled=False/Unschedulable`` and the scheduler's message; a pod whose PVC is unbound waits too;
- Deployments roll through ReplicaSets with ``maxSurge``/``maxUnavailable`` exactly as the Deployment controller
  computes them, so with every GPU in use a template change creates a surge pod that never schedules and no old
  pod is ever removed (the maxSurge deadlock); scaling to 0 first avoids it;
- a pod keeps the spec it was created with: a template patch leaves "stale" pods until they are replaced;
- a PVC in a ``curvine`` StorageClass binds only while the Curvine master runs (``twin.curvine_master_running()``)
  and its PV points at ``<fs-path>/pvc-<uid>`` (FACTS.md §3.4); EBS classes bind at once, or, with
  ``volumeBindingMode: WaitForFirstConsumer`` (what EKS's gp3 class and the sandbox's ``ebs-sc`` use), as soon as a
  pod uses the claim, like the real provisioner;
- Mode=Enable of HyperPod tiered storage (stage 1) makes DaemonSet ``ai-toolkit`` in ``aws-hyperpod`` run on
  every node; Mode=Disable removes it;
- pod anti-affinity (``_scheduling``): required terms keep two matching pods off one node, preferred terms only
  rank nodes, so a Curvine chart with upstream's default anti-affinity may stack workers;
- Jobs (``batch/v1``, e.g. the Curvine chart's pre-upgrade hook, which helm waits for): one pod at a time, up to
  ``backoffLimit`` retries; a Job pod exits 0 once it has run (the sandbox runs no container), unless its pod
  template carries the annotation ``sandbox.kvfleet.io/exit-code`` (a fault hook: that exit code, so a failing hook
  can be shown); the Job then reports ``Complete`` or ``Failed`` (``BackoffLimitExceeded``) like the Job
  controller (kubernetes ``pkg/controller/job``), and its pods go when the Job is deleted.

Time: pods become Ready ``settings.pod_startup_s`` model seconds after they are bound; Deployments report
``ProgressDeadlineExceeded`` after ``progressDeadlineSeconds`` (600 by default) model seconds without progress.
Status timestamps are model time. Deployment/ReplicaSet status counters are omitted when zero, as the real API
server omits them (``omitempty``), so clients must read them as optional.

Fault hooks, ``twin.services["workloads"]``: ``kill_pod(namespace, name)``, ``lose_node(node)``,
``restore_node(node)``, ``add_nodes(n) -> [names]``, ``wake()``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import re
import threading
from typing import Any

from kvfleet.fleet.constants import AI_TOOLKIT_DAEMONSET, AI_TOOLKIT_NAMESPACE
from kvfleet_sandbox.controllers._objects import (
    EventRecorder,
    ReconcileLoop,
    controller_uid,
    create_quietly,
    delete_quietly,
    ensure_namespace,
    is_ready,
    is_terminal,
    owner_ref,
    quantity,
    stamp,
    uid_of,
)
from kvfleet_sandbox.controllers._scheduling import (
    LOST_ANNOTATION,
    TAINT_UNREACHABLE,
    NodeSlot,
    account,
    choose,
    gpu_request,
    node_slot,
    selector_matches,
    unschedulable_message,
)
from kvfleet_sandbox.kube.errors import ApiError
from kvfleet_sandbox.twin import ClusterTwin, gpus_per_instance

log = logging.getLogger(__name__)

TICK_MODEL_S = 5.0
HASH_LABEL = "pod-template-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
STS_REVISION_LABEL = "controller-revision-hash"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
EBS_PROVISIONERS = ("ebs.csi.aws.com", "kubernetes.io/aws-ebs")
CURVINE_PROVISIONER = "curvine"
JOB_EXIT_CODE_ANNOTATION = "sandbox.kvfleet.io/exit-code"  # fault hook on a Job's pod template (see module doc)
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet Kubernetes uses for generated name suffixes
AI_TOOLKIT_IMAGE = "763104351884.dkr.ecr.{region}.amazonaws.com/hyperpod-ai-toolkit:1.0.0"
AI_TOOLKIT_PORT = 9200


def _safe_encode(digest: bytes, length: int) -> str:
    n = int.from_bytes(digest[:8], "big")
    out = []
    for _ in range(length):
        n, r = divmod(n, len(_SAFE))
        out.append(_SAFE[r])
    return "".join(out)


def template_hash(template: dict[str, Any]) -> str:
    """A stable hash of a pod template (the ``pod-template-hash`` label and ReplicaSet name suffix)."""
    return _safe_encode(hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest(), 10)


def _int_or_percent(value: Any, total: int, *, round_up: bool, default: str) -> int:
    value = default if value is None else value
    if isinstance(value, str) and value.endswith("%"):
        exact = float(value[:-1]) * total / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value)


def rolling_bounds(deployment: dict[str, Any], replicas: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) resolved like the Deployment controller: surge rounds up, unavailable rounds
    down, and if both come out 0 unavailable becomes 1."""
    rolling = ((deployment.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
    surge = _int_or_percent(rolling.get("maxSurge"), replicas, round_up=True, default="25%")
    unavailable = _int_or_percent(rolling.get("maxUnavailable"), replicas, round_up=False, default="25%")
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def _condition(conds: list[dict[str, Any]], ctype: str, status: str, reason: str, message: str,
               now: str) -> dict[str, Any]:
    old = next((c for c in conds if c.get("type") == ctype), None)
    if old and (old.get("status"), old.get("reason"), old.get("message")) == (status, reason, message):
        return old
    transition = old.get("lastTransitionTime") if old and old.get("status") == status else now
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastUpdateTime": now, "lastTransitionTime": transition}


def _omit_zero(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if v not in (0, None)}


def _claims(pod: dict[str, Any]) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"] for v in (pod.get("spec") or {}).get("volumes") or []
            if (v.get("persistentVolumeClaim") or {}).get("claimName")]


class _Snapshot:
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


class WorkloadController:
    """See the module docstring; one per cluster twin."""

    def __init__(self, twin: ClusterTwin) -> None:
        self.twin = twin
        self.store = twin.store
        self.clock = twin.clock
        self.events = EventRecorder(twin.store, twin.clock, "default-scheduler")
        self._lock = threading.Lock()
        self._bound_at: dict[str, float] = {}  # pod uid -> model time it was bound to a node
        self._progress: dict[str, tuple[tuple[Any, ...], float]] = {}  # deployment uid -> (signature, model t)
        self._ip_seq = 0
        self._loop = ReconcileLoop(f"workloads:{twin.name}", twin.clock, TICK_MODEL_S, self._pass)
        self.store.subscribe(self._on_event)
        twin.aws.on_tiered_storage(self._on_tiered_storage)
        twin.services["workloads"] = self
        self._loop.start()

    # --- public fault hooks ---------------------------------------------------------------------------------

    def wake(self) -> None:
        self._loop.wake()

    def kill_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod as if it crashed away; its controller makes a new one. True if it existed."""
        gone = self.store.delete("", "pods", name, namespace) is not None
        self.wake()
        return gone

    def lose_node(self, node: str) -> list[str]:
        """The node stops answering: NotReady, tainted unreachable, its pods Failed (then replaced elsewhere)."""
        def mark(obj: dict[str, Any]) -> dict[str, Any]:
            obj["metadata"].setdefault("annotations", {})[LOST_ANNOTATION] = "true"
            spec = obj.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_UNREACHABLE]
            now = stamp(self.clock)
            spec["taints"] = taints + [{"key": TAINT_UNREACHABLE, "effect": e, "timeAdded": now}
                                       for e in ("NoSchedule", "NoExecute")]
            for cond in (obj.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "Ready":
                    cond.update(status="Unknown", reason="NodeStatusUnknown",
                                message="Kubelet stopped posting node status.", lastTransitionTime=now)
            return obj

        if self.store.mutate("", "nodes", node, None, mark) is None:
            raise KeyError(f"no node {node!r} in cluster {self.twin.name}")
        failed = []
        for pod in self.store.list("", "pods", field_selector=f"spec.nodeName={node}"):
            if not is_terminal(pod):
                self._fail(pod, "NodeLost", f"Node {node} which was running pod {pod['metadata']['name']} "
                                            "is unresponsive")
                failed.append(pod["metadata"]["name"])
        self.wake()
        return failed

    def restore_node(self, node: str) -> None:
        def unmark(obj: dict[str, Any]) -> dict[str, Any]:
            (obj["metadata"].get("annotations") or {}).pop(LOST_ANNOTATION, None)
            spec = obj.setdefault("spec", {})
            spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_UNREACHABLE]
            for cond in (obj.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "Ready":
                    cond.update(status="True", reason="KubeletReady", message="kubelet is posting ready status",
                                lastTransitionTime=stamp(self.clock))
            return obj

        if self.store.mutate("", "nodes", node, None, unmark) is None:
            raise KeyError(f"no node {node!r} in cluster {self.twin.name}")
        self.wake()

    def add_nodes(self, n: int) -> list[str]:
        """``n`` more GPU nodes join (a scale-out), shaped and named like the existing ones."""
        existing = {o["metadata"]["name"]: o for o in self.store.list("", "nodes")}
        template_name = next((name for name in self.twin.gpu_nodes if name in existing), None)
        added = []
        for _ in range(n):
            name = self._new_node_name(template_name, set(existing))
            node = self._node_like(existing.get(template_name or ""), name, len(existing))
            created = self.store.create("", "nodes", node)
            existing[name] = created
            self.twin.gpu_nodes.append(name)
            added.append(name)
        self.wake()
        return added

    def _new_node_name(self, like: str | None, taken: set[str]) -> str:
        rng = self.twin.rng
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

    def _node_like(self, template: dict[str, Any] | None, name: str, index: int) -> dict[str, Any]:
        ip = f"10.1.{200 + index // 250}.{index % 250 + 1}"
        if template is None:
            gpus = str(gpus_per_instance(self.twin.gpu_instance_type))
            return {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {
                        "kubernetes.io/hostname": name,
                        "node.kubernetes.io/instance-type": self.twin.gpu_instance_type}},
                    "status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus},
                               "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                               "addresses": [{"type": "InternalIP", "address": ip}]}}
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

    def stop(self) -> None:
        self._loop.stop()
        if self.twin.services.get("workloads") is self:
            self.twin.services.pop("workloads", None)

    # --- events and hooks -----------------------------------------------------------------------------------

    def _on_event(self, kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "events":
            self._loop.wake()

    def _on_tiered_storage(self, hp_name: str, eks_name: str, cfg: dict[str, Any]) -> None:
        """HyperPod deploys (or removes) the ai-toolkit DaemonSet when tiered storage changes (stage 1)."""
        if hp_name != self.twin.name:
            return
        if cfg.get("Mode") == "Enable":
            ensure_namespace(self.store, AI_TOOLKIT_NAMESPACE)
            wanted = self._ai_toolkit(cfg)
            if create_quietly(self.store, "apps", "daemonsets", wanted) is None:
                def refresh(ds: dict[str, Any]) -> dict[str, Any]:
                    ds["spec"] = wanted["spec"]
                    return ds
                self.store.mutate("apps", "daemonsets", AI_TOOLKIT_DAEMONSET, AI_TOOLKIT_NAMESPACE, refresh)
        elif cfg.get("Mode") == "Disable":
            delete_quietly(self.store, "apps", "daemonsets", AI_TOOLKIT_DAEMONSET, AI_TOOLKIT_NAMESPACE)
        self.wake()

    def _ai_toolkit(self, cfg: dict[str, Any]) -> dict[str, Any]:
        labels = {"app": AI_TOOLKIT_DAEMONSET, "app.kubernetes.io/name": AI_TOOLKIT_DAEMONSET}
        percent = str(cfg.get("InstanceMemoryAllocationPercentage", ""))
        return {
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": AI_TOOLKIT_DAEMONSET, "namespace": AI_TOOLKIT_NAMESPACE, "labels": dict(labels)},
            "spec": {
                "selector": {"matchLabels": {"app": AI_TOOLKIT_DAEMONSET}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {"metadata": {"labels": labels}, "spec": {
                    "hostNetwork": True, "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{
                        "name": AI_TOOLKIT_DAEMONSET, "image": AI_TOOLKIT_IMAGE.format(region=self.twin.region),
                        "ports": [{"name": "kv", "containerPort": AI_TOOLKIT_PORT, "hostPort": AI_TOOLKIT_PORT}],
                        "env": [{"name": "INSTANCE_MEMORY_ALLOCATION_PERCENTAGE", "value": percent}],
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    }]}},
            },
        }

    # --- the pass -------------------------------------------------------------------------------------------

    def _fresh(self, snap: _Snapshot) -> _Snapshot:
        """Re-read only if a write happened since ``snap`` (a pass that changes nothing reads the store once:
        with 10 clusters in one interpreter, deep copies of every list were most of the simulation's CPU)."""
        return snap if self.store.resource_version == snap.rv else _Snapshot(self.twin)

    def _pass(self) -> float | None:
        with self._lock:
            snap = _Snapshot(self.twin)
            self._collect_garbage(snap)
            snap = self._fresh(snap)
            for d in snap.deployments:
                self._roll_deployment(d, snap)
            snap = self._fresh(snap)
            for rs in snap.replicasets:
                self._sync_replicaset(rs, snap)
            for sts in snap.statefulsets:
                self._sync_statefulset(sts, snap)
            for ds in snap.daemonsets:
                self._sync_daemonset(ds, snap)
            for job in snap.jobs:
                self._sync_job(job, snap)
            snap = self._fresh(snap)
            self._bind_claims(snap)
            snap = self._fresh(snap)
            due = self._schedule_and_start(snap)
            snap = self._fresh(snap)
            for rs in snap.replicasets:
                self._replicaset_status(rs, snap)
            for d in snap.deployments:
                self._deployment_status(d, snap)
            for sts in snap.statefulsets:
                self._statefulset_status(sts, snap)
            for ds in snap.daemonsets:
                self._daemonset_status(ds, snap)
            return due

    # --- garbage collection ---------------------------------------------------------------------------------

    def _collect_garbage(self, snap: _Snapshot) -> None:
        """What the garbage collector does for cascading deletes: pods of a deleted ReplicaSet/StatefulSet/
        DaemonSet, ReplicaSets of a deleted Deployment, and PVs whose claim is gone (reclaimPolicy Delete)."""
        live = {uid_of(o) for o in snap.replicasets + snap.statefulsets + snap.daemonsets + snap.jobs}
        for pod in snap.pods:
            owner = controller_uid(pod)
            kinds = {r.get("kind") for r in pod["metadata"].get("ownerReferences") or []}
            if owner and kinds & {"ReplicaSet", "StatefulSet", "DaemonSet", "Job"} and owner not in live:
                delete_quietly(self.store, "", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
        deployments = {uid_of(d) for d in snap.deployments}
        for rs in snap.replicasets:
            owner = controller_uid(rs, "Deployment")
            if owner and owner not in deployments:
                delete_quietly(self.store, "apps", "replicasets", rs["metadata"]["name"], rs["metadata"]["namespace"])
        claims = {uid_of(c) for c in snap.pvcs}
        for pv in snap.pvs:
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            if ref.get("uid") and ref["uid"] not in claims:
                if (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy", "Delete") == "Delete":
                    delete_quietly(self.store, "", "persistentvolumes", pv["metadata"]["name"], None)
                elif (pv.get("status") or {}).get("phase") != "Released":
                    self._set_status("", "persistentvolumes", pv, {"phase": "Released"})

    # --- Deployments ----------------------------------------------------------------------------------------

    def _roll_deployment(self, d: dict[str, Any], snap: _Snapshot) -> None:
        meta, spec = d["metadata"], d.get("spec") or {}
        if spec.get("paused"):
            return
        replicas = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        h = template_hash(template)
        rses = snap.owned(uid_of(d), snap.replicasets)
        new = next((rs for rs in rses if rs["metadata"].get("labels", {}).get(HASH_LABEL) == h), None)
        old = [rs for rs in rses if rs is not new]
        revisions = [int(rs["metadata"].get("annotations", {}).get(REVISION_ANNOTATION, "0")) for rs in rses]
        top = max(revisions, default=0)
        if new is None:
            new = self._create_replicaset(d, template, h, top + 1,
                                          replicas if not any(self._rs_size(o) for o in old) else 0)
            if new is None:
                return
        elif int(new["metadata"].get("annotations", {}).get(REVISION_ANNOTATION, "0")) < top:
            self._annotate(new, "apps", "replicasets", REVISION_ANNOTATION, str(top + 1))  # a rollback
        if meta.get("annotations", {}).get(REVISION_ANNOTATION) != \
                new["metadata"].get("annotations", {}).get(REVISION_ANNOTATION, str(top + 1)):
            self._annotate(d, "apps", "deployments", REVISION_ANNOTATION,
                           new["metadata"].get("annotations", {}).get(REVISION_ANNOTATION, str(top + 1)))
        sizes = {uid_of(rs): self._rs_size(rs) for rs in rses + ([new] if new not in rses else [])}
        strategy = (spec.get("strategy") or {}).get("type", "RollingUpdate")
        if strategy == "Recreate":
            self._recreate(new, old, replicas, sizes, snap)
        else:
            self._rolling(d, new, old, replicas, sizes, snap)
        for rs in [new, *old]:
            if sizes[uid_of(rs)] != self._rs_size(rs):
                self._scale_replicaset(rs, sizes[uid_of(rs)])

    @staticmethod
    def _rs_size(rs: dict[str, Any]) -> int:
        return int((rs.get("spec") or {}).get("replicas", 0))

    def _available(self, rs: dict[str, Any], snap: _Snapshot) -> int:
        return sum(1 for p in snap.owned(uid_of(rs)) if is_ready(p))

    def _recreate(self, new: dict[str, Any], old: list[dict[str, Any]], replicas: int, sizes: dict[str, int],
                  snap: _Snapshot) -> None:
        for rs in old:
            sizes[uid_of(rs)] = 0
        if not any(not is_terminal(p) for rs in old for p in snap.owned(uid_of(rs))):
            sizes[uid_of(new)] = replicas

    def _rolling(self, d: dict[str, Any], new: dict[str, Any], old: list[dict[str, Any]], replicas: int,
                 sizes: dict[str, int], snap: _Snapshot) -> None:
        """The Deployment controller's rolling-update arithmetic (scale up the new ReplicaSet within maxSurge,
        then scale old ones down only as far as maxUnavailable allows)."""
        new_uid = uid_of(new)
        active_old = [rs for rs in old if sizes[uid_of(rs)] > 0]
        if not active_old:
            sizes[new_uid] = replicas
            return
        surge, unavailable = rolling_bounds(d, replicas)
        sizes[new_uid] = min(sizes[new_uid], replicas)
        ordered_old = sorted(active_old, key=lambda rs: rs["metadata"].get("creationTimestamp", ""))
        # A scale-down during a rollout: drop the excess from the old ReplicaSets first.
        excess = sum(sizes.values()) - (replicas + surge)
        for rs in ordered_old:
            if excess <= 0:
                break
            cut = min(excess, sizes[uid_of(rs)])
            sizes[uid_of(rs)] -= cut
            excess -= cut
        room = replicas + surge - sum(sizes.values())
        if room > 0:
            sizes[new_uid] += min(room, replicas - sizes[new_uid])
        min_available = replicas - unavailable
        new_unavailable = sizes[new_uid] - self._available(new, snap)
        max_down = sum(sizes.values()) - min_available - new_unavailable
        if max_down <= 0:
            return
        for rs in ordered_old:  # unhealthy old replicas go first: removing them costs no availability
            unhealthy = max(0, sizes[uid_of(rs)] - self._available(rs, snap))
            cut = min(unhealthy, max_down)
            sizes[uid_of(rs)] -= cut
            max_down -= cut
        available = sum(min(sizes[uid_of(rs)], self._available(rs, snap)) for rs in [new, *old])
        down = available - min_available
        for rs in ordered_old:
            if down <= 0:
                break
            cut = min(down, sizes[uid_of(rs)])
            sizes[uid_of(rs)] -= cut
            down -= cut

    def _create_replicaset(self, d: dict[str, Any], template: dict[str, Any], h: str, revision: int,
                           replicas: int) -> dict[str, Any] | None:
        meta = d["metadata"]
        tpl = copy.deepcopy(template)
        tpl.setdefault("metadata", {}).setdefault("labels", {})[HASH_LABEL] = h
        selector = copy.deepcopy((d.get("spec") or {}).get("selector") or {})
        selector.setdefault("matchLabels", {})[HASH_LABEL] = h
        rs = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{meta['name']}-{h}", "namespace": meta["namespace"],
                         "labels": dict(tpl["metadata"]["labels"]),
                         "annotations": {REVISION_ANNOTATION: str(revision),
                                         "deployment.kubernetes.io/desired-replicas":
                                             str((d.get("spec") or {}).get("replicas", 1))},
                         "ownerReferences": [owner_ref(d)]},
            "spec": {"replicas": replicas, "selector": selector, "template": tpl},
        }
        return create_quietly(self.store, "apps", "replicasets", rs)

    def _scale_replicaset(self, rs: dict[str, Any], replicas: int) -> None:
        def scale(obj: dict[str, Any]) -> dict[str, Any]:
            obj.setdefault("spec", {})["replicas"] = replicas
            return obj
        self.store.mutate("apps", "replicasets", rs["metadata"]["name"], rs["metadata"]["namespace"], scale)

    def _annotate(self, obj: dict[str, Any], group: str, resource: str, key: str, value: str) -> None:
        def set_it(o: dict[str, Any]) -> dict[str, Any] | None:
            annotations = o["metadata"].setdefault("annotations", {})
            if annotations.get(key) == value:
                return None
            annotations[key] = value
            return o
        self.store.mutate(group, resource, obj["metadata"]["name"], obj["metadata"].get("namespace"), set_it)

    def _deployment_status(self, d: dict[str, Any], snap: _Snapshot) -> None:
        spec = d.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        h = template_hash(spec.get("template") or {})
        rses = snap.owned(uid_of(d), snap.replicasets)
        new = next((rs for rs in rses if rs["metadata"].get("labels", {}).get(HASH_LABEL) == h), None)
        pods_of = {uid_of(rs): [p for p in snap.owned(uid_of(rs)) if not is_terminal(p)] for rs in rses}
        total_pods = sum(len(p) for p in pods_of.values())
        updated = len(pods_of.get(uid_of(new), [])) if new else 0
        ready = sum(1 for pods in pods_of.values() for p in pods if is_ready(p))
        sized = sum(self._rs_size(rs) for rs in rses)
        _, unavailable = rolling_bounds(d, replicas)
        now_model = self.clock.now()
        now = stamp(self.clock, now_model)
        conds = list((d.get("status") or {}).get("conditions") or [])
        complete = (new is not None and updated == replicas and ready >= replicas and total_pods == replicas)
        signature = (new["metadata"]["name"] if new else "", updated, ready, total_pods, replicas)
        last_sig, since = self._progress.get(uid_of(d), (None, now_model))
        if signature != last_sig:
            since = now_model
            self._progress[uid_of(d)] = (signature, since)
        rs_name = new["metadata"]["name"] if new else d["metadata"]["name"]
        old_prog = next((c for c in conds if c.get("type") == "Progressing"), None)
        if complete:
            progressing = _condition(conds, "Progressing", "True", "NewReplicaSetAvailable",
                                     f'ReplicaSet "{rs_name}" has successfully progressed.', now)
        elif now_model - since > float(spec.get("progressDeadlineSeconds", 600)) or (
                old_prog and old_prog.get("reason") == "ProgressDeadlineExceeded" and signature == last_sig):
            progressing = _condition(conds, "Progressing", "False", "ProgressDeadlineExceeded",
                                     f'ReplicaSet "{rs_name}" has timed out progressing.', now)
        else:
            progressing = _condition(conds, "Progressing", "True", "ReplicaSetUpdated",
                                     f'ReplicaSet "{rs_name}" is progressing.', now)
        if ready >= replicas - unavailable:
            available = _condition(conds, "Available", "True", "MinimumReplicasAvailable",
                                   "Deployment has minimum availability.", now)
        else:
            available = _condition(conds, "Available", "False", "MinimumReplicasUnavailable",
                                   "Deployment does not have minimum availability.", now)
        status = _omit_zero({
            "observedGeneration": d["metadata"].get("generation", 1), "replicas": total_pods,
            "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": ready,
            "unavailableReplicas": max(0, sized - ready)})
        status["conditions"] = [available, progressing]
        self._set_status("apps", "deployments", d, status)

    # --- ReplicaSets ----------------------------------------------------------------------------------------

    def _sync_replicaset(self, rs: dict[str, Any], snap: _Snapshot) -> None:
        pods = snap.owned(uid_of(rs))
        for pod in pods:
            if (pod.get("status") or {}).get("phase") == "Failed":
                delete_quietly(self.store, "", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
        active = [p for p in pods if not is_terminal(p)]
        want = self._rs_size(rs)
        for _ in range(want - len(active)):
            self._create_pod(rs, (rs.get("spec") or {}).get("template") or {}, self._pod_name(rs))
        if len(active) > want:
            def victim_rank(p: dict[str, Any]) -> tuple[int, int, str]:
                return (0 if not (p.get("spec") or {}).get("nodeName") else 1, 1 if is_ready(p) else 0,
                        "~" + p["metadata"].get("creationTimestamp", ""))
            for pod in sorted(active, key=victim_rank)[: len(active) - want]:
                delete_quietly(self.store, "", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"])

    def _pod_name(self, rs: dict[str, Any]) -> str:
        return f"{rs['metadata']['name']}-" + "".join(self.twin.rng.choice(_SAFE) for _ in range(5))

    def _replicaset_status(self, rs: dict[str, Any], snap: _Snapshot) -> None:
        active = [p for p in snap.owned(uid_of(rs)) if not is_terminal(p)]
        ready = sum(1 for p in active if is_ready(p))
        status = _omit_zero({"replicas": len(active), "fullyLabeledReplicas": len(active), "readyReplicas": ready,
                             "availableReplicas": ready,
                             "observedGeneration": rs["metadata"].get("generation", 1)})
        status.setdefault("replicas", 0)
        self._set_status("apps", "replicasets", rs, status)

    # --- StatefulSets ---------------------------------------------------------------------------------------

    def _sync_statefulset(self, sts: dict[str, Any], snap: _Snapshot) -> None:
        meta, spec = sts["metadata"], sts.get("spec") or {}
        name, ns = meta["name"], meta["namespace"]
        replicas = int(spec.get("replicas", 1))
        revision = f"{name}-{template_hash(spec.get('template') or {})}"
        ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
        pods = {p["metadata"]["name"]: p for p in snap.owned(uid_of(sts))}
        for pod in list(pods.values()):
            if (pod.get("status") or {}).get("phase") == "Failed":
                delete_quietly(self.store, "", "pods", pod["metadata"]["name"], ns)
                pods.pop(pod["metadata"]["name"])
        for i in range(replicas):
            self._ensure_claims(sts, i, snap)
        for i in range(replicas):
            pod_name = f"{name}-{i}"
            if pod_name in pods:
                if ordered and not is_ready(pods[pod_name]):
                    break
                continue
            self._create_sts_pod(sts, i, revision)
            if ordered:
                break
        extra = sorted((p for p in pods if self._ordinal(name, p) >= replicas),
                       key=lambda p: -self._ordinal(name, p))
        for pod_name in extra[: 1 if ordered else len(extra)]:
            delete_quietly(self.store, "", "pods", pod_name, ns)
        if not extra:
            self._roll_statefulset(sts, [pods.get(f"{name}-{i}") for i in range(replicas)], revision)

    def _roll_statefulset(self, sts: dict[str, Any], current: list[dict[str, Any] | None], revision: str) -> None:
        """RollingUpdate: replace the highest-ordinal stale pod, one at a time, only while all are Ready."""
        strategy = (sts.get("spec") or {}).get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return
        if any(p is None or not is_ready(p) for p in current):
            return
        partition = int((strategy.get("rollingUpdate") or {}).get("partition", 0))
        for pod in reversed(current[partition:]):
            if pod is not None and pod["metadata"].get("labels", {}).get(STS_REVISION_LABEL) != revision:
                delete_quietly(self.store, "", "pods", pod["metadata"]["name"], sts["metadata"]["namespace"])
                break

    @staticmethod
    def _ordinal(sts_name: str, pod_name: str) -> int:
        suffix = pod_name[len(sts_name) + 1:]
        return int(suffix) if suffix.isdigit() else -1

    def _ensure_claims(self, sts: dict[str, Any], i: int, snap: _Snapshot) -> None:
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
            create_quietly(self.store, "", "persistentvolumeclaims", pvc)

    def _create_sts_pod(self, sts: dict[str, Any], i: int, revision: str) -> None:
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
        self._create_pod(sts, template, pod_name)

    def _statefulset_status(self, sts: dict[str, Any], snap: _Snapshot) -> None:
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
        self._set_status("apps", "statefulsets", sts, status)

    # --- DaemonSets -----------------------------------------------------------------------------------------

    def _eligible_nodes(self, ds: dict[str, Any], snap: _Snapshot) -> list[NodeSlot]:
        pod_spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
        slots = [node_slot(n, 0) for n in snap.nodes]
        return [s for s in slots if s.ready and not s.lost and selector_matches(pod_spec, s.labels)]

    def _sync_daemonset(self, ds: dict[str, Any], snap: _Snapshot) -> None:
        spec = ds.get("spec") or {}
        ns = ds["metadata"]["namespace"]
        h = template_hash(spec.get("template") or {})
        eligible = {s.name for s in self._eligible_nodes(ds, snap)}
        by_node: dict[str, dict[str, Any]] = {}
        for pod in snap.owned(uid_of(ds)):
            node = (pod.get("spec") or {}).get("nodeName")
            if (pod.get("status") or {}).get("phase") == "Failed" or node not in eligible or node in by_node:
                delete_quietly(self.store, "", "pods", pod["metadata"]["name"], ns)
            else:
                by_node[node] = pod
        for node in sorted(eligible - set(by_node)):
            template = copy.deepcopy(spec.get("template") or {})
            template.setdefault("metadata", {}).setdefault("labels", {})[STS_REVISION_LABEL] = h
            template.setdefault("spec", {})["nodeName"] = node
            self._create_pod(ds, template, f"{ds['metadata']['name']}-" +
                             "".join(self.twin.rng.choice(_SAFE) for _ in range(5)))
        strategy = (spec.get("updateStrategy") or {}).get("type", "RollingUpdate")
        if strategy != "RollingUpdate" or len(by_node) < len(eligible) or not all(map(is_ready, by_node.values())):
            return
        stale = sorted(p["metadata"]["name"] for p in by_node.values()
                       if p["metadata"].get("labels", {}).get(STS_REVISION_LABEL) != h)
        if stale:
            delete_quietly(self.store, "", "pods", stale[0], ns)

    def _daemonset_status(self, ds: dict[str, Any], snap: _Snapshot) -> None:
        h = template_hash((ds.get("spec") or {}).get("template") or {})
        eligible = {s.name for s in self._eligible_nodes(ds, snap)}
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
        self._set_status("apps", "daemonsets", ds, status)

    # --- Jobs -----------------------------------------------------------------------------------------------

    def _sync_job(self, job: dict[str, Any], snap: _Snapshot) -> None:
        """One pod at a time (``parallelism``/``completions`` 1, what helm hooks use); a Running pod of a Job has
        done its work by the next pass and exits; ``backoffLimit`` failed pods fail the Job."""
        status = dict(job.get("status") or {})
        if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in status.get("conditions") or []):
            return
        spec = job.get("spec") or {}
        pods = snap.owned(uid_of(job))
        for pod in pods:
            if (pod.get("status") or {}).get("phase") == "Running":
                self._exit_job_pod(pod, job)
        pods = [self.store.get("", "pods", p["metadata"]["name"], p["metadata"]["namespace"]) or p for p in pods]
        phases = [(p.get("status") or {}).get("phase", "Pending") for p in pods]
        succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
        active = len(phases) - succeeded - failed
        now = stamp(self.clock)
        new = {**status, "startTime": status.get("startTime") or now}
        new.update(active=active, succeeded=succeeded, failed=failed, ready=0)
        backoff = int(spec.get("backoffLimit", 6))
        if succeeded >= int(spec.get("completions", 1) or 1):
            new.update(completionTime=now, active=0, conditions=[
                {"type": t, "status": "True", "reason": "CompletionsReached", "message": "Reached expected number "
                 "of succeeded pods", "lastProbeTime": now, "lastTransitionTime": now}
                for t in ("SuccessCriteriaMet", "Complete")])
        elif failed > backoff:
            new.update(active=0, conditions=[
                {"type": t, "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the "
                 "specified backoff limit", "lastProbeTime": now, "lastTransitionTime": now}
                for t in ("FailureTarget", "Failed")])
        elif active == 0:
            template = copy.deepcopy(spec.get("template") or {})
            labels = template.setdefault("metadata", {}).setdefault("labels", {})
            name = job["metadata"]["name"]
            labels.update({"batch.kubernetes.io/job-name": name, "job-name": name,
                           "batch.kubernetes.io/controller-uid": uid_of(job), "controller-uid": uid_of(job)})
            suffix = hashlib.sha256(f"{uid_of(job)}/{len(pods)}".encode()).hexdigest()[:5]
            self._create_pod(job, template, f"{name}-{suffix}")
            new["active"] = 1
        self._set_status("batch", "jobs", job, _omit_zero(new))

    def _exit_job_pod(self, pod: dict[str, Any], job: dict[str, Any]) -> None:
        annotations = ((((job.get("spec") or {}).get("template") or {}).get("metadata") or {})
                       .get("annotations") or {})
        try:
            code = int(annotations.get(JOB_EXIT_CODE_ANNOTATION, "0"))
        except ValueError:
            code = 1
        now = stamp(self.clock)

        def finish(p: dict[str, Any]) -> dict[str, Any] | None:
            status = p.setdefault("status", {})
            if status.get("phase") != "Running":
                return None
            status["phase"] = "Succeeded" if code == 0 else "Failed"
            for cond in status.get("conditions") or []:
                if cond.get("type") in ("Ready", "ContainersReady"):
                    cond.update(status="False", reason="PodCompleted", lastTransitionTime=now)
            for cs in status.get("containerStatuses") or []:
                cs.update(ready=False, started=False, state={"terminated": {
                    "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                    "startedAt": (cs.get("state") or {}).get("running", {}).get("startedAt", now),
                    "finishedAt": now}})
            return p
        self.store.mutate("", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"], finish)

    # --- pods -----------------------------------------------------------------------------------------------

    def _create_pod(self, owner: dict[str, Any], template: dict[str, Any], name: str) -> None:
        """A pod is a copy of the template *now*: later template changes never reach it."""
        tmeta = template.get("metadata") or {}
        spec = copy.deepcopy(template.get("spec") or {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("serviceAccountName", "default")
        pod = {
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

    def _fail(self, pod: dict[str, Any], reason: str, message: str) -> None:
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

    def _schedule_and_start(self, snap: _Snapshot) -> float | None:
        """The scheduler (bind Pending pods) and the kubelet (start bound pods after the start-up delay)."""
        default_gpus = gpus_per_instance(self.twin.gpu_instance_type)
        slots = {n["metadata"]["name"]: node_slot(n, default_gpus if n["metadata"]["name"] in self.twin.gpu_nodes
                                                  else 0) for n in snap.nodes}
        account(slots, snap.pods)
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in snap.pvcs}
        now = self.clock.now()
        due: float | None = None
        live_uids = set()
        for pod in sorted(snap.pods, key=lambda p: (p["metadata"].get("creationTimestamp", ""),
                                                    p["metadata"]["name"])):
            live_uids.add(uid_of(pod))
            status = pod.get("status") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            if status.get("phase", "Pending") != "Pending" and not (status.get("phase") == "Running" and node in slots
                                                        and slots[node].lost):
                continue
            if node:
                slot = slots.get(node)
                if slot is not None and slot.lost:
                    self._fail(pod, "NodeLost", f"Node {node} which was running pod {pod['metadata']['name']} "
                                                "is unresponsive")
                    continue
                bound = self._bound_at.setdefault(uid_of(pod), now)
                ready_at = bound + self.twin.settings.pod_startup_s
                if now >= ready_at and slot is not None and slot.ready:
                    self._start(pod, slot)
                else:
                    left = ready_at - now
                    due = left if due is None else min(due, left)
                continue
            problem = self._claim_problem(pod, claims)
            if problem:
                self._unschedulable(pod, unschedulable_message(len(slots), extra=problem))
                continue
            target, message = choose(slots, pod.get("spec") or {}, pod["metadata"].get("namespace", "default"))
            if target is None:
                self._unschedulable(pod, message)
                continue
            self._bind(pod, target)
            self._bound_at[uid_of(pod)] = now
            due = self.twin.settings.pod_startup_s if due is None else min(due, self.twin.settings.pod_startup_s)
        for uid in set(self._bound_at) - live_uids:
            del self._bound_at[uid]
        return due

    def _claim_problem(self, pod: dict[str, Any], claims: dict[tuple[str, str], dict[str, Any]]) -> str | None:
        ns = pod["metadata"]["namespace"]
        for claim in _claims(pod):
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
            cond = _condition(conds, "PodScheduled", "False", "Unschedulable", message, stamp(self.clock))
            cond.pop("lastUpdateTime", None)
            cond.setdefault("lastProbeTime", None)
            if cond in conds:
                return None
            status["conditions"] = [c for c in conds if c.get("type") != "PodScheduled"] + [cond]
            return p
        self.store.mutate("", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"], mark)
        self.events.record(pod, "FailedScheduling", message)

    def _bind(self, pod: dict[str, Any], slot: NodeSlot) -> None:
        slot.gpus_used += gpu_request(pod.get("spec") or {})
        slot.pods += 1
        slot.pod_labels.append((pod["metadata"].get("namespace", ""), dict(pod["metadata"].get("labels") or {})))
        now = stamp(self.clock)

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
        self.store.mutate("", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"], bind)
        self.events.record(pod, "Scheduled", f"Successfully assigned {pod['metadata']['namespace']}/"
                                             f"{pod['metadata']['name']} to {slot.name}", warning=False)

    def _start(self, pod: dict[str, Any], slot: NodeSlot) -> None:
        now = stamp(self.clock)
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
            status["containerStatuses"] = [{
                "name": c["name"], "image": c.get("image", ""),
                "imageID": f"{c.get('image', '')}@sha256:" + hashlib.sha256(c.get("image", "").encode()).hexdigest(),
                "containerID": "containerd://" + hashlib.sha256(f"{uid_of(p)}/{c['name']}".encode()).hexdigest(),
                "ready": True, "started": True, "restartCount": 0,
                "state": {"running": {"startedAt": now}}} for c in (p.get("spec") or {}).get("containers") or []]
            return p
        self.store.mutate("", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"], start)

    # --- claims ---------------------------------------------------------------------------------------------

    def _bind_claims(self, snap: _Snapshot) -> None:
        consumers = {(p["metadata"]["namespace"], c) for p in snap.pods if not is_terminal(p) for c in _claims(p)}
        default = next((c for c in snap.classes.values()
                        if (c["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"), None)
        for pvc in snap.pvcs:
            if (pvc.get("status") or {}).get("phase") == "Bound":
                continue
            meta = pvc["metadata"]
            class_name = (pvc.get("spec") or {}).get("storageClassName")
            if class_name is None and default is not None:
                class_name = default["metadata"]["name"]
            sc = snap.classes.get(class_name or "")
            if sc is None:
                message = (f'storageclass.storage.k8s.io "{class_name}" not found' if class_name else
                           "no persistent volumes available for this claim and no storage class is set")
                self._pending_claim(pvc, "ProvisioningFailed", message)
                continue
            if sc.get("volumeBindingMode") == "WaitForFirstConsumer" and \
                    (meta["namespace"], meta["name"]) not in consumers:
                self._pending_claim(pvc, "WaitForFirstConsumer",
                                    "waiting for first consumer to be created before binding", warning=False)
                continue
            self._provision(pvc, sc)

    def _pending_claim(self, pvc: dict[str, Any], reason: str, message: str, *, warning: bool = True) -> None:
        if (pvc.get("status") or {}).get("phase") != "Pending":
            self._set_status("", "persistentvolumeclaims", pvc, {"phase": "Pending"})
        self.events.record(pvc, reason, message, warning=warning)

    def _provision(self, pvc: dict[str, Any], sc: dict[str, Any]) -> None:
        provisioner = sc.get("provisioner", "")
        params = dict(sc.get("parameters") or {})
        sc_name = sc["metadata"]["name"]
        pv_name = f"pvc-{uid_of(pvc)}"
        if provisioner == CURVINE_PROVISIONER:
            for required in ("master-addrs", "fs-path"):
                if not params.get(required):
                    self._pending_claim(pvc, "ProvisioningFailed",
                                        f'failed to provision volume with StorageClass "{sc_name}": rpc error: '
                                        f"code = InvalidArgument desc = Parameter '{required}' is required")
                    return
            if not self.twin.curvine_master_running():
                self._pending_claim(pvc, "ProvisioningFailed",
                                    f'failed to provision volume with StorageClass "{sc_name}": rpc error: code = '
                                    f"Unavailable desc = curvine master {params['master-addrs']} is not reachable")
                return
            path = f"{params['fs-path'].rstrip('/')}/{pv_name}"
            csi = {"driver": provisioner,
                   "volumeHandle": f"{params.get('cluster-id', 'curvine')}@{params['fs-path']}@{pv_name}",
                   "volumeAttributes": {**params, "curvine-path": path, "path": path}}
        elif provisioner in EBS_PROVISIONERS:
            volume_id = "vol-" + hashlib.sha256(pv_name.encode()).hexdigest()[:17]
            csi = {"driver": "ebs.csi.aws.com", "volumeHandle": volume_id, "fsType": params.get("fsType", "ext4"),
                   "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "ebs.csi.aws.com"}}
        else:
            self._pending_claim(pvc, "ExternalProvisioning",
                                f"Waiting for a volume to be created either by the external provisioner "
                                f"'{provisioner}' or manually by the system administrator. If volume creation "
                                "is delayed, please verify that the provisioner is running and correctly "
                                "registered.", warning=False)
            return
        spec = pvc.get("spec") or {}
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        modes = spec.get("accessModes") or ["ReadWriteOnce"]
        meta = pvc["metadata"]
        create_quietly(self.store, "", "persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv_name, "annotations": {"pv.kubernetes.io/provisioned-by": provisioner}},
            "spec": {"capacity": {"storage": storage}, "accessModes": modes, "csi": csi,
                     "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy", "Delete"),
                     "storageClassName": sc_name, "volumeMode": spec.get("volumeMode", "Filesystem"),
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": meta["name"],
                                  "namespace": meta["namespace"], "uid": uid_of(pvc)}},
            "status": {"phase": "Bound"},
        })

        def bind(obj: dict[str, Any]) -> dict[str, Any]:
            obj["metadata"].setdefault("annotations", {}).update({
                "pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes",
                "volume.kubernetes.io/storage-provisioner": provisioner,
                "volume.beta.kubernetes.io/storage-provisioner": provisioner})
            obj.setdefault("spec", {}).update(volumeName=pv_name, storageClassName=sc_name)
            obj["status"] = {"phase": "Bound", "accessModes": modes, "capacity": {"storage": storage}}
            return obj
        self.store.mutate("", "persistentvolumeclaims", meta["name"], meta["namespace"], bind)
        self.events.record(pvc, "ProvisioningSucceeded",
                           f"Successfully provisioned volume {pv_name}", warning=False)

    # --- status writes --------------------------------------------------------------------------------------

    def _set_status(self, group: str, resource: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
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


def attach(twin: ClusterTwin) -> WorkloadController:
    return WorkloadController(twin)


__all__ = ["WorkloadController", "attach", "quantity", "rolling_bounds", "template_hash"]
