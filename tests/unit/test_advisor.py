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
    assert big.working_set_bytes is not None
    need = math.ceil(big.working_set_bytes / (0.8 * 100 * E.GIB))
    assert adv.add_workers == need - 2
    assert E.advise_cluster("c", [], capacity_bytes=cap, workers=2).recommendation == "over_provisioned"
    with pytest.raises(ValueError):
        E.advise_cluster("c", [], capacity_bytes=cap, workers=2, threshold=1.5)


def test_value_is_priced_only_when_a_price_is_given() -> None:
    assert E.advise_endpoint(traffic([(2500, 30)])).value_usd_per_hour is None
    priced = E.advise_endpoint(traffic([(2500, 36)], hourly_price_usd=3.6, reuse_ratio=1.0))
    assert priced.saved_s_per_hour is not None
    assert priced.value_usd_per_hour == pytest.approx(priced.saved_s_per_hour / 3600 * 3.6, abs=1e-4)


def test_every_sweep_length_is_long_enough_to_verify() -> None:
    from kvfleet.stages import verify

    for n in verify.SWEEP_LENGTHS:
        verify.check_prompt_length(n, 256)  # raises for a length that cannot write L2


# --- the advisor's acceptance points, one test each ---------------------------------------------------------

def test_no_sweep_uses_the_published_curve_and_agrees_with_it_within_the_ttft_tolerance() -> None:
    """At each published length the saved share is 1 - 1/speedup of the blog's curve (0.99x at 500, 1.7x at 1,000,
    2.7x at 2,500: 774 ms cold -> 287 ms), within the verification's speedup tolerance."""
    from kvfleet.fleet.verdict import SPEEDUP_TOLERANCE

    for tokens, speedup in ((1000, 1.7), (2500, 2.7), (3000, 2.7)):
        adv = E.advise_endpoint(traffic([(tokens, 50)], reuse_ratio=1.0))
        assert adv.curve == "published curve for ml.g5.4xlarge"
        implied = 1 / (1 - adv.saved_fraction)  # the speedup the advisor integrated
        assert abs(implied - speedup) <= speedup * SPEEDUP_TOLERANCE and implied == pytest.approx(speedup, rel=0.01)
    at_2500 = E.advise_endpoint(traffic([(2500, 50)], reuse_ratio=1.0))
    assert 774 - at_2500.saved_ms_per_request == pytest.approx(287, abs=1.0)  # the published warm TTFT
    below = E.advise_endpoint(traffic([(500, 50)], reuse_ratio=1.0))
    assert below.saved_ms_per_request < 0 and below.verdict == "does_not_pay_off"  # 0.99x: L2 costs a little


def test_a_single_length_on_a_known_type_is_judged_without_assumed_curves() -> None:
    adv = E.advise_endpoint(traffic([(2500, 20)], reuse_ratio=1.0))
    assert adv.verdict == "pays_off" and adv.mean_prompt_tokens == 2500 and adv.share_below_payoff == 0.0
    assert not any("curve is used" in a for a in adv.assumptions)


def test_the_arithmetic_reproduces_the_verdict_numbers() -> None:
    adv = E.advise_endpoint(traffic([(2500, 60), (400, 40)], reuse_ratio=0.8))
    text = " | ".join(adv.arithmetic)
    assert f"{adv.saved_ms_per_request:.1f} ms" in text and "40% below the 1000-token payoff threshold" in text
    assert f"verdict {adv.verdict}" in text


def test_bytes_per_token_measured_then_model_config_then_default() -> None:
    bpt, src = E.bytes_per_token_for([(0.1028, 1925)], "Qwen/Qwen2-7B-Instruct")
    assert bpt == pytest.approx(57_344, rel=0.001) and src.startswith("measured")
    # fewer stored tokens than one chunk say too little: the model's config answers
    bpt, src = E.bytes_per_token_for([(0.001, 10)], "meta-llama/Meta-Llama-3-8B-Instruct")
    assert bpt == E.kv_bytes_per_token(32, 8, 128) == 131_072 and src.startswith("model config")
    bpt, src = E.bytes_per_token_for([], "acme/unknown-model")
    assert bpt == E.DEFAULT_BYTES_PER_TOKEN and "no Stored line" in src
    adv = E.advise_endpoint(traffic([(2000, 100)], reuse_ratio=0.0, bytes_per_token=131_072.0,
                                    bytes_per_token_source="model config"), retention_h=1)
    assert adv.working_set_bytes == pytest.approx(100 * 2000 * 131_072) and adv.bytes_per_token_source == "model config"


def test_workers_needed_is_the_scale_out_target() -> None:
    w = 100 * E.GIB
    assert E.workers_needed(0, w) == 0
    assert E.workers_needed(80 * E.GIB, w, 0.8) == 1  # exactly at the threshold: one worker holds it
    assert E.workers_needed(80 * E.GIB + 1, w, 0.8) == 2
    assert E.workers_needed(250 * E.GIB, w, 0.5) == 5
    for bad in ((1.0, 0.0, 0.8), (1.0, w, 0.0), (1.0, w, 1.2), (1.0, math.inf, 0.8)):
        with pytest.raises(ValueError):
            E.workers_needed(*bad)


