"""The TTFT model holds every published point (docs/reference/vllm.md#published-figures) within ±10 % (model properties,
no timing)."""

from __future__ import annotations

import random

import pytest

from kvfleet_sandbox import ttft_model as tm

G5 = tm.PROFILES["ml.g5.4xlarge"]


def within(value: float, published: float, tol: float = 0.10) -> bool:
    return abs(value - published) <= tol * published


def test_cold_and_warm_at_2500_tokens():
    assert within(tm.cold_ttft_ms(G5, 2500), 774)
    assert within(tm.warm_l2_ttft_ms(G5, 2500), 287)
    assert within(tm.cold_ttft_ms(G5, 2500) / tm.warm_l2_ttft_ms(G5, 2500), 2.7)


@pytest.mark.parametrize(("tokens", "speedup"), [(500, 0.99), (1000, 1.7), (2500, 2.7)])
def test_speedup_curve(tokens, speedup):
    assert within(tm.cold_ttft_ms(G5, tokens) / tm.warm_l2_ttft_ms(G5, tokens), speedup)


def test_gains_slow_after_2500_and_l2_pays_off_above_1000():
    s = {n: tm.cold_ttft_ms(G5, n) / tm.warm_l2_ttft_ms(G5, n) for n in (500, 1000, 1500, 2000, 2500, 3000)}
    assert s[500] < 1.1 < s[1000] < s[1500] < s[2000] < s[2500] <= s[3000] < s[2500] * 1.1


def test_l2_read_and_write_of_1925_tokens():
    assert within(G5.kv_gb(1925), 0.1028, 0.001)
    assert within(G5.l2_read_ms(1925), 55.75)
    assert within(G5.kv_gb(1925) / (G5.l2_read_ms(1925) / 1000), 1.84)
    assert within(G5.store_ms(1925), 10.71)
    assert within(G5.kv_gb(1925) / (G5.store_ms(1925) / 1000), 9.60)


@pytest.mark.parametrize("instance_type", ["ml.g6e.4xlarge", "ml.g6.16xlarge"])
def test_four_turn_conversation(instance_type):
    conv = tm.conversation(tm.PROFILES[instance_type])
    assert conv.tokens[0] == 530 and conv.tokens[-1] == 2114
    assert within(conv.speedups[0], 1.22)
    assert within(conv.speedups[-1], 1.34)
    assert within(conv.total_speedup, 1.30)
    assert within(sum(conv.cold_ms), 4210) and within(sum(conv.warm_ms), 3250)


def test_a_partial_hit_pays_prefill_for_the_uncached_suffix_only():
    full = tm.request_cost(G5, 2000).ttft_ms
    half = tm.request_cost(G5, 2000, computed=1000).ttft_ms
    assert half == pytest.approx(full - G5.prefill_ms(1000))
    # An L1 hit (the pod's own CPU cache) is much cheaper than going to L2.
    assert tm.request_cost(G5, 2000, l1_tokens=2000).ttft_ms < tm.request_cost(G5, 2000, l2_tokens=2000).ttft_ms / 2


def test_prefill_is_monotone_up_to_the_context_length():
    for profile in tm.PROFILES.values():
        costs = [profile.prefill_ms(n) for n in range(0, profile.context_tokens + 1, 64)]
        assert costs == sorted(costs)


def test_noise_is_seeded_and_small():
    a = [tm.request_cost(G5, 1000, rng=random.Random(3), noise=0.02).ttft_ms for _ in range(3)]
    b = [tm.request_cost(G5, 1000, rng=random.Random(3), noise=0.02).ttft_ms for _ in range(3)]
    assert a == b
    rng = random.Random(1)
    draws = [tm.request_cost(G5, 1000, rng=rng, noise=0.02).ttft_ms for _ in range(200)]
    base = tm.request_cost(G5, 1000).ttft_ms
    assert all(abs(d / base - 1) <= 0.06 for d in draws) and len(set(draws)) > 100


def test_unknown_instance_types_fall_back_and_profiles_validate():
    assert tm.profile_for("ml.x.unknown").prefill_knots == G5.prefill_knots
    assert tm.profile_for("ml.g6e.4xlarge") is tm.PROFILES["ml.g6e.4xlarge"]
    with pytest.raises(ValueError, match="must start at"):
        tm.TtftProfile("t", "m", 1.0, ((10, 1.0),), 0.1, 1.0)
