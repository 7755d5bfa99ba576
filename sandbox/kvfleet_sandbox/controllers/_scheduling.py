"""Pure scheduling rules of the workload simulation: which node a pod may go to, and the scheduler's message when
none fits.

Called from :mod:`kvfleet_sandbox.controllers.workloads` once per pass with a snapshot of the nodes. Kept apart
because these rules are what make the traps real (docs/reference/hyperpod.md#maxsurge-deadlock): a pod asking for
``nvidia.com/gpu`` fits only a node with a free GPU, so a surge pod with every GPU taken stays Pending for ever.

Pod anti-affinity (kube-scheduler's InterPodAffinity plugin, reduced): a *required* term excludes every node
whose topology domain (the value of ``topologyKey`` on the node; ``kubernetes.io/hostname`` is the node) already
runs a pod the term's ``labelSelector`` matches, in the term's ``namespaces`` (default: the pod's own); a
*preferred* term only ranks such nodes after the others, by weight. This is what makes a Curvine chart installed
with upstream's default (``worker.antiAffinity.type: preferred``) put two workers on one node when nodes run
short, and ``required`` leave the extra worker Pending. Not modelled: the symmetric check of existing pods'
anti-affinity, pod (non-anti) affinity and ``namespaceSelector``.

Ties (``choose``): kube-scheduler picks at random among the nodes with the highest score (kubernetes
``pkg/scheduler/schedule_one.go`` selectHost; facts: tests/conformance/facts/kube_scheduler.yaml) and remembers
nothing of a pod's predecessor. A twin cannot be random, and an order by node name alone made the node of a
replaced StatefulSet pod depend on which pods its pass happened to schedule before it (a Curvine master replaced
in the same pass took the node a hostPath worker had just left, which then lost its blocks). So among equally good
nodes the twin takes the one the pod's name last ran on (``previous``: a StatefulSet pod its controller replaced),
then the first by name: one of the outcomes the real scheduler may draw, whatever the order of the pass. It only
breaks ties: a node that is gone, cordoned, tainted, full or worse scored is never preferred, so a worker whose
node is lost, or that a better node draws away, still moves (and a hostPath worker starts empty).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kvfleet_sandbox.controllers._objects import is_terminal, quantity

GPU = "nvidia.com/gpu"
LOST_ANNOTATION = "sandbox.kvfleet.io/lost"
TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"


@dataclass
class NodeSlot:
    """A node as the scheduler sees it in one pass."""

    name: str
    labels: dict[str, str]
    ready: bool
    lost: bool
    cordoned: bool
    taints: list[dict[str, Any]]
    gpus: int
    ip: str
    gpus_used: float = 0.0
    pods: int = 0
    pod_names: list[str] = field(default_factory=list)
    pod_labels: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (namespace, labels) per pod

    @property
    def gpus_free(self) -> float:
        return self.gpus - self.gpus_used


def node_slot(node: dict[str, Any], default_gpus: int) -> NodeSlot:
    meta, status = node["metadata"], node.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    gpus_raw = (status.get("allocatable") or {}).get(GPU, (status.get("capacity") or {}).get(GPU))
    ip = next((a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"), "")
    return NodeSlot(
        name=meta["name"], labels=dict(meta.get("labels") or {}), ready=ready,
        lost=(meta.get("annotations") or {}).get(LOST_ANNOTATION) == "true",
        cordoned=bool((node.get("spec") or {}).get("unschedulable")),
        taints=list((node.get("spec") or {}).get("taints") or []),
        gpus=int(quantity(gpus_raw)) if gpus_raw is not None else default_gpus, ip=ip)


def gpu_request(pod_spec: dict[str, Any]) -> float:
    """GPUs a pod asks for: limits win (the device plugin counts limits), requests otherwise."""
    total = 0.0
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU, (res.get("requests") or {}).get(GPU))
        total += quantity(value)
    return total


def account(slots: dict[str, NodeSlot], pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in slots and not is_terminal(pod):
            slots[node].gpus_used += gpu_request(pod["spec"])
            slots[node].pods += 1
            slots[node].pod_names.append(pod["metadata"]["name"])
            slots[node].pod_labels.append((pod["metadata"].get("namespace", ""),
                                           dict(pod["metadata"].get("labels") or {})))


def _expression_matches(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", "In"), [str(v) for v in expr.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            left, right = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def selector_matches(pod_spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """nodeSelector and required node affinity (``node.kubernetes.io/instance-type`` In [...] and the like)."""
    if any(labels.get(k) != str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(all(_expression_matches(e, labels) for e in term.get("matchExpressions") or []) for term in terms)


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and not tol.get("key"):
            return True
        if tol.get("key") == taint.get("key") and (
                tol.get("operator") == "Exists" or tol.get("value", "") == taint.get("value", "")):
            return True
    return False


def untolerated_taint(slot: NodeSlot, pod_spec: dict[str, Any]) -> str | None:
    tolerations = pod_spec.get("tolerations") or []
    taints = list(slot.taints)
    if not slot.ready and not any(t.get("key") in (TAINT_UNREACHABLE, TAINT_NOT_READY) for t in taints):
        taints.append({"key": TAINT_NOT_READY, "effect": "NoSchedule"})
    for taint in taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    return None


def why_not(slot: NodeSlot, pod_spec: dict[str, Any], gpus: float) -> str | None:
    """The scheduler's reason this node cannot take the pod, or None if it can."""
    if slot.lost or not slot.ready:
        return untolerated_taint(slot, pod_spec) or "node(s) were unreachable"
    if slot.cordoned:
        return "node(s) were unschedulable"
    taint = untolerated_taint(slot, pod_spec)
    if taint:
        return taint
    if not selector_matches(pod_spec, slot.labels):
        return "node(s) didn't match Pod's node affinity/selector"
    if gpus > 0 and slot.gpus_free < gpus:
        return f"Insufficient {GPU}"
    return None


