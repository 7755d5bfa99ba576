from __future__ import annotations

import math

from kvfleet.fleet import prom

TEXT = """# HELP vllm:request_prompt_tokens Number of prefill tokens processed.
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{engine="0",le="500.0",model_name="m"} 3.0
vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="m"} 5.0
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="m"} 9.0
vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 12000.0
vllm:request_prompt_tokens_count{engine="0",model_name="m"} 9.0
lmcache:num_hit_tokens_total{model_name="m",worker_id="0"} 40.0
lmcache:num_hit_tokens_total{model_name="m",worker_id="1"} 2.0
garbage line {{{
vllm:weird{a="b"} notanumber
"""


def test_parse_histogram_and_counters() -> None:
    samples = prom.parse(TEXT)
    buckets, s, c = prom.histogram(samples, "vllm:request_prompt_tokens")
    assert buckets == [(500.0, 3.0), (1000.0, 5.0), (math.inf, 9.0)]
    assert (s, c) == (12000.0, 9.0)
    assert prom.total(samples, "lmcache:num_hit_tokens") == 42.0
    assert prom.total(samples, "vllm:absent") is None


def test_parse_is_bounded() -> None:
    text = "\n".join(f"x{{i=\"{i}\"}} 1" for i in range(prom.MAX_SAMPLES + 10))
    assert len(prom.parse(text)) == prom.MAX_SAMPLES
