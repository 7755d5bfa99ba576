"""Rollout planning: which cluster stages run, and which endpoints move in which wave.

Called from `kvfleet plan`, from the rollout DAG's plan task, and from tests. Pure and deterministic: the
same inventory and scope give byte-identical plans, so a resumed run re-derives the same waves.

Shape of a plan, per cluster (clusters sorted by name):
- the cluster stages 1–3 (tiered storage, operator add-ons, Curvine);
- wave 0, the *canary*: one endpoint per line of business on that cluster (the first by namespace/name);
- then waves of at most ``wave_size`` endpoints, in (LOB, namespace, name) order.
Waves are per cluster because the operator pause they need is cluster-wide (docs/architecture.md).

Each endpoint of a wave also gets its update strategy and the reason, from
:func:`choose_strategy`, the one judge used here (GPU room from the inventory: declared nodes × GPUs per node
minus every endpoint's replicas) and by stage 4 (GPU room observed live: the nodes' allocatable GPUs minus what
pods request). ``auto`` is ``rolling`` with 2 or more replicas (maxSurge 0, maxUnavailable 1 while the operator is
paused: N-1 keep serving, and no pod needs a GPU that is not freed first — no maxSurge deadlock), ``surge`` for one
replica when a GPU is spare (maxSurge 1, maxUnavailable 0), else ``scale-to-zero``, the seed's sequence. An asked
strategy that would take an endpoint to 0 replicas (rolling with one) or wait for a GPU that is not there (surge
without a spare one) is refused, never silently changed.

Each cluster also records what the inventory's defaults gave it, and why: its L2 injection mode (``auto``: kyverno on a
production cluster, patch elsewhere), its Curvine workers (one per GPU node unless ``worker.replicas`` overrides it)
and the L2 capacity as the sources state it (worker size × N); each endpoint the KV room its model leaves on the GPU
memory of one replica (``fleet.models``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvfleet.fleet import models
from kvfleet.fleet.cluster_ref import DEFAULT_ACCOUNT
from kvfleet.fleet.inventory import Cluster, Endpoint, Inventory, gpu_demand, model_fit
from kvfleet.fleet.inventory.policy import Policy

CLUSTER_STAGES = ("tiered_storage", "operator_addons", "curvine")

# The temporary Deployment strategies (Kubernetes' RollingUpdate fields), restored to the original afterwards.
ROLLING: dict[str, Any] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
SURGE: dict[str, Any] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
# What the API server defaults a Deployment's strategy to (restored when the live object shows none).
DEFAULT_STRATEGY: dict[str, Any] = {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}


@dataclass(frozen=True)
class StrategyChoice:
    """How one endpoint's Deployment is changed, and why. ``refused``: the asked strategy cannot be used safely
    here (the reason says what to do); the endpoint is then left untouched."""

    strategy: str  # rolling | surge | scale-to-zero
    reason: str
    refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {"strategy": self.strategy, "why": self.reason}
        return out if self.refused is None else {**out, "refused": self.refused}


def choose_strategy(asked: str, replicas: int, spare_gpus: int, where: str = "endpoint") -> StrategyChoice:
    """The one judge of the update strategy. ``asked``: auto | rolling | surge | scale-to-zero (``where`` it is set, for
    the reason); ``spare_gpus``: GPUs the scheduler could still place a pod on (each replica asks for one)."""
    if asked == "scale-to-zero":
        return StrategyChoice("scale-to-zero", f"asked ({where} update_strategy)")
    if asked == "rolling":
        if replicas < 2:
            return StrategyChoice("rolling", f"asked ({where} update_strategy)",
                                  refused=f"rolling with {replicas} replica(s) would leave 0 serving; set "
                                  "update_strategy: surge (needs a spare GPU) or scale-to-zero")
        return StrategyChoice("rolling", f"asked ({where} update_strategy): {replicas - 1} of {replicas} keep serving")
    if asked == "surge":
        if spare_gpus < 1:
            return StrategyChoice("surge", f"asked ({where} update_strategy)",
                                  refused="surge needs one spare GPU for the extra pod and none is free (the "
                                  "maxSurge deadlock); set update_strategy: rolling (2+ replicas) or scale-to-zero, "
                                  "or add a GPU node")
        return StrategyChoice("surge", f"asked ({where} update_strategy): {spare_gpus} spare GPU(s), all "
                              f"{replicas} keep serving")
    if replicas >= 2:
        return StrategyChoice("rolling", f"auto: {replicas} replicas, maxSurge 0 / maxUnavailable 1 keeps "
                              f"{replicas - 1} serving")
    if replicas == 1 and spare_gpus >= 1:
        return StrategyChoice("surge", f"auto: 1 replica and {spare_gpus} spare GPU(s), so one more pod fits "
                              "(maxSurge 1 / maxUnavailable 0)")
    if replicas == 0:
        return StrategyChoice("scale-to-zero", "auto: 0 replicas, nothing serves")
    return StrategyChoice("scale-to-zero", "auto: 1 replica and no spare GPU: scale-to-zero, the seed's sequence "
                          "(an outage while the patch lasts); add a GPU or a replica to avoid it")


def choose_wave_strategies(asked: list[tuple[str, str, int, str]], spare_gpus: int) -> dict[str, StrategyChoice]:
    """One choice per endpoint of a wave, from (key, asked, replicas, where): the endpoints of a wave change at
    once, so each surge takes one of the spare GPUs from the next."""
    out: dict[str, StrategyChoice] = {}
    for key, strategy, replicas, where in asked:
        choice = choose_strategy(strategy, replicas, spare_gpus, where)
        if choice.strategy == "surge" and choice.refused is None:
            spare_gpus -= 1
        out[key] = choice
    return out


@dataclass(frozen=True)
class Wave:
    cluster: str
    index: int
    kind: str  # "canary" | "wave"
    endpoints: tuple[Endpoint, ...]
    strategies: tuple[StrategyChoice, ...] = ()  # one per endpoint, same order (planned from the inventory)

    @property
    def wave_id(self) -> str:
        return f"{self.cluster}/w{self.index}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "wave": self.wave_id,
            "index": self.index,
            "kind": self.kind,
            "endpoints": [
                {"ref": e.ref, "namespace": e.namespace, "name": e.name, "lob": e.lob,
                 **({"update_strategy": self.strategies[i].as_dict()} if self.strategies else {}),
                 **({"model_fit": fit} if (fit := model_fit_dict(e)) else {})}
                for i, e in enumerate(self.endpoints)
            ],
        }


def model_fit_dict(ep: Endpoint) -> dict[str, Any] | None:
    """The endpoint's model against one replica's GPU memory, for the plan (None when kvfleet cannot tell)."""
    f = model_fit(ep)
    if f is None:
        return None
    size = ep.size
    spec = models.lookup(size.catalogue_model) if size.catalogue_model else None
    per_token = spec.kv_bytes_per_token(size.dtype) if spec and size.dtype else None
    out: dict[str, Any] = {
        "model": size.catalogue_model or ep.model, "params_b": size.params_b, "dtype": size.dtype,
        "weights_gib": round(f.weights_gib, 1), "gpu_memory_gib": round(f.gpu_memory_gib, 1),
        "kv_room_gib": round(f.kv_room_gib, 1), "kv_room_usable_gib": round(f.kv_room_usable_gib, 1),
        "gpu_memory_utilization": models.VLLM_GPU_MEMORY_UTILIZATION,
    }
    if per_token and f.kv_room_usable_gib > 0:
        out["kv_tokens"] = int(f.kv_room_usable_gib * models.GIB // per_token)
    return out


def _fit_text(fit: dict[str, Any]) -> str:
    tokens = f", ≈ {fit['kv_tokens']:,} tokens" if "kv_tokens" in fit else ""
    return (f"{fit['model']} {fit['params_b']:g} B {fit['dtype']}: weights {fit['weights_gib']} GiB of "
            f"{fit['gpu_memory_gib']:g} GiB, KV room {fit['kv_room_gib']} GiB after the weights "
            f"({fit['kv_room_usable_gib']} GiB within vLLM's {fit['gpu_memory_utilization']:g}{tokens})")


@dataclass(frozen=True)
class ClusterPlan:
    cluster: str
    stages: tuple[str, ...]
    waves: tuple[Wave, ...]
    l2_injection: str = "patch"
    l2_injection_reason: str = ""
    curvine_workers: int = 0
    curvine_workers_reason: str = ""
    curvine_capacity: str = ""
    key: str = ""  # account/region/name (kvfleet.fleet.cluster_ref)

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "key": self.key, "stages": list(self.stages),
                "l2_injection": {"mode": self.l2_injection, "why": self.l2_injection_reason},
                "curvine": {"workers": self.curvine_workers, "why": self.curvine_workers_reason,
                            "capacity": self.curvine_capacity},
                "waves": [w.as_dict() for w in self.waves]}


def _workers_reason(cluster: Cluster) -> str:
    declared, nodes = cluster.curvine.worker.replicas, cluster.gpu_nodes.count
    if declared is None:
        return f"default: one per GPU node ({nodes} nodes)"
    if declared == nodes:
        return f"worker.replicas {declared}, one per GPU node"
    return f"worker.replicas {declared} overrides the default of one per GPU node ({nodes} nodes)"


@dataclass(frozen=True)
class Plan:
    source: str
    wave_size: int
    canary: bool
    clusters: tuple[ClusterPlan, ...]
    # The policy of each LOB in scope that sets one (``lobs[].policy``): the least a run may ask for.
    policy: tuple[tuple[str, Policy], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "fleet": self.source,
            "wave_size": self.wave_size,
            "canary": self.canary,
            "clusters": [c.as_dict() for c in self.clusters],
            "policy": {lob: p.model_dump() for lob, p in self.policy},
        }

    def waves_of(self, cluster: str) -> tuple[Wave, ...]:
        """The waves of the cluster ``cluster`` names: its key, else its name."""
        for c in sorted(self.clusters, key=lambda c: c.key != cluster):
            if cluster in (c.key, c.cluster):
                return c.waves
        return ()


def _order(e: Endpoint) -> tuple[str, str, str]:
    return (e.lob, e.namespace, e.name)


def _with_strategies(inventory: Inventory, waves: tuple[Wave, ...], spare_gpus: int) -> tuple[Wave, ...]:
    out = []
    for w in waves:
        asked = []
        for e in w.endpoints:
            strategy, where = inventory.update_strategy(e)
            asked.append((e.key, strategy, e.replicas, where))
        chosen = choose_wave_strategies(asked, spare_gpus)
        out.append(Wave(w.cluster, w.index, w.kind, w.endpoints, tuple(chosen[e.key] for e in w.endpoints)))
    return tuple(out)


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
    for cluster in sorted(inventory.clusters, key=lambda c: (c.name, c.key)):
        eps = list(inventory.endpoints_of(cluster.key))
        waves = plan_cluster_waves(eps, cluster.name, size, canary)
        if cluster.l2_injection == "patch":  # kyverno mode: the operator re-renders with its own strategy
            needed, available = gpu_demand(cluster, eps)
            waves = _with_strategies(inventory, waves, max(0, available - needed))
        clusters.append(ClusterPlan(
            cluster.name, CLUSTER_STAGES, waves,
            l2_injection=cluster.l2_injection,
            l2_injection_reason=cluster.l2_injection_reason or f"asked (l2_injection: {cluster.l2_injection})",
            curvine_workers=cluster.curvine_workers,
            curvine_workers_reason=_workers_reason(cluster),
            curvine_capacity=cluster.curvine.worker.capacity(cluster.curvine_workers), key=cluster.key,
        ))
    return Plan(inventory.source, size, canary, tuple(clusters), policy_in_scope(inventory))


def policy_in_scope(inventory: Inventory) -> tuple[tuple[str, Policy], ...]:
    """The LOBs with endpoints in ``inventory`` (a run's scope) that set a policy, and theirs."""
    touched = {e.lob for e in inventory.endpoints}
    return tuple((x.name, x.policy) for x in inventory.lobs if x.name in touched and x.policy != Policy())


def render_plan_text(plan: Plan) -> str:
    lines = [f"rollout plan for {plan.source} (wave size {plan.wave_size}, canary {'on' if plan.canary else 'off'})"]
    lines += [f"policy of lob {lob}: {p.shown()}" for lob, p in plan.policy]
    for c in plan.clusters:
        lines.append(f"cluster {c.cluster}" + ("" if c.key.startswith(f"{DEFAULT_ACCOUNT}/") else f" ({c.key})"))
        lines.append(f"  L2 injection: {c.l2_injection} — {c.l2_injection_reason}")
        lines.append(f"  Curvine: {c.curvine_workers} workers ({c.curvine_workers_reason}); L2 capacity "
                     f"{c.curvine_capacity}")
        for i, stage in enumerate(c.stages, start=1):
            lines.append(f"  stage {i}: {stage}")
        for w in c.waves:
            refs = ", ".join(f"{e.namespace}/{e.name} [{e.lob}]" for e in w.endpoints)
            lines.append(f"  {w.wave_id} ({w.kind}): {refs}")
            for e, s in zip(w.endpoints, w.strategies, strict=False):
                lines.append(f"    {e.namespace}/{e.name}: {s.strategy} — {s.reason}"
                             + (f"; REFUSED: {s.refused}" if s.refused else ""))
            for e in w.endpoints:
                if (fit := model_fit_dict(e)) is not None:
                    lines.append(f"    {e.namespace}/{e.name}: {_fit_text(fit)}")
        if not c.waves:
            lines.append("  no endpoints in scope")
        elif any(w.strategies for w in c.waves):
            lines.append("  (update strategies judged on the inventory's GPUs; stage 4 judges again on the live "
                         "nodes, and `plan --diff` shows that)")
        else:
            lines.append("  (kyverno mode: the operator re-renders with its own Deployment strategy; "
                         "update_strategy applies to patch mode)")
    return "\n".join(lines)
