"""Rollout planning: which cluster stages run, and which endpoints move in which wave.

Called from `kvfleet plan`, from the rollout DAG's plan task, and from tests. Pure and deterministic: the
same inventory and scope give byte-identical plans, so a resumed run re-derives the same waves.

Shape of a plan, per cluster (clusters sorted by name):
- the cluster stages 1–3 (tiered storage, operator add-ons, Curvine);
- wave 0, the *canary*: one endpoint per line of business on that cluster (the first by namespace/name);
- then waves of at most ``wave_size`` endpoints, in (LOB, namespace, name) order.
Waves are per cluster because the operator pause they need is cluster-wide (ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvfleet.fleet.inventory import Endpoint, Inventory

CLUSTER_STAGES = ("tiered_storage", "operator_addons", "curvine")


@dataclass(frozen=True)
class Wave:
    cluster: str
    index: int
    kind: str  # "canary" | "wave"
    endpoints: tuple[Endpoint, ...]

    @property
    def wave_id(self) -> str:
        return f"{self.cluster}/w{self.index}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "wave": self.wave_id,
            "index": self.index,
            "kind": self.kind,
            "endpoints": [
                {"ref": e.ref, "namespace": e.namespace, "name": e.name, "lob": e.lob} for e in self.endpoints
            ],
        }


@dataclass(frozen=True)
class ClusterPlan:
    cluster: str
    stages: tuple[str, ...]
    waves: tuple[Wave, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "stages": list(self.stages), "waves": [w.as_dict() for w in self.waves]}


@dataclass(frozen=True)
class Plan:
    source: str
    wave_size: int
    canary: bool
    clusters: tuple[ClusterPlan, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "fleet": self.source,
            "wave_size": self.wave_size,
            "canary": self.canary,
            "clusters": [c.as_dict() for c in self.clusters],
        }

    def waves_of(self, cluster: str) -> tuple[Wave, ...]:
        for c in self.clusters:
            if c.cluster == cluster:
                return c.waves
        return ()


def _order(e: Endpoint) -> tuple[str, str, str]:
    return (e.lob, e.namespace, e.name)


def plan_cluster_waves(endpoints: list[Endpoint], cluster: str, wave_size: int, canary: bool) -> tuple[Wave, ...]:
    ordered = sorted(endpoints, key=_order)
    waves: list[Wave] = []
    rest = ordered
    if canary and ordered:
        picked: dict[str, Endpoint] = {}
        for e in ordered:
            picked.setdefault(e.lob, e)
        canaries = tuple(picked[lob] for lob in sorted(picked))
        waves.append(Wave(cluster, 0, "canary", canaries))
        rest = [e for e in ordered if e not in canaries]
    for start in range(0, len(rest), wave_size):
        waves.append(Wave(cluster, len(waves), "wave", tuple(rest[start : start + wave_size])))
    return tuple(waves)


def make_plan(inventory: Inventory, *, wave_size: int | None = None, canary: bool = True) -> Plan:
    size = wave_size or inventory.settings.wave_size
    if size < 1:
        raise ValueError(f"wave_size: {size} is below 1; use 1 or more")
    clusters = []
    for cluster in sorted(inventory.clusters, key=lambda c: c.name):
        eps = list(inventory.endpoints_of(cluster.name))
        clusters.append(ClusterPlan(cluster.name, CLUSTER_STAGES, plan_cluster_waves(eps, cluster.name, size, canary)))
    return Plan(inventory.source, size, canary, tuple(clusters))


def render_plan_text(plan: Plan) -> str:
    lines = [f"rollout plan for {plan.source} (wave size {plan.wave_size}, canary {'on' if plan.canary else 'off'})"]
    for c in plan.clusters:
        lines.append(f"cluster {c.cluster}")
        for i, stage in enumerate(c.stages, start=1):
            lines.append(f"  stage {i}: {stage}")
        for w in c.waves:
            refs = ", ".join(f"{e.namespace}/{e.name} [{e.lob}]" for e in w.endpoints)
            lines.append(f"  {w.wave_id} ({w.kind}): {refs}")
        if not c.waves:
            lines.append("  no endpoints in scope")
    return "\n".join(lines)
