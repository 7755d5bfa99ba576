"""The vLLM OpenAI-compatible API of one pod, through the API-server pod proxy, measured like vLLM's own
benchmark (docs/reference/vllm.md#ttft-from-the-openai-api): streaming with ``include_usage``, TTFT = time from before
the POST to the first SSE message carrying ``choices``. Also reads the pod's container log since a given time
(``sinceTime``).

Called by stage 5 (cross-pod hit verification) and the benchmarks. Going through the pod proxy (not the
endpoint's load balancer) is what lets kvfleet choose pod A and pod B on two different nodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvfleet.clients.kube import api_error
from kvfleet.errors import PermanentError

VLLM_PORT = 8000


@dataclass(frozen=True)
class Completion:
    request_id: str
    ttft_s: float
    total_s: float
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    text: str


def stream_completion(kube: Any, namespace: str, pod: str, *, model: str, prompt: str, max_tokens: int = 16,
                      port: int = VLLM_PORT, timeout: float = 120,
                      clock: Callable[[], float] = time.perf_counter) -> Completion:
    """One streamed completion on ``pod``; ``clock`` (seconds) times it (``StageContext.probe_clock``)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    started = clock()
    ttft: float | None = None
    req_id = ""
    usage: dict[str, Any] = {}
    text: list[str] = []
    buffer = b""
    for chunk in kube.proxy_stream(namespace, pod, port, "v1/completions", body, timeout=timeout):
        buffer += chunk
        while b"\n" in buffer:
            raw, buffer = buffer.split(b"\n", 1)
            line = raw.decode("utf-8", "replace").strip()
            if not line or line.startswith(":") or not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            msg = json.loads(data)
            req_id = req_id or msg.get("id", "")
            if msg.get("choices"):
                if ttft is None:
                    ttft = clock() - started
                text.append(msg["choices"][0].get("text") or "")
            if msg.get("usage"):
                usage = msg["usage"]
    total = clock() - started
    if ttft is None:
        raise PermanentError(f"{namespace}/{pod}: the stream ended without any choices (no first token)")
    details = usage.get("prompt_tokens_details") or {}
    return Completion(req_id, ttft, total, usage.get("prompt_tokens"), usage.get("completion_tokens"),
                      details.get("cached_tokens"), "".join(text))


def pod_log_since(kube: Any, namespace: str, pod: str, container: str, since: datetime) -> str:
    """``GET pods/log?sinceTime=`` (the generated client of kubernetes 36 does not expose sinceTime)."""
    query = [("container", container), ("sinceTime", since.strftime("%Y-%m-%dT%H:%M:%SZ")), ("timestamps", "false")]
    try:
        resp = kube.api_client.call_api(
            f"/api/v1/namespaces/{namespace}/pods/{pod}/log", "GET", query_params=query,
            header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"], _preload_content=False,
            _return_http_data_only=True, _request_timeout=60)
    except ApiException as exc:
        raise api_error(exc, f"logs of {namespace}/{pod}/{container}") from exc
    try:
        return (resp.data or b"").decode("utf-8", "replace")
    finally:
        resp.release_conn()


def pod_metrics_text(kube: Any, namespace: str, pod: str, port: int = VLLM_PORT, max_bytes: int = 8 << 20) -> str:
    """``GET /metrics`` of a vLLM pod through the API-server pod proxy (Prometheus text format), bounded."""
    try:
        resp = kube.api_client.call_api(
            kube.proxy_path(namespace, pod, port, "metrics"), "GET", header_params={"Accept": "text/plain"},
            auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            _request_timeout=30)
    except ApiException as exc:
        raise api_error(exc, f"metrics of {namespace}/{pod}") from exc
    try:
        return (resp.read(max_bytes) or b"").decode("utf-8", "replace")
    finally:
        resp.release_conn()
