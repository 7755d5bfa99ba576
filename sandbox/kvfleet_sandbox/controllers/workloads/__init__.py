"""The workload controllers of a sandbox cluster, one per kind as kube-controller-manager runs them, sharing one
read of the store per pass (the informer cache, ``_cache.Snapshot``) and one writer (``_writes.ObjectWriter``):

==========================  ===================================================================================
``garbage_collector``       cascading deletes: pods, ReplicaSets and PVs whose owner or claim is gone
``deployment``              rollouts through ReplicaSets with maxSurge/maxUnavailable; status and conditions
``replicaset``              pods of a ReplicaSet; status
``statefulset``             ordinal pods and their claims, OrderedReady, RollingUpdate; status
``daemonset``               one pod per eligible node, RollingUpdate; status
``job``                     one pod at a time, backoffLimit, Complete/Failed
``pv_provisioner``          PVC binding: Curvine (only while its master runs), EBS, WaitForFirstConsumer
``kubelet``                 bound pods start after ``settings.pod_startup_s`` model seconds; lost nodes fail pods
``scheduler``               binds Pending pods (GPUs, selectors, taints, anti-affinity) or marks them Unschedulable
``ai_toolkit``              HyperPod's ai-toolkit DaemonSet on tiered storage Enable/Disable (stage 1)
``nodes``                   node faults: lose, restore, add
==========================  ===================================================================================

Attached by ``kvfleet_sandbox.runtime`` to every :class:`~kvfleet_sandbox.twin.ClusterTwin` (``attach(twin)``).
The other simulations depend on it: the Inference Operator's Deployments, Curvine's StatefulSets and the vLLM
pods only run because these controllers turn them into pods bound to nodes. What they reproduce, because kvfleet
must cope with it on a real cluster (docs/reference/), is said in each module; in short:

- a pod requesting ``nvidia.com/gpu`` binds only to a Ready node with a free GPU, otherwise it stays Pending with
  ``PodScheduled=False/Unschedulable`` and the scheduler's message; a pod whose PVC is unbound waits too;
- Deployments roll through ReplicaSets exactly as the Deployment controller computes them, so with every GPU in
  use a template change creates a surge pod that never schedules and no old pod is ever removed (the maxSurge
  deadlock); scaling to 0 first avoids it;
- a pod keeps the spec it was created with: a template patch leaves "stale" pods until they are replaced;
- pod anti-affinity (``_scheduling``): required terms keep two matching pods off one node, preferred terms only
  rank nodes, so a Curvine chart with upstream's default anti-affinity may stack workers.

One pass runs the controllers in a fixed order (garbage collector; Deployments; ReplicaSets, StatefulSets,
DaemonSets, Jobs; PV binding; kubelet and scheduler; statuses), each reading the snapshot again only if a write
happened since. Time: model time throughout (``twin.clock``); a pass runs on every store event and at least every
``TICK_MODEL_S`` model seconds, or sooner when a pod start is due.

Fault hooks, ``twin.services["workloads"]``: ``kill_pod(namespace, name)``, ``lose_node(node)``,
``restore_node(node)``, ``add_nodes(n) -> [names]``, ``wake()``; for tests, ``settle(model_s)`` and ``holding()``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from kvfleet_sandbox.controllers._objects import ReconcileLoop, quantity
from kvfleet_sandbox.controllers.workloads._cache import TICK_MODEL_S, Snapshot, template_hash
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter
from kvfleet_sandbox.controllers.workloads.ai_toolkit import AiToolkit
from kvfleet_sandbox.controllers.workloads.daemonset import DaemonSetController
from kvfleet_sandbox.controllers.workloads.deployment import DeploymentController, rolling_bounds
from kvfleet_sandbox.controllers.workloads.garbage_collector import GarbageCollector
from kvfleet_sandbox.controllers.workloads.job import JobController
from kvfleet_sandbox.controllers.workloads.kubelet import Kubelet
from kvfleet_sandbox.controllers.workloads.nodes import NodeFaults
from kvfleet_sandbox.controllers.workloads.pv_provisioner import PvProvisioner
from kvfleet_sandbox.controllers.workloads.replicaset import ReplicaSetController
from kvfleet_sandbox.controllers.workloads.scheduler import Scheduler, node_slots
from kvfleet_sandbox.controllers.workloads.statefulset import StatefulSetController
from kvfleet_sandbox.twin import ClusterTwin

IDLE_SKIPS = 3  # periodic passes skipped in a row on an unchanged cluster (see WorkloadController._idle)


class WorkloadController:
    """The controller manager of one cluster twin: owns the loop and runs every workload controller in a pass;
    also the fault hooks (see the module docstring)."""

    def __init__(self, twin: ClusterTwin) -> None:
        self.twin = twin
        self.store = twin.store
        writer = ObjectWriter(twin)
        self.gc = GarbageCollector(writer)
        self.deployments = DeploymentController(writer)
        self.replicasets = ReplicaSetController(writer)
        self.statefulsets = StatefulSetController(writer)
        self.daemonsets = DaemonSetController(writer)
        self.jobs = JobController(writer)
        self.volumes = PvProvisioner(writer)
        self.kubelet = Kubelet(writer)
        self.scheduler = Scheduler(writer)
        self.nodes = NodeFaults(writer)
        self._lock = threading.Lock()
        # The idle skip (``_pass``): the store's version when the last full pass began, the model time its
        # earliest pod start is due, the periodic passes skipped since, and whether a full pass is asked for.
        self._last_rv: int | None = None
        self._due_at: float | None = None
        self._skipped = 0
        self._force = True
        self.full_passes = 0  # passes that ran the controllers (the loop's own count includes skipped ones)
        self._loop = ReconcileLoop(f"workloads:{twin.name}", twin.clock, TICK_MODEL_S, self._pass)
        self.store.subscribe(self._on_event)
        self.ai_toolkit = AiToolkit(twin, self.wake)
        twin.services["workloads"] = self
        self._loop.start()

    # --- public fault hooks ---------------------------------------------------------------------------------

    def wake(self) -> None:
        self._force = True
        self._loop.wake()

    def kill_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod as if it crashed away; its controller makes a new one. True if it existed."""
        gone = self.store.delete("", "pods", name, namespace) is not None
        self.wake()
        return gone

    def lose_node(self, node: str) -> list[str]:
        """The node stops answering: NotReady, tainted unreachable, its pods Failed (then replaced elsewhere)."""
        failed = self.nodes.lose(node)
        self.wake()
        return failed

    def restore_node(self, node: str) -> None:
        self.nodes.restore(node)
        self.wake()

    def add_nodes(self, n: int) -> list[str]:
        """``n`` more GPU nodes join (a scale-out), shaped and named like the existing ones."""
        added = self.nodes.add(n)
        self.wake()
        return added

    def settle(self, model_s: float = 0.0, timeout: float = 30.0) -> None:
        """Wait until the twin's clock has moved ``model_s`` model seconds and then two passes have finished (so
        one ran entirely after that moment): whatever the controllers would do by then is done. For tests that
        assert that something does NOT happen, which a fixed sleep cannot prove on a busy machine (the loop may
        not have run at all). Raises TimeoutError after ``timeout`` real seconds."""
        clock = self.twin.clock
        until = clock.now() + model_s
        while clock.now() < until:
            time.sleep(max(0.001, clock.real(until - clock.now())))
        self.wake()
        if not self._loop.wait_passes(self._loop.passes + 2, timeout):
            raise TimeoutError(f"workloads:{self.twin.name}: no two passes within {timeout} s")

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """No pass runs inside the block, so the next pass sees everything done in it at once: for tests that
        drive the controllers into a race a busy machine only sometimes produces (two pods of different
        StatefulSets deleted together are replaced, and scheduled, in one pass)."""
        with self._lock:
            yield
        self.wake()

    @property
    def passes(self) -> int:
        """The loop's passes, skipped ones included (``full_passes`` counts those that ran the controllers)."""
        return self._loop.passes

    def stop(self) -> None:
        self._loop.stop()
        if self.twin.services.get("workloads") is self:
            self.twin.services.pop("workloads", None)

    # --- the pass -------------------------------------------------------------------------------------------

    def _on_event(self, kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "events":
            self._loop.wake()

    def _fresh(self, snap: Snapshot) -> Snapshot:
        """Re-read only if a write happened since ``snap`` (a pass that changes nothing reads the store once:
        with 10 clusters in one interpreter, deep copies of every list were most of the simulation's CPU)."""
        return snap if self.store.resource_version == snap.rv else Snapshot(self.twin)

    def _pass(self) -> float | None:
        with self._lock:
            rv, now = self.store.resource_version, self.twin.clock.now()
            if self._idle(rv, now):
                return None if self._due_at is None else self._due_at - now
            self._skipped, self._force, self._last_rv = 0, False, rv
            self.full_passes += 1
            try:
                due = self._full_pass()
            except Exception:
                self._force = True  # a pass that failed runs again at the next tick, not after the skips
                raise
            self._due_at = None if due is None else now + due
            return due

    def _idle(self, rv: int, now: float) -> bool:
        """Whether a periodic pass may be skipped: nothing written since the last full pass began (a pass that
        wrote sees its own writes in the next one), no pod start due, no full pass asked for (a fault hook,
        ``settle``), and fewer than ``IDLE_SKIPS`` skipped in a row. What only time changes besides pod starts
        (a Deployment's progress deadline) is then judged at least every ``(IDLE_SKIPS + 1) * TICK_MODEL_S``
        model seconds. An idle cluster's passes were most of an idle sandbox's CPU (each lists every object)."""
        if self._force or rv != self._last_rv or (self._due_at is not None and now >= self._due_at) \
                or self._skipped >= IDLE_SKIPS:
            return False
        self._skipped += 1
        return True

    def _full_pass(self) -> float | None:
        snap = Snapshot(self.twin)
        self.gc.run(snap)
        snap = self._fresh(snap)
        for d in snap.deployments:
            self.deployments.sync(d, snap)
        snap = self._fresh(snap)
        self._sync_owners(snap)
        snap = self._fresh(snap)
        self.volumes.run(snap)
        snap = self._fresh(snap)
        due = self._place_and_start(snap)
        snap = self._fresh(snap)
        self._statuses(snap)
        return due

    def _sync_owners(self, snap: Snapshot) -> None:
        for rs in snap.replicasets:
            self.replicasets.sync(rs, snap)
        for sts in snap.statefulsets:
            self.statefulsets.sync(sts, snap)
        for ds in snap.daemonsets:
            self.daemonsets.sync(ds, snap)
        for job in snap.jobs:
            self.jobs.sync(job, snap)

    def _place_and_start(self, snap: Snapshot) -> float | None:
        """The kubelets start what is bound and due, then the scheduler binds what is Pending (both on the same
        node slots); returns model seconds until the next start is due."""
        slots = node_slots(self.twin, snap)
        now = self.twin.clock.now()
        started = self.kubelet.run(snap, slots, now)
        bound = self.kubelet.bound(self.scheduler.run(snap, slots), now)
        dues = [d for d in (started, bound) if d is not None]
        return min(dues) if dues else None

    def _statuses(self, snap: Snapshot) -> None:
        for rs in snap.replicasets:
            self.replicasets.status(rs, snap)
        for d in snap.deployments:
            self.deployments.status(d, snap)
        for sts in snap.statefulsets:
            self.statefulsets.status(sts, snap)
        for ds in snap.daemonsets:
            self.daemonsets.status(ds, snap)


def attach(twin: ClusterTwin) -> WorkloadController:
    return WorkloadController(twin)


__all__ = ["WorkloadController", "attach", "quantity", "rolling_bounds", "template_hash"]