def test_the_capacity_threshold_is_a_setting() -> None:
    """The same working set (170 GiB on 2 x 100 GiB workers, 85 %) adds workers at the default 80 % but not at 90 %."""
    ep = E.advise_endpoint(traffic([(2000, 100)], reuse_ratio=0.0, bytes_per_token=1.0), retention_h=1)
    ep = E.EndpointAdvice(**{**ep.as_dict(), "working_set_bytes": 170 * E.GIB})  # type: ignore[arg-type]
    default = E.advise_cluster("c", [ep], capacity_bytes=200 * E.GIB, workers=2)
    assert default.threshold == 0.8 and default.recommendation == "add_workers" and default.add_workers == 1
    assert default.workers_needed == 3
    loose = E.advise_cluster("c", [ep], capacity_bytes=200 * E.GIB, workers=2, threshold=0.9)
    assert loose.recommendation == "fine" and loose.add_workers == 0 and loose.workers_needed == 2


def test_the_cost_side_needs_prices_and_names_what_is_unpriced() -> None:
    priced = E.advise_endpoint(traffic([(2500, 100)], reuse_ratio=1.0, hourly_price_usd=4.0, replicas=2))
    assert priced.gpu_cost_usd_per_hour == 8.0 and priced.value_usd_per_hour is not None
    unknown = E.advise_endpoint(traffic([(2500, 100)], instance_type="ml.x9.huge", reuse_ratio=1.0, replicas=2))
    assert unknown.gpu_cost_usd_per_hour is None and any("no price for ml.x9.huge" in a for a in unknown.assumptions)
    big = E.EndpointAdvice(**{**priced.as_dict(), "working_set_bytes": 500 * E.GIB})  # type: ignore[arg-type]
    cl = E.advise_cluster("c", [big, unknown], capacity_bytes=200 * E.GIB, workers=2, node_price_usd=4.0)
    assert cl.cost is not None and cl.cost["gpu_usd_per_hour"] == 8.0
    assert cl.cost["add_workers_usd_per_hour"] == cl.add_workers * 4.0
    assert cl.cost["unpriced_instance_types"] == ["ml.x9.huge"]
    assert any(line.startswith("cost:") for line in cl.arithmetic)
    # nothing priced: no cost side at all (prices are inputs, never fetched)
    assert E.advise_cluster("c", [unknown], capacity_bytes=200 * E.GIB, workers=2).cost is None


def test_advice_json_keys_are_stable() -> None:
    """docs/advise.md documents these keys: the UI panel and scripts read them."""
    adv = E.advise_endpoint(traffic([(2500, 30)], reuse_ratio=1.0))
    assert set(adv.as_dict()) == {
        "endpoint", "verdict", "requests", "requests_per_hour", "mean_prompt_tokens", "share_below_payoff",
        "saved_ms_per_request", "saved_s_per_hour", "saved_fraction", "working_set_bytes", "curve", "arithmetic",
        "assumptions", "prefer_prefix_routing", "value_usd_per_hour", "instance_type", "replicas", "bytes_per_token",
        "bytes_per_token_source", "hourly_price_usd", "gpu_cost_usd_per_hour", "lengths", "rate_source",
        "observation"}
    assert adv.lengths == [{"tokens": 2500.0, "requests": 30.0}]
    cl = E.advise_cluster("c", [adv], capacity_bytes=100 * E.GIB, workers=1)
    assert set(cl.as_dict()) == {"cluster", "recommendation", "add_workers", "working_set_bytes", "capacity_bytes",
                                 "workers", "usage", "arithmetic", "threshold", "workers_needed", "cost"}


def test_the_scale_out_decision_takes_the_advisor_s_worker_count() -> None:
    quiet = {"due": False, "reasons": [], "target": 2}
    w = 100 * E.GIB
    # 250 GiB at 80 %: ceil(250 / 80) = 4 workers; 6 eligible nodes hold them
    out = E.scale_decision_with_working_set(quiet, replicas=2, eligible=6, working_set_bytes=250 * E.GIB,
                                            worker_bytes=w)
    assert out["due"] and out["target"] == 4 and out["advised_workers"] == 4
    assert any(r.startswith("advisor: working set 250.0 GiB needs 4 worker(s)") for r in out["reasons"])
    # only 3 eligible nodes: one worker per node, and the reason says how many GPU nodes are missing
    capped = E.scale_decision_with_working_set(quiet, replicas=2, eligible=3, working_set_bytes=250 * E.GIB,
                                               worker_bytes=w)
    assert capped["target"] == 3 and "add 1 GPU node(s)" in capped["reasons"][-1]
    # enough workers: the detection's own decision stands, never lowered
    own = {"due": True, "reasons": ["2 GPU node(s) without a Curvine worker: a, b"], "target": 5}
    kept = E.scale_decision_with_working_set(own, replicas=3, eligible=5, working_set_bytes=10 * E.GIB,
                                             worker_bytes=w)
    assert kept["target"] == 5 and kept["due"] and kept["reasons"] == own["reasons"] and kept["advised_workers"] == 1
    # the threshold is the setting the scale-out DAG passes: 250 GiB at 50 % needs 5
    assert E.scale_decision_with_working_set(quiet, replicas=2, eligible=8, working_set_bytes=250 * E.GIB,
                                             worker_bytes=w, threshold=0.5)["target"] == 5


