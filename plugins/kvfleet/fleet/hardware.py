"""GPU hardware of the SageMaker instance types kvfleet knows: GPUs per node and memory per GPU, with sources.

Pure. Used by the inventory's GPU-capacity check (``kvfleet validate``) and available to a model-fit check
(issue 22 §5: weights + KV room against the GPU memory of one replica).

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

Issue 22 §5 names the per-GPU figures g5 24 GB, g6e 48 GB, p5 80 GB; they agree with the table below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


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

# Extra GPUs the L2 injection strategy needs while it changes a wave. `patch` follows the blog's sequence:
# scale the Deployment to 0 *before* patching, so no pod of the old and the new spec run side by side (FACTS
# §2.3, "maxSurge deadlock") and the headroom is 0. `kyverno` lets the operator re-render; the operator's own
# Deployment strategy decides, and kvfleet does not surge either. A rolling update with maxSurge would add
# replicas × GPUS_PER_REPLICA of the largest endpoint in a wave here.
PATCH_HEADROOM_GPUS: Final = {"patch": 0, "kyverno": 0}


def gpu_shape(instance_type: str) -> GpuShape | None:
    """The GPUs of a SageMaker instance type, or None when kvfleet has no sourced row for it."""
    return INSTANCE_GPUS.get(instance_type)


def known_types() -> list[str]:
    return sorted(INSTANCE_GPUS)
