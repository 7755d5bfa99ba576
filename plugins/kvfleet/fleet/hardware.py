"""GPU hardware of the SageMaker instance types kvfleet knows: GPUs per node and memory per GPU, with sources.

Pure. Used by the inventory's GPU-capacity check (``kvfleet validate``), by stage 4's choice of an update
strategy (``spare_gpus``: is there room for one more pod?), and by the model-fit check (
``fleet.models.fit``: a model's weights against the GPU memory of one replica, refused when they do not fit; the KV
room left is shown in the plan).

Sources (one per family; the SageMaker ``ml.`` type has the hardware of the EC2 type of the same name):

- G5 (NVIDIA A10G, 24 GiB each): https://aws.amazon.com/ec2/instance-types/g5/ and the table "GPU jobs" in
  https://docs.aws.amazon.com/batch/latest/userguide/gpu-jobs.html (g5.xlarge–16xlarge 1 GPU, 12xlarge and
  24xlarge 4, 48xlarge 8).
- G6 (NVIDIA L4, 24 GiB each): https://aws.amazon.com/ec2/instance-types/g6/ and the same Batch table
  (g6.xlarge–16xlarge 1, 12xlarge and 24xlarge 4, 48xlarge 8).
- G6e (NVIDIA L40S, 48 GiB each): https://aws.amazon.com/ec2/instance-types/g6e/ (g6e.xlarge–16xlarge 1 GPU,
  12xlarge and 24xlarge 4, 48xlarge 8; "up to 8 NVIDIA L40S Tensor Core GPUs with 48 GB of memory per GPU").
- P4d / P4de (NVIDIA A100, 40 GiB / 80 GiB each): https://aws.amazon.com/ec2/instance-types/p4/ (8 GPUs,
  320 GB HBM2 on p4d.24xlarge, 640 GB HBM2e on p4de.24xlarge).
- P5 / P5e / P5en (NVIDIA H100 80 GiB / H200 141 GiB each): https://aws.amazon.com/ec2/instance-types/p5/
  (8 GPUs; 640 GB HBM3 on p5.48xlarge, 1128 GB HBM3e on p5e/p5en.48xlarge).
- All of them: https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html (accelerated computing
  specifications: "GPUs" and "GPU memory (GiB)" per size).

The per-GPU figures g5 24 GB, g6e 48 GB and p5 80 GB agree with the table below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class GpuShape:
    gpus: int  # NVIDIA GPUs per node
    gpu_memory_gib: int  # memory of ONE GPU
    gpu: str  # the GPU model, for messages
    source: str  # the AWS page the row comes from


_G5: Final = "https://aws.amazon.com/ec2/instance-types/g5/"
_G6: Final = "https://aws.amazon.com/ec2/instance-types/g6/"
_G6E: Final = "https://aws.amazon.com/ec2/instance-types/g6e/"
_P4: Final = "https://aws.amazon.com/ec2/instance-types/p4/"
_P5: Final = "https://aws.amazon.com/ec2/instance-types/p5/"


def _family(prefix: str, gpu: str, memory: int, source: str, sizes: dict[str, int]) -> dict[str, GpuShape]:
    return {f"ml.{prefix}.{size}": GpuShape(n, memory, gpu, source) for size, n in sizes.items()}


_SINGLE_THEN_4_4_8: Final = {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1,
                             "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}

INSTANCE_GPUS: Final[dict[str, GpuShape]] = {
    **_family("g5", "NVIDIA A10G", 24, _G5, _SINGLE_THEN_4_4_8),
    **_family("g6", "NVIDIA L4", 24, _G6, _SINGLE_THEN_4_4_8),
    **_family("g6e", "NVIDIA L40S", 48, _G6E, _SINGLE_THEN_4_4_8),
    "ml.p4d.24xlarge": GpuShape(8, 40, "NVIDIA A100", _P4),
    "ml.p4de.24xlarge": GpuShape(8, 80, "NVIDIA A100", _P4),
    "ml.p5.48xlarge": GpuShape(8, 80, "NVIDIA H100", _P5),
    "ml.p5e.48xlarge": GpuShape(8, 141, "NVIDIA H200", _P5),
    "ml.p5en.48xlarge": GpuShape(8, 141, "NVIDIA H200", _P5),
}

# What kvfleet's InferenceEndpointConfig asks per replica (endpoint_spec.render_iec: nvidia.com/gpu limit 1).
GPUS_PER_REPLICA: Final = 1

# Extra GPUs the L2 injection strategy needs while it changes a wave, beyond the endpoints' replicas. `patch`
# mode never asks for GPUs that are not spare: scale-to-zero and rolling (maxSurge 0) free a GPU before a new
# pod needs it (docs/reference/hyperpod.md#maxsurge-deadlock), and stage 4 picks surge only when the live nodes have a
# spare GPU for each surging endpoint (``spare_gpus``). `kyverno` lets the operator re-render with its
# own Deployment strategy. So the headroom declared here stays 0 for both.
PATCH_HEADROOM_GPUS: Final = {"patch": 0, "kyverno": 0}
GPU_RESOURCE: Final = "nvidia.com/gpu"


def _gpus(resources: dict[str, Any] | None) -> int:
    try:
        return int(str((resources or {}).get(GPU_RESOURCE, 0)))
    except ValueError:
        return 0


def _pod_gpus(pod: dict[str, Any]) -> int:
    """A pod's GPU request (a container without a request asks for its limit, as the API server defaults)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        total += _gpus(res.get("requests")) or _gpus(res.get("limits"))
    return total


def _schedulable(node: dict[str, Any]) -> bool:
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or [])
    return ready and not (node.get("spec") or {}).get("unschedulable")


INSTANCE_TYPE_LABEL: Final = "node.kubernetes.io/instance-type"


def spare_gpus(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], instance_type: str | None = None) -> int:
    """How many more one-GPU pods the scheduler could place: per Ready, schedulable node (of ``instance_type``
    when given: the operator's Deployments require it by node affinity), allocatable GPUs minus the requests of
    the pods bound to it (never below 0), summed, less the GPUs Pending unbound pods wait for (all of them:
    conservative). ``nodes`` and ``pods`` are API objects as dicts (camelCase)."""
    free = {}
    for n in nodes:
        labels = n["metadata"].get("labels") or {}
        if _schedulable(n) and instance_type in (None, labels.get(INSTANCE_TYPE_LABEL)):
            free[str(n["metadata"]["name"])] = _gpus((n.get("status") or {}).get("allocatable"))
    waiting = 0
    for p in pods:
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        node = (p.get("spec") or {}).get("nodeName")
        if node is None:
            waiting += _pod_gpus(p)
        elif node in free:
            free[node] -= _pod_gpus(p)
    return max(0, sum(max(0, f) for f in free.values()) - waiting)


def gpu_shape(instance_type: str) -> GpuShape | None:
    """The GPUs of a SageMaker instance type, or None when kvfleet has no sourced row for it."""
    return INSTANCE_GPUS.get(instance_type)


def known_types() -> list[str]:
    return sorted(INSTANCE_GPUS)
