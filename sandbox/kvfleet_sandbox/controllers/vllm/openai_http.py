"""The OpenAI-compatible server of the simulated vLLM pods: the HTTP side of ``engine`` (routes, request
validation, the OpenAI response and SSE shapes, ``/metrics`` in Prometheus text), reached only through the
Kubernetes API emulator's pod proxy on port 8000. No cache or timing logic lives here: it asks the engine to admit
a request, waits for its first token, then paces the decode.

Attached with the engine by ``kvfleet_sandbox.controllers.vllm.attach``. Shapes follow vLLM 0.11's
``vllm/entrypoints/openai`` (docs/reference/vllm.md#ttft-from-the-openai-api): streaming chunks carry ``choices``, the
usage-only chunk comes last with ``stream_options.include_usage``, a chat stream's first chunk carries the role.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kvfleet_sandbox.controllers import _lmcache as lm
from kvfleet_sandbox.controllers.vllm.engine import (
    CONTEXT_TOKENS,
    DEFAULT_MAX_TOKENS,
    MAX_OUTPUT_TOKENS,
    PROMPT_BUCKETS,
    TTFT_BUCKETS,
    VLLM_PORT,
    PodEngine,
    RequestPlan,
    VllmSimulation,
    count_tokens,
    pod_ready,
    render_chat,
    sleep_until,
    vllm_container,
)
from kvfleet_sandbox.kube.store import ProxyResponse

_OUTPUT_WORDS = ("The", "cache", "hit", "saves", "prefill", "time", "on", "every", "replica", "of", "the",
                 "endpoint", "when", "prompts", "share", "prefixes.")


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class OpenAiServer:
    """The pod-proxy handler of every simulated vLLM pod of one cluster twin."""

    def __init__(self, sim: VllmSimulation) -> None:
        self.sim = sim
        sim.twin.store.register_pod_proxy(self._proxy)

    def _proxy(self, namespace: str, pod: str, port: int, method: str, path: str, query: str,
               headers: dict[str, str], body: Any, *, received: float | None = None) -> ProxyResponse | None:
        """``received``: when the API server read the request off its socket (``time.monotonic()``, from the pod
        proxy); the model's phases count from it (``VllmSimulation.until_first_token``), so whatever the twin spent
        between that moment and here (a busy thread, auth, routing, the pod lookup) is inside the modelled TTFT,
        not added to it. A modelling choice, not vLLM's behaviour (tests/conformance/facts/vllm_ttft_model.yaml).
        No request header is read for it. Called without (a direct ``store.pod_proxy``): the clock starts here."""
        arrived = time.monotonic() if received is None else received
        sim = self.sim
        if sim.stopped or port != VLLM_PORT:
            return None
        obj = sim.twin.store.get("", "pods", pod, namespace)
        if obj is None or vllm_container(obj) is None:
            return None
        if not pod_ready(obj):
            return _json(503, _error("the vLLM server is not ready", "ServiceUnavailable", 503))
        engine = sim.engine_of(obj)
        if engine is None:
            return _json(503, _error("the vLLM server is not ready", "ServiceUnavailable", 503))
        route = path.split("?", 1)[0].rstrip("/") or "/"
        if method == "GET" and route in ("/health", "/ping"):
            return ProxyResponse(200, {"Content-Type": "application/json"}, b"")
        if method == "GET" and route == "/metrics":
            return ProxyResponse(200, {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
                                 self._metrics(engine).encode())
        if method == "GET" and route == "/v1/models":
            return _json(200, {"object": "list", "data": [{
                "id": engine.served_name, "object": "model", "created": int(engine.started), "owned_by": "vllm",
                "root": engine.model_path, "parent": None, "max_model_len": CONTEXT_TOKENS}]})
        if method == "POST" and route in ("/v1/completions", "/v1/chat/completions"):
            try:
                return self._generate(engine, route.endswith("chat/completions"), _body_json(body), arrived)
            except BadRequest as exc:
                return _json(exc.status, _error(str(exc), "BadRequestError", exc.status))
        return _json(404, {"detail": "Not Found"})

    def _generate(self, engine: PodEngine, chat: bool, request: dict[str, Any], arrived: float) -> ProxyResponse:
        tokens = _prompt_tokens(request, chat)
        max_tokens = request.get("max_completion_tokens") or request.get("max_tokens") or DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("max_tokens must be a positive integer")
        if len(tokens) + max_tokens > CONTEXT_TOKENS:
            raise BadRequest(
                f"This model's maximum context length is {CONTEXT_TOKENS} tokens. However, you requested "
                f"{len(tokens) + max_tokens} tokens ({len(tokens)} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion.")
        output = min(max_tokens, MAX_OUTPUT_TOKENS)
        req_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        # What the engine (and so LMCache) sees: prompt 0 of a completion, then assign_request_id's suffix.
        engine_id = lm.engine_request_id(req_id, uuid.uuid4().hex, None if chat else 0)
        plan = self.sim.admit(engine, engine_id, tokens, output, arrived)
        stream = bool(request.get("stream"))
        usage_wanted = bool((request.get("stream_options") or {}).get("include_usage"))
        response = _Response(engine, req_id, chat, len(tokens), output, plan.computed)
        if stream:
            return ProxyResponse(200, {"Content-Type": "text/event-stream; charset=utf-8"},
                                 self._sse(engine, plan, response, usage_wanted))
        self.sim.until_first_token(engine, plan)
        factor = plan.cost.noise_factor if plan.cost else 1.0
        time.sleep(max(0, output - 1) * engine.profile.inter_token_ms * factor / 1000)
        self.sim.decoded(engine, output)
        return _json(200, response.whole())

    def _sse(self, engine: PodEngine, plan: RequestPlan, response: _Response, usage_wanted: bool) -> Iterator[bytes]:
        self.sim.until_first_token(engine, plan)
        itl = engine.profile.inter_token_ms * (plan.cost.noise_factor if plan.cost else 1.0) / 1000
        first = time.monotonic()
        for i, chunk in enumerate(response.stream_chunks()):
            token = i if response.chat else i + 1  # a chat stream's first chunk is the role, sent with token 1
            if token > 1:
                sleep_until(first + (token - 1) * itl)
            yield _sse(chunk)
        self.sim.decoded(engine, response.output)
        if usage_wanted:
            yield _sse(response.usage_chunk())
        yield b"data: [DONE]\n\n"

    def _metrics(self, engine: PodEngine) -> str:
        """vLLM's and LMCache's counters of one pod, in Prometheus text (docs/reference/vllm.md#metrics)."""
        m, l1_used = self.sim.scrape(engine)
        v = {"model_name": engine.served_name, "engine": "0"}
        lmv = {"model_name": engine.served_name, "worker_id": "0"}
        out: list[str] = []
        _counter(out, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                 v, m.prefix_queries)
        _counter(out, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                 v, m.prefix_hits)
        _counter(out, "vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector "
                 "cross-instance cache sharing, in terms of number of queried tokens.", v, m.external_queries)
        _counter(out, "vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector "
                 "cross-instance cache sharing, in terms of number of cached tokens.", v, m.external_hits)
        _counter(out, "vllm:prompt_tokens", "Number of prefill tokens processed.", v, m.prompt_tokens)
        _counter(out, "vllm:generation_tokens", "Number of generation tokens processed.", v,
                 m.generation_tokens)
        _counter(out, "vllm:request_success", "Count of successfully processed requests.", v, m.requests)
        _histogram(out, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", v,
                   m.ttft_buckets, m.ttft_sum, m.ttft_count)
        _histogram(out, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", v,
                   m.prompt_buckets, m.prompt_sum, m.prompt_count, PROMPT_BUCKETS)
        _counter(out, "lmcache:num_requested_tokens", "Total number of tokens requested from lmcache", lmv,
                 m.lm_requested)
        _counter(out, "lmcache:num_hit_tokens", "Total number of tokens hit in lmcache", lmv, m.lm_hit)
        _counter(out, "lmcache:num_stored_tokens", "Total number of tokens stored in lmcache", lmv,
                 m.lm_stored)
        rate = m.lm_hit / m.lm_requested if m.lm_requested else 0.0
        _gauge(out, "lmcache:retrieve_hit_rate", "The hit rate for retrieve requests", lmv, rate)
        _gauge(out, "lmcache:local_cache_usage", "Local cache usage (bytes) of lmcache", lmv, l1_used)
        return "\n".join(out) + "\n"


@dataclass
class _Response:
    engine: PodEngine
    req_id: str
    chat: bool
    prompt_tokens: int
    output: int
    cached: int
    created: int = field(default_factory=lambda: int(time.time()))

    def _words(self) -> list[str]:
        return [(" " if i else "") + _OUTPUT_WORDS[i % len(_OUTPUT_WORDS)] for i in range(self.output)]

    def _usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.output,
                "total_tokens": self.prompt_tokens + self.output, "prompt_tokens_details": None}

    def _base(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.req_id, "object": kind, "created": self.created, "model": self.engine.served_name}

    def whole(self) -> dict[str, Any]:
        text = "".join(self._words())
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": "length", "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        return {**self._base(False), "choices": [choice], "usage": self._usage()}

    def stream_chunks(self) -> Iterator[dict[str, Any]]:
        words = self._words()
        if self.chat:  # vLLM's first chat chunk carries the role, sent when the first token is ready
            yield {**self._base(True), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}]}
        for i, word in enumerate(words):
            finish = "length" if i == len(words) - 1 else None
            if self.chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": word}, "logprobs": None,
                                          "finish_reason": finish}
            else:
                choice = {"index": 0, "text": word, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            yield {**self._base(True), "choices": [choice]}

    def usage_chunk(self) -> dict[str, Any]:
        return {**self._base(True), "choices": [], "usage": self._usage()}


def _prompt_tokens(request: dict[str, Any], chat: bool) -> list[str]:
    if chat:
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: a non-empty list is required")
        return count_tokens(render_chat(messages))
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt.strip():
        return count_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [str(t) for t in prompt]
    raise BadRequest("prompt: one non-empty string or token-id list is required (the sandbox serves one prompt "
                     "per request)")


def _body_json(body: Any) -> dict[str, Any]:
    if not isinstance(body, bytes | bytearray | str):
        body = b"".join(body) if body is not None else b""
    try:
        data = json.loads(body or b"{}")
    except ValueError as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _json(status: int, payload: Any) -> ProxyResponse:
    return ProxyResponse(status, {"Content-Type": "application/json"}, json.dumps(payload).encode())


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _counter(out: list[str], name: str, help_text: str, labels: dict[str, str], value: float) -> None:
    out += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter",
            f"{name}_total{_labels(labels)} {float(value)}"]


def _gauge(out: list[str], name: str, help_text: str, labels: dict[str, str], value: float) -> None:
    out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{_labels(labels)} {float(value)}"]


def _histogram(out: list[str], name: str, help_text: str, labels: dict[str, str], buckets: list[int] | list[float],
               total: float, count: float, bounds: tuple[float, ...] = TTFT_BUCKETS) -> None:
    out += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for bound, n in zip(bounds, buckets, strict=True):
        out.append(f"{name}_bucket{_labels({**labels, 'le': str(bound)})} {float(n)}")
    out.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {float(count)}")
    out += [f"{name}_count{_labels(labels)} {float(count)}", f"{name}_sum{_labels(labels)} {total}"]