def label_selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A ``LabelSelector`` (matchLabels and matchExpressions); an absent selector matches nothing."""
    if selector is None:
        return False
    if any(labels.get(k) != str(v) for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_expression_matches(e, labels) for e in selector.get("matchExpressions") or [])


def _anti_terms(pod_spec: dict[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
    anti = (pod_spec.get("affinity") or {}).get("podAntiAffinity") or {}
    required = list(anti.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    preferred = [(int(p.get("weight", 1)), p.get("podAffinityTerm") or {})
                 for p in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
    return required, preferred


def _domain_of(slot: NodeSlot, key: str) -> str | None:
    return slot.labels.get(key, slot.name if key == "kubernetes.io/hostname" else None)


def _domain_matches(slots: dict[str, NodeSlot], slot: NodeSlot, term: dict[str, Any], namespace: str) -> int:
    """How many pods in ``slot``'s topology domain the anti-affinity ``term`` selects."""
    key = term.get("topologyKey") or "kubernetes.io/hostname"
    domain = _domain_of(slot, key)
    if domain is None:
        return 0
    namespaces = set(term.get("namespaces") or [namespace])
    count = 0
    for other in slots.values():
        if _domain_of(other, key) != domain:
            continue
        count += sum(1 for ns, labels in other.pod_labels
                     if ns in namespaces and label_selector_matches(term.get("labelSelector"), labels))
    return count


def choose(slots: dict[str, NodeSlot], pod_spec: dict[str, Any], namespace: str = "default",
           previous: str | None = None) -> tuple[NodeSlot | None, str]:
    """The node for a pod (least loaded, like the default scheduler's spreading, after any preferred pod
    anti-affinity), or None and the message the real scheduler would write into ``PodScheduled``
    (``0/16 nodes are available: 16 Insufficient ...``). Ties go to ``previous`` (the node the pod's name last
    ran on), then to the first node by name (see the module docstring)."""
    gpus = gpu_request(pod_spec)
    required, preferred = _anti_terms(pod_spec)
    reasons: Counter[str] = Counter()
    fits: list[tuple[int, NodeSlot]] = []
    for slot in slots.values():
        reason = why_not(slot, pod_spec, gpus)
        if reason is None and any(_domain_matches(slots, slot, t, namespace) for t in required):
            reason = "node(s) didn't match pod anti-affinity rules"
        if reason is None:
            penalty = sum(w for w, t in preferred if _domain_matches(slots, slot, t, namespace))
            fits.append((penalty, slot))
        else:
            reasons[reason] += 1
    if fits:
        return min(fits, key=lambda f: (f[0], f[1].gpus_used, f[1].pods, f[1].name != previous,
                                        f[1].name))[1], ""
    return None, unschedulable_message(len(slots), reasons)


def unschedulable_message(total: int, reasons: Counter[str] | None = None, extra: str | None = None) -> str:
    parts = [extra] if extra else [f"{n} {r}" for r, n in sorted((reasons or Counter()).items())]
    return (f"0/{total} nodes are available: {', '.join(parts)}. preemption: 0/{total} nodes are available: "
            f"{total} No preemption victims found for incoming pod.")
