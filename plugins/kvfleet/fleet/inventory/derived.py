"""Values derived from a validated inventory: the L2 injection a cluster runs, its GPU budget, a model's size and
whether it fits one replica."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvfleet.fleet import hardware, models

if TYPE_CHECKING:
    from kvfleet.fleet.inventory.schema import Cluster, Endpoint


def resolve_l2_injection(asked: str, production: bool) -> tuple[str, str]:
    """(the L2 injection a cluster runs, why): `auto` is kyverno on a production cluster, patch elsewhere."""
    if asked == "auto":
        if production:
            return "kyverno", ("auto: production cluster → kyverno (the sources: a manual patch does not survive "
                               "operator re-renders in long-lived production)")
        return "patch", "auto: not a production cluster → patch (the seed's patch sequence, batched per wave)"
    return asked, f"asked (l2_injection: {asked})"


def gpu_budget(instance_type: str, node_count: int, l2_mode: str, replicas: Iterable[int]) -> tuple[int, int]:
    """(GPUs the replicas need, GPUs the nodes have), the headroom of the cluster's L2 mode included."""
    shape = hardware.gpu_shape(instance_type)
    available = node_count * (shape.gpus if shape else 0)
    needed = sum(r * hardware.GPUS_PER_REPLICA for r in replicas)
    # Surge headroom of the change strategy goes here (0 for both today: see hardware.PATCH_HEADROOM_GPUS).
    return needed + hardware.PATCH_HEADROOM_GPUS.get(l2_mode, 0), available


def replica_fit(instance_type: str, params_b: float | None, dtype: str | None) -> models.Fit | None:
    """A model against the GPU memory of one replica, or None when either is unknown."""
    shape = hardware.gpu_shape(instance_type)
    if shape is None or params_b is None or dtype is None:
        return None
    return models.fit(params_b, dtype, shape, hardware.GPUS_PER_REPLICA)


@dataclass(frozen=True)
class ModelSize:
    params_b: float | None
    dtype: str | None
    catalogue_model: str | None


def model_size(ep: Endpoint) -> ModelSize:
    """The served model's size: explicit `model_params_b` (+ `dtype`), else the catalogue row of `model`, else of
    `model_id` (what the operator downloads); unknown when none of them says."""
    spec = models.lookup(ep.model) or models.lookup(ep.model_id)
    if ep.model_params_b is not None:
        return ModelSize(ep.model_params_b, ep.dtype or (spec.dtype if spec else None), None)
    if spec is not None:
        return ModelSize(spec.params_b, ep.dtype or spec.dtype, spec.key)
    return ModelSize(None, ep.dtype, None)


def gpu_demand(cluster: Cluster, endpoints: Iterable[Endpoint]) -> tuple[int, int]:
    """(GPUs the cluster's endpoints need, GPUs its declared nodes have), headroom of its L2 mode included."""
    return gpu_budget(cluster.gpu_nodes.instance_type, cluster.gpu_nodes.count, cluster.l2_injection,
                      [e.replicas for e in endpoints if e.on(cluster)])


def model_fit(ep: Endpoint) -> models.Fit | None:
    """The endpoint's model against the GPU memory of one replica, or None when either is unknown."""
    size = ep.size
    return replica_fit(ep.instance_type, size.params_b, size.dtype)
