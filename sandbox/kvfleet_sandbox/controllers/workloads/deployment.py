"""The Deployment controller of a sandbox cluster: rolls a Deployment through ReplicaSets with ``maxSurge`` and
``maxUnavailable`` exactly as kube-controller-manager's Deployment controller computes them (kubernetes
``pkg/controller/deployment``), and writes its status and conditions.

So with every GPU in use a template change creates a surge pod that never schedules and no old pod is ever
removed (the maxSurge deadlock); scaling to 0 first avoids it. Deployments report ``ProgressDeadlineExceeded``
after ``progressDeadlineSeconds`` (600 by default) model seconds without progress. Status counters are omitted
when zero, as the real API server omits them (``omitempty``).

Run by ``kvfleet_sandbox.controllers.workloads.WorkloadController`` in every pass.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from kvfleet_sandbox.controllers._objects import create_quietly, is_ready, is_terminal, owner_ref, stamp, uid_of
from kvfleet_sandbox.controllers.workloads._cache import (
    HASH_LABEL,
    REVISION_ANNOTATION,
    Snapshot,
    condition,
    omit_zero,
    replicas_of,
    template_hash,
)
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter


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


def _revision(obj: dict[str, Any], default: str = "0") -> str:
    return str(obj["metadata"].get("annotations", {}).get(REVISION_ANNOTATION, default))


def _available(rs: dict[str, Any], snap: Snapshot) -> int:
    return sum(1 for p in snap.owned(uid_of(rs)) if is_ready(p))


class DeploymentController:
    """See the module docstring; one per cluster twin."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer
        self._progress: dict[str, tuple[tuple[Any, ...], float]] = {}  # deployment uid -> (signature, model t)

    # --- the rollout -------------------------------------------------------------------------------------------

    def sync(self, d: dict[str, Any], snap: Snapshot) -> None:
        spec = d.get("spec") or {}
        if spec.get("paused"):
            return
        replicas = int(spec.get("replicas", 1))
        rses = snap.owned(uid_of(d), snap.replicasets)
        found = self._new_replicaset(d, rses)
        if found is None:
            return
        new, old = found
        sizes = {uid_of(rs): replicas_of(rs) for rs in rses + ([new] if new not in rses else [])}
        if (spec.get("strategy") or {}).get("type", "RollingUpdate") == "Recreate":
            self._recreate(new, old, replicas, sizes, snap)
        else:
            self._rolling(d, new, old, replicas, sizes, snap)
        for rs in [new, *old]:
            if sizes[uid_of(rs)] != replicas_of(rs):
                self._scale_replicaset(rs, sizes[uid_of(rs)])

    def _new_replicaset(self, d: dict[str, Any], rses: list[dict[str, Any]]
                        ) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The ReplicaSet of the current template (created if missing) and the old ones; revisions annotated
        the way the Deployment controller numbers them (a rollback takes the next number)."""
        spec = d.get("spec") or {}
        template = spec.get("template") or {}
        h = template_hash(template)
        new = next((rs for rs in rses if rs["metadata"].get("labels", {}).get(HASH_LABEL) == h), None)
        old = [rs for rs in rses if rs is not new]
        top = max((int(_revision(rs)) for rs in rses), default=0)
        if new is None:
            new = self._create_replicaset(d, template, h, top + 1,
                                          int(spec.get("replicas", 1)) if not any(replicas_of(o) for o in old)
                                          else 0)
            if new is None:
                return None
        elif int(_revision(new)) < top:
            self.w.annotate(new, "apps", "replicasets", REVISION_ANNOTATION, str(top + 1))  # a rollback
        if d["metadata"].get("annotations", {}).get(REVISION_ANNOTATION) != _revision(new, str(top + 1)):
            self.w.annotate(d, "apps", "deployments", REVISION_ANNOTATION, _revision(new, str(top + 1)))
        return new, old

    def _recreate(self, new: dict[str, Any], old: list[dict[str, Any]], replicas: int, sizes: dict[str, int],
                  snap: Snapshot) -> None:
        for rs in old:
            sizes[uid_of(rs)] = 0
        if not any(not is_terminal(p) for rs in old for p in snap.owned(uid_of(rs))):
            sizes[uid_of(new)] = replicas

    def _rolling(self, d: dict[str, Any], new: dict[str, Any], old: list[dict[str, Any]], replicas: int,
                 sizes: dict[str, int], snap: Snapshot) -> None:
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
        _cut_in_order(ordered_old, sizes, sum(sizes.values()) - (replicas + surge))
        room = replicas + surge - sum(sizes.values())
        if room > 0:
            sizes[new_uid] += min(room, replicas - sizes[new_uid])
        min_available = replicas - unavailable
        new_unavailable = sizes[new_uid] - _available(new, snap)
        max_down = sum(sizes.values()) - min_available - new_unavailable
        if max_down <= 0:
            return
        for rs in ordered_old:  # unhealthy old replicas go first: removing them costs no availability
            unhealthy = max(0, sizes[uid_of(rs)] - _available(rs, snap))
            cut = min(unhealthy, max_down)
            sizes[uid_of(rs)] -= cut
            max_down -= cut
        available = sum(min(sizes[uid_of(rs)], _available(rs, snap)) for rs in [new, *old])
        _cut_in_order(ordered_old, sizes, available - min_available)

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
        return create_quietly(self.w.store, "apps", "replicasets", rs)

    def _scale_replicaset(self, rs: dict[str, Any], replicas: int) -> None:
        def scale(obj: dict[str, Any]) -> dict[str, Any]:
            obj.setdefault("spec", {})["replicas"] = replicas
            return obj
        self.w.store.mutate("apps", "replicasets", rs["metadata"]["name"], rs["metadata"]["namespace"], scale)

    # --- status ------------------------------------------------------------------------------------------------

    def status(self, d: dict[str, Any], snap: Snapshot) -> None:
        spec = d.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        h = template_hash(spec.get("template") or {})
        rses = snap.owned(uid_of(d), snap.replicasets)
        new = next((rs for rs in rses if rs["metadata"].get("labels", {}).get(HASH_LABEL) == h), None)
        pods_of = {uid_of(rs): [p for p in snap.owned(uid_of(rs)) if not is_terminal(p)] for rs in rses}
        total_pods = sum(len(p) for p in pods_of.values())
        updated = len(pods_of.get(uid_of(new), [])) if new else 0
        ready = sum(1 for pods in pods_of.values() for p in pods if is_ready(p))
        sized = sum(replicas_of(rs) for rs in rses)
        _, unavailable = rolling_bounds(d, replicas)
        now_model = self.w.clock.now()
        now = stamp(self.w.clock, now_model)
        conds = list((d.get("status") or {}).get("conditions") or [])
        complete = (new is not None and updated == replicas and ready >= replicas and total_pods == replicas)
        signature = (new["metadata"]["name"] if new else "", updated, ready, total_pods, replicas)
        rs_name = new["metadata"]["name"] if new else d["metadata"]["name"]
        progressing = self._progressing(d, conds, complete, signature, rs_name, now, now_model)
        if ready >= replicas - unavailable:
            available = condition(conds, "Available", "True", "MinimumReplicasAvailable",
                                  "Deployment has minimum availability.", now)
        else:
            available = condition(conds, "Available", "False", "MinimumReplicasUnavailable",
                                  "Deployment does not have minimum availability.", now)
        status = omit_zero({
            "observedGeneration": d["metadata"].get("generation", 1), "replicas": total_pods,
            "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": ready,
            "unavailableReplicas": max(0, sized - ready)})
        status["conditions"] = [available, progressing]
        self.w.set_status("apps", "deployments", d, status)

    def _progressing(self, d: dict[str, Any], conds: list[dict[str, Any]], complete: bool,
                     signature: tuple[Any, ...], rs_name: str, now: str, now_model: float) -> dict[str, Any]:
        """The Progressing condition: complete, stuck past ``progressDeadlineSeconds`` of model time without a
        change of ``signature``, or progressing."""
        last_sig, since = self._progress.get(uid_of(d), (None, now_model))
        if signature != last_sig:
            since = now_model
            self._progress[uid_of(d)] = (signature, since)
        old_prog = next((c for c in conds if c.get("type") == "Progressing"), None)
        deadline = float((d.get("spec") or {}).get("progressDeadlineSeconds", 600))
        if complete:
            return condition(conds, "Progressing", "True", "NewReplicaSetAvailable",
                             f'ReplicaSet "{rs_name}" has successfully progressed.', now)
        if now_model - since > deadline or (
                old_prog and old_prog.get("reason") == "ProgressDeadlineExceeded" and signature == last_sig):
            return condition(conds, "Progressing", "False", "ProgressDeadlineExceeded",
                             f'ReplicaSet "{rs_name}" has timed out progressing.', now)
        return condition(conds, "Progressing", "True", "ReplicaSetUpdated",
                         f'ReplicaSet "{rs_name}" is progressing.', now)


def _cut_in_order(ordered: list[dict[str, Any]], sizes: dict[str, int], amount: int) -> None:
    """Take ``amount`` replicas off the ReplicaSets in ``ordered``, oldest first."""
    for rs in ordered:
        if amount <= 0:
            break
        cut = min(amount, sizes[uid_of(rs)])
        sizes[uid_of(rs)] -= cut
        amount -= cut
