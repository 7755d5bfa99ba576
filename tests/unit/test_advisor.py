"""The L2 advisor's pure model (kvfleet.fleet.economics): verdicts, arithmetic and capacity recommendations."""

from __future__ import annotations

import math

import pytest

from kvfleet.fleet import economics as E


def traffic(lengths: list[tuple[float, float]], **kw) -> E.EndpointTraffic:  # type: ignore[no-untyped-def]
    kw.setdefault("instance_type", "ml.g5.4xlarge")
    kw.setdefault("window_s", 3600)
    return E.EndpointTraffic(endpoint="ns/ep", lengths=[E.LengthBucket(t, n) for t, n in lengths], **kw)


def test_long_prompts_pay_off_and_short_prompts_do_not() -> None:
    long = E.advise_endpoint(traffic([(2500, 100)], reuse_ratio=0.9))
    short = E.advise_endpoint(traffic([(400, 100)], reuse_ratio=0.9))
    assert long.verdict == "pays_off"
    assert short.verdict == "does_not_pay_off"
    assert short.prefer_prefix_routing and not long.prefer_prefix_routing
    assert short.share_below_payoff == 1.0


def test_saving_follows_the_published_curve() -> None:
    # at 2,500 tokens the curve gives 2.7x: 774 ms cold -> 287 ms warm, 487 ms saved with full reuse
    adv = E.advise_endpoint(traffic([(2500, 50)], reuse_ratio=1.0))
    assert adv.saved_ms_per_request == pytest.approx(774 * (1 - 1 / 2.7), abs=0.2)
    assert adv.saved_fraction == pytest.approx(1 - 1 / 2.7, abs=0.001)
    assert any("2.7" in a or "saved" in a for a in adv.arithmetic)


def test_marginal_band() -> None:
    # 1.2x in the middle of 500 (0.99x) .. 1,000 (1.7x): saves 1/6 of TTFT -> marginal
    tokens = 500 + (1.2 - 0.99) / (1.7 - 0.99) * 500
    assert E.advise_endpoint(traffic([(tokens, 40)], reuse_ratio=1.0)).verdict == "marginal"


def test_no_traffic_is_insufficient_data() -> None:
    adv = E.advise_endpoint(traffic([]))
    assert adv.verdict == "insufficient_data"
    assert adv.requests == 0 and "0 request" in adv.arithmetic[0]


def test_a_single_length_and_an_unknown_instance_type() -> None:
    adv = E.advise_endpoint(traffic([(3000, 30)], instance_type="ml.p5.48xlarge", reuse_ratio=0.5))
    assert adv.verdict == "pays_off"
    assert any("ml.g5.4xlarge curve is used" in a for a in adv.assumptions)


def test_measured_sweep_replaces_the_published_curve() -> None:
    flat = ((500, 1.0), (3000, 1.0))
    adv = E.advise_endpoint(traffic([(2500, 30)], reuse_ratio=1.0, sweep=flat))
    assert adv.curve == "measured sweep" and adv.verdict == "does_not_pay_off"


def test_unknown_reuse_is_an_upper_bound_and_says_so() -> None:
    adv = E.advise_endpoint(traffic([(2500, 30)]))
    assert any("upper bound" in a for a in adv.assumptions)


def test_working_set_uses_bytes_per_token_and_retention() -> None:
    bpt = E.bytes_per_token_from_stored(0.1028, 1925)
    assert bpt == pytest.approx(E.kv_bytes_per_token(28, 4, 128, 2), rel=0.001)  # 57,344 B: LMCache's "GB" is GiB
    adv = E.advise_endpoint(traffic([(2000, 100)], reuse_ratio=0.75, bytes_per_token=bpt), retention_h=10)
    assert adv.working_set_bytes == pytest.approx(100 * 2000 * 0.25 * 10 * bpt, rel=1e-6)


def test_histogram_buckets_from_prometheus() -> None:
    cum = [(500.0, 10.0), (1000.0, 10.0), (2000.0, 30.0), (math.inf, 40.0)]
    buckets = E.histogram_buckets(cum, total_sum=10 * 250 + 20 * 1500 + 10 * 4000)
    assert [(b.tokens, b.requests) for b in buckets] == [(250.0, 10.0), (1500.0, 20.0), (4000.0, 10.0)]


def test_coarse_buckets_are_scaled_to_the_observed_mean() -> None:
    # vLLM's 1-2-5 buckets put 2,400 and 3,000 tokens in one (2,000, 5,000] bucket; the sum gives the mean back
    buckets = E.histogram_buckets([(2000.0, 0.0), (5000.0, 300.0), (math.inf, 300.0)], total_sum=200 * 2400 + 100 * 3000)
    assert len(buckets) == 1 and buckets[0].tokens == 2600.0


def test_cluster_recommends_workers_above_the_threshold() -> None:
    big = E.advise_endpoint(traffic([(2500, 3600)], reuse_ratio=0.0), retention_h=24)
    cap = 2 * 100 * E.GIB
    adv = E.advise_cluster("c", [big], capacity_bytes=cap, workers=2, threshold=0.8)
    assert adv.recommendation == "add_workers"
    need = math.ceil(big.working_set_bytes / (0.8 * 100 * E.GIB))
    assert adv.add_workers == need - 2
    assert E.advise_cluster("c", [], capacity_bytes=cap, workers=2).recommendation == "over_provisioned"
    with pytest.raises(ValueError):
        E.advise_cluster("c", [], capacity_bytes=cap, workers=2, threshold=1.5)


def test_value_is_priced_only_when_a_price_is_given() -> None:
    assert E.advise_endpoint(traffic([(2500, 30)])).value_usd_per_hour is None
    priced = E.advise_endpoint(traffic([(2500, 36)], hourly_price_usd=3.6, reuse_ratio=1.0))
    assert priced.value_usd_per_hour == pytest.approx(priced.saved_s_per_hour / 3600 * 3.6, abs=1e-4)


def test_every_sweep_length_is_long_enough_to_verify() -> None:
    from kvfleet.stages import verify

    for n in verify.SWEEP_LENGTHS:
        verify.check_prompt_length(n, 256)  # raises for a length that cannot write L2
