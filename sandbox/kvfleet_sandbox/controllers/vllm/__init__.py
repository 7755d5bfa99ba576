"""Simulated vLLM pods with LMCache, in two parts: ``engine`` (the model: per-pod engines, the tiered KV cache,
TTFT on the model's schedule, LMCache's log lines; no socket code) and ``openai_http`` (the OpenAI-compatible
server in front of it, reached through the API-server pod proxy). See ``engine``'s docstring for what is
simulated and why.

Attached to every cluster twin by ``kvfleet_sandbox.runtime`` (``attach(twin)``); the probe hooks are
``twin.services["vllm"]``, the :class:`VllmSimulation`.
"""

from __future__ import annotations

from kvfleet_sandbox.controllers.vllm.engine import (
    VLLM_PORT,
    PodEngine,
    VllmSimulation,
    count_tokens,
    pod_ready,
    render_chat,
    vllm_container,
)
from kvfleet_sandbox.controllers.vllm.openai_http import OpenAiServer
from kvfleet_sandbox.twin import ClusterTwin


def attach(twin: ClusterTwin) -> VllmSimulation:
    sim = VllmSimulation(twin)
    OpenAiServer(sim)
    return sim


__all__ = ["VLLM_PORT", "OpenAiServer", "PodEngine", "VllmSimulation", "attach", "count_tokens", "pod_ready",
           "render_chat", "vllm_container"]
