"""Batches of the hourly verification sweep: endpoints whose pods share no node are verified at the
same time within a cluster; endpoints that share a node are not, so that one probe's prefill does not disturb the
TTFT the other measures.

Pure: the pod read is ``stages.verify.endpoint_nodes``; the thread pool is ``airflow.verification``.

- ``nodes_by_endpoint``: from the pods of one read (the same selection stage 5 picks its two pods from:
  ``app=<endpoint name>`` in the endpoint's namespace), the set of nodes of each endpoint's live pods
  (``endpoint_spec.pod_is_live``; every live pod counts, not only the two a probe will pick, so a batch stays
  node-disjoint whichever two it picks). An endpoint without a live pod on a node has ``None``: unknown.
- ``plan_batches``: a deterministic greedy colouring. Endpoints in the given (inventory) order, each into the
  first batch whose nodes it does not touch; an endpoint whose nodes are unknown (``None``: its pods could not be
  read, or it has none) gets a batch of its own, since nothing says what it would disturb.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvfleet.fleet.endpoint_spec import pod_is_live

K = TypeVar("K", bound=Hashable)


@dataclass
class _Batch:
    members: list[Any] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)
    alone: bool = False  # an endpoint of unknown nodes: nothing may join it


def plan_batches(order: Sequence[K], nodes: Mapping[K, frozenset[str] | None]) -> list[list[K]]:
    """``order`` (each key once, in inventory order) split into batches: within a batch no two keys share a node.
    A key missing from ``nodes``, or mapped to ``None``, is a batch of its own. A key with an empty node set
    touches no node (it will not probe) and joins the first open batch. Batches keep ``order`` inside them and
    are listed by their first member's position, so the same input always gives the same plan."""
    if len(set(order)) != len(order):
        raise ValueError("plan_batches: every endpoint must appear once in the order")
    batches: list[_Batch] = []
    for key in order:
        mine = nodes.get(key)
        if mine is None:
            batches.append(_Batch([key], alone=True))
            continue
        for batch in batches:
            if not batch.alone and batch.nodes.isdisjoint(mine):
                batch.members.append(key)
                batch.nodes.update(mine)
                break
        else:
            batches.append(_Batch([key], set(mine)))
    return [list(b.members) for b in batches]


def nodes_by_endpoint(pods: Sequence[Mapping[str, Any]],
                      endpoints: Sequence[tuple[K, str, str]]) -> dict[K, frozenset[str] | None]:
    """``endpoints``: (key, namespace, name). Each key's set of nodes of its live pods (label ``app`` = name, in
    its namespace), or ``None`` when it has no live pod bound to a node."""
    found: dict[tuple[str, str], set[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        app = (meta.get("labels") or {}).get("app")
        if app is None or not node or not pod_is_live(pod):
            continue
        found.setdefault((str(meta.get("namespace")), str(app)), set()).add(str(node))
    out: dict[K, frozenset[str] | None] = {}
    for key, namespace, name in endpoints:
        got = found.get((namespace, name))
        out[key] = frozenset(got) if got else None
    return out


def describe(batches: Sequence[Sequence[Any]]) -> str:
    """One log line: how many batches, and their sizes."""
    sizes = [len(b) for b in batches]
    return (f"{sum(sizes)} endpoint(s) in {len(batches)} batch(es) of node-disjoint endpoints, sizes "
            f"{', '.join(map(str, sizes)) or '-'}")
