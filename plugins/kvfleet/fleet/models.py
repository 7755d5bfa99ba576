"""A small catalogue of the models the sources name, and whether a model fits the GPUs of one replica.

Pure. Used by the inventory (``kvfleet validate`` refuses an endpoint whose model's weights do not fit the GPU
memory one replica gets) and by the plan (the KV room left after the weights, per endpoint).

The sources' own arithmetic (seed, "L0 – Cache GPU"): on one 48 GB GPU a 7B model in bf16 takes about 14 GB for its
weights and leaves more than 30 GB for KV blocks, while a 32B model takes about 64 GB and "does not even fit" one
48 GB GPU. kvfleet computes the same thing from each model's parameter count and dtype:

    weights = parameters × bytes per parameter of the dtype
    KV room = GPU memory of one replica − weights

and refuses a model whose weights exceed what vLLM will use of that memory (``gpu_memory_utilization``, 0.9 by
default: vLLM ``vllm/config/cache.py`` ``CacheConfig.gpu_memory_utilization: float = 0.9``, "The fraction of GPU
memory to be used for the model executor"; the engine fails to start when nothing of that fraction is left for KV
blocks). The KV room is shown both ways: after the weights, and within vLLM's default fraction.

Each catalogue row names where its figures come from: the model's Hugging Face card (parameter count as the card's
safetensors metadata gives it) and its ``config.json`` (``num_hidden_layers``, ``num_key_value_heads``,
``hidden_size`` / ``num_attention_heads`` = head dim, ``torch_dtype``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvfleet.fleet.hardware import GpuShape

GIB: Final = 1024**3
# Bytes per parameter of the dtypes an endpoint may declare.
DTYPE_BYTES: Final[dict[str, float]] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
DTYPES: Final = tuple(DTYPE_BYTES)
# vLLM's default gpu_memory_utilization (vllm-project/vllm vllm/config/cache.py, CacheConfig).
VLLM_GPU_MEMORY_UTILIZATION: Final = 0.9


@dataclass(frozen=True)
class ModelSpec:
    key: str  # the catalogue's name, as an endpoint's `model` may write it
    hf_id: str  # the Hugging Face repository
    params_b: float  # parameters, in billions
    dtype: str  # the checkpoint's dtype (config.json torch_dtype)
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    source: str
    aliases: tuple[str, ...] = ()

    def kv_bytes_per_token(self, dtype: str | None = None) -> int | None:
        """K and V of every layer for one token, in the KV cache's dtype (the model's by default)."""
        if self.layers is None or self.kv_heads is None or self.head_dim is None:
            return None
        return int(2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype or self.dtype])


CATALOGUE: Final[tuple[ModelSpec, ...]] = (
    # The model of the sources' benchmarks (seed: "Qwen2-7B-Instruct (fp16, paralelismo tensorial 1)").
    ModelSpec("qwen2-7b-instruct", "Qwen/Qwen2-7B-Instruct", 7.62, "bf16", 28, 4, 128,
              "https://huggingface.co/Qwen/Qwen2-7B-Instruct (7.62B params; config.json: 28 layers, "
              "num_key_value_heads 4, hidden_size 3584 / 28 heads = head dim 128, torch_dtype bfloat16)",
              aliases=("qwen2-7b", "qwen/qwen2-7b-instruct", "qwen/qwen2-7b")),
    # Named by the seed as fitting ml.g6e.4xlarge with high hit rates.
    ModelSpec("llama-3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct", 8.03, "bf16", 32, 8, 128,
              "https://huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct (8.03B params; config.json: 32 layers, "
              "num_key_value_heads 8, hidden_size 4096 / 32 heads = head dim 128, torch_dtype bfloat16)",
              aliases=("llama-3-8b", "llama3-8b", "llama3-8b-instruct", "meta-llama/meta-llama-3-8b-instruct",
                       "meta-llama/meta-llama-3-8b")),
    # The sources' 32B example ("um modelo de 32B usa cerca de 64 GB de pesos e nem cabe em uma GPU de 48 GB").
    ModelSpec("qwen2.5-32b-instruct", "Qwen/Qwen2.5-32B-Instruct", 32.76, "bf16", 64, 8, 128,
              "https://huggingface.co/Qwen/Qwen2.5-32B-Instruct (32.8B params in the safetensors metadata, the card "
              "says 32.5B; 64 layers, GQA 40 Q / 8 KV heads, hidden_size 5120 / 40 = head dim 128, bfloat16)",
              aliases=("qwen2-5-32b-instruct", "qwen25-32b-instruct", "qwen2.5-32b", "qwen2-5-32b",
                       "qwen/qwen2.5-32b-instruct")),
)

_BY_NAME: Final[dict[str, ModelSpec]] = {
    name: spec for spec in CATALOGUE for name in (spec.key, spec.hf_id.lower(), *spec.aliases)
}


def lookup(name: str | None) -> ModelSpec | None:
    """The catalogue row of a model name (an endpoint's `model`, or a Hugging Face id), case-insensitive."""
    return _BY_NAME.get(name.strip().lower()) if name else None


def known_names() -> list[str]:
    return [spec.key for spec in CATALOGUE]


def weights_gib(params_b: float, dtype: str) -> float:
    return params_b * 1e9 * DTYPE_BYTES[dtype] / GIB


@dataclass(frozen=True)
class Fit:
    """A model against the GPU memory of one replica."""

    weights_gib: float
    gpu_memory_gib: float  # all the GPUs of one replica
    gpus: int
    shape: GpuShape

    @property
    def usable_gib(self) -> float:
        return self.gpu_memory_gib * VLLM_GPU_MEMORY_UTILIZATION

    @property
    def kv_room_gib(self) -> float:
        """What is left after the weights (the sources' figure: 48 GB − 14 GB on a 7B model)."""
        return self.gpu_memory_gib - self.weights_gib

    @property
    def kv_room_usable_gib(self) -> float:
        """What is left for KV blocks within vLLM's default gpu_memory_utilization."""
        return self.usable_gib - self.weights_gib

    @property
    def fits(self) -> bool:
        return self.kv_room_usable_gib > 0

    def describe(self) -> str:
        return (f"{self.gpus} × {self.shape.gpu} {self.shape.gpu_memory_gib} GiB = {self.gpu_memory_gib:g} GiB "
                f"per replica")


def fit(params_b: float, dtype: str, shape: GpuShape, gpus: int = 1) -> Fit:
    return Fit(weights_gib(params_b, dtype), float(shape.gpu_memory_gib * gpus), gpus, shape)