# --- the request rate: counters' increase between observations (Prometheus rate()), never count / a floored age ---

def test_rate_is_the_counter_increase_between_two_observations() -> None:
    # two pods, 600 s apart: +300 and +150 requests -> 450 / 600 s = 2,700/h, whatever the pods' age
    r = E.request_rate([E.PodCount("a", 1300.0, 86_400.0), E.PodCount("b", 650.0, None)],
                       {"a": 1000.0, "b": 500.0}, 600.0)
    assert r.source == "delta" and r.per_hour == pytest.approx(2700.0)
    assert "600 s between observations" in r.arithmetic


def test_a_counter_reset_counts_the_new_value_inside_the_interval() -> None:
    # pod a restarted (18086 -> 40): its 40 requests were made since the reset, within the 3,600 s interval;
    # pod b started 120 s ago, after the previous observation: its whole counter over its age
    r = E.request_rate([E.PodCount("a", 40.0, 7200.0), E.PodCount("b", 12.0, 120.0)], {"a": 18086.0}, 3600.0)
    assert r.source == "delta" and "1 counter reset" in r.arithmetic
    assert r.per_hour == pytest.approx(40.0 + 12.0 / 120.0 * 3600)


def test_without_a_previous_observation_the_pod_age_counts_only_when_old_enough() -> None:
    old = E.request_rate([E.PodCount("a", 600.0, 1800.0)])
    assert old.source == "pod_age" and old.per_hour == pytest.approx(1200.0)
    # the twin's bug: a start time ahead of the reader's clock (age None) or seconds ago -> unknown, not /1 s
    for age in (None, 1.0, 299.0):
        r = E.request_rate([E.PodCount("a", 18086.0, age)])
        assert r.per_hour is None and r.source == "unknown", age
        assert r.arithmetic.startswith("rate unknown until the next observation")
    assert E.request_rate([]).source == "unknown"
    # a previous observation that is not usable (no elapsed time) is as none
    assert E.request_rate([E.PodCount("a", 5.0, None)], {"a": 1.0}, 0.0).source == "unknown"


def test_an_unknown_rate_keeps_the_verdict_but_derives_nothing_per_hour() -> None:
    unknown = E.RateEstimate(None, "unknown", "rate unknown until the next observation: 2 of 2 pod(s) with ...")
    adv = E.advise_endpoint(traffic([(2500, 18086)], reuse_ratio=0.9, rate=unknown, hourly_price_usd=2.0))
    assert adv.verdict == "pays_off" and adv.rate_source == "unknown"  # lengths and the curve only
    assert adv.requests_per_hour is None and adv.saved_s_per_hour is None and adv.working_set_bytes is None
    assert adv.value_usd_per_hour is None
    assert "rate unknown until the next observation" in adv.arithmetic[0]
    assert any(line.startswith("working set unknown") for line in adv.arithmetic)
    # the cluster: no worker recommendation from it, and the arithmetic says why
    cl = E.advise_cluster("c", [adv], capacity_bytes=100 * E.GIB, workers=1)
    assert cl.recommendation == "unknown" and cl.add_workers == 0
    assert any("request rate unknown" in line for line in cl.arithmetic)
    # a known endpoint already over the threshold still asks for workers: a lower bound, said so
    known = E.advise_endpoint(traffic([(2500, 100)], reuse_ratio=0.0, window_s=3600), retention_h=720)
    both = E.advise_cluster("c", [adv, known], capacity_bytes=100 * E.GIB, workers=1)
    assert both.recommendation == "add_workers" and any(a.endswith("at least") for a in both.arithmetic)


def test_a_known_rate_drives_the_per_hour_figures() -> None:
    rate = E.RateEstimate(3600.0, "delta", "rate 3600.0/h: 1 pod(s) by counter increase over 60 s")
    adv = E.advise_endpoint(traffic([(2500, 18086)], reuse_ratio=0.5, rate=rate), retention_h=1)
    assert adv.rate_source == "delta" and adv.requests_per_hour == 3600.0
    assert adv.working_set_bytes == pytest.approx(3600 * 2500 * 0.5 * 1 * E.DEFAULT_BYTES_PER_TOKEN, rel=1e-6)
    # the pure model given a window reads it as counts over their window (pod_age)
    assert E.advise_endpoint(traffic([(2500, 30)])).rate_source == "pod_age"
