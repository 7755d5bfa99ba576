"""The L2 advisor against the twin: the vLLM simulation serves ``vllm:request_prompt_tokens`` and LMCache's hit
counters for a traffic mix per endpoint; `kvfleet advise` reads them through the pod proxy and judges.

The same rolled-out cluster also carries the probe checks (they need the same rollout, which is the
slow part): the hourly DAG's bounded probe pool against the twin's Curvine files, and the endpoint's own baseline
read back from the history store."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from driftkit import ROOT, STAGE

from kvfleet.fleet.economics import MIN_REQUESTS
from kvfleet.stages import addons, advise, curvine, endpoints, tiered_storage

pytestmark = pytest.mark.integration

LONG = [(2400, 40_000, 0.9), (3000, 20_000, 0.9)]  # a busy RAG endpoint: long retrieved context, reused; per wall hour
# The twin's mixes are per wall-clock hour (facts/vllm_traffic_mix.yaml): the default RAG and chat mixes, twenty
# times busier, so the pods rolled out seconds ago have enough requests for a verdict (which depends on the lengths
# and the reuse only, not on the rate).
FAST = 20


def _wall_now() -> datetime:
    """kvfleet measures on the wall clock (the twin's pods carry model-time start stamps, ahead of it)."""
    return datetime.now(UTC)


# The tests' intervals between two observations are seconds, not the advisor's 5-minute minimum (MIN_INTERVAL_S):
# they pass a minimum below their interval explicitly.
SHORT = 0.25


def _observed_twice(ctx: Any, **kw: Any) -> tuple[Any, Any]:
    """Two advisor reports in a row, the second with the first's observations as its base (what the hourly task
    reads back from the history): its request rate is the counters' increase in between."""
    first = advise.advise_cluster(ctx, previous={}, **kw)
    previous = {a.endpoint: a.observation for a in first.endpoints if a.observation}
    time.sleep(0.5)  # an interval well above the scrapes' own spread
    return first, advise.advise_cluster(ctx, previous=previous, min_interval_s=SHORT, **kw)


@pytest.fixture(scope="module")
def rolled_out(drift_sandbox, drift_ctx):  # type: ignore[no-untyped-def]
    from kvfleet_sandbox.controllers.vllm.engine import DEFAULT_TRAFFIC

    ctx = drift_ctx(STAGE)
    inv = drift_sandbox.inventory
    for stage in (tiered_storage, addons, curvine):
        stage.reconcile(ctx)
    endpoints.reconcile_wave(ctx, list(inv.endpoints_of(STAGE)), holder="t/rollout")
    vllm = drift_sandbox.twin(STAGE).services["vllm"]
    vllm.set_traffic_mix("retail-assistant", LONG)
    for app, word in (("retail-search-rag", "rag"), ("support-chat", "chat")):
        vllm.set_traffic_mix(app, [(t, n * FAST, h) for t, n, h in DEFAULT_TRAFFIC[word]])
    # The counters grow with the pods' age in wall seconds (the module docstring): wait, without a timing
    # assumption, until each of the three has enough requests for a verdict; never is a failure.
    mixed = {"retail/retail-assistant", "retail/retail-search-rag", "support/support-chat"}
    deadline = time.monotonic() + 60
    while True:
        counts = {a.endpoint: a.requests for a in advise.advise_cluster(ctx, previous={}).endpoints}
        if all(counts.get(e, 0) >= MIN_REQUESTS for e in mixed):
            break
        assert time.monotonic() < deadline, f"the twin's counters did not reach {MIN_REQUESTS} requests: {counts}"
        time.sleep(0.25)
    return drift_sandbox


def test_long_prompts_pay_off_short_turns_do_not_and_the_arithmetic_is_shown(rolled_out, drift_ctx) -> None:  # type: ignore[no-untyped-def]
    report = advise.advise_cluster(drift_ctx(STAGE), previous={})
    by = {a.endpoint: a for a in report.endpoints}
    assert report.errors == []
    # the twin's default mixes on ml.g5.4xlarge (the blog's curve): a RAG endpoint with long retrieved context,
    # a chat endpoint with short turns; and a mix set per endpoint through the simulation. A first observation of
    # pods whose start stamps are ahead of the wall clock: the rate is unknown, the verdicts stand
    assert {a.rate_source for a in report.endpoints} == {"unknown"}
    assert all(a.requests_per_hour is None for a in report.endpoints)
    assert all(a.working_set_bytes is None for a in report.endpoints if a.verdict != "insufficient_data")
    assert any("rate unknown until the next observation" in line for line in by["retail/retail-search-rag"].arithmetic)
    assert report.capacity is not None and report.capacity.recommendation == "unknown"
    rag, chat, custom = by["retail/retail-search-rag"], by["support/support-chat"], by["retail/retail-assistant"]
    assert rag.verdict == "pays_off" and chat.verdict == "does_not_pay_off", (rag.arithmetic[1], chat.verdict)
    assert custom.verdict == "pays_off", custom.arithmetic
    assert chat.prefer_prefix_routing and chat.share_below_payoff > 0.9
    # the published curve: 2.7x at 2,500 tokens, flat after; reuse 0.9 as LMCache's counters report it
    assert custom.saved_fraction == pytest.approx(0.9 * (1 - 1 / 2.7), abs=0.03)
    assert any("cold(n) x (1 - 1/speedup(n))" in line for line in rag.arithmetic)
    assert "ml.g5.4xlarge" in rag.curve
    assert report.capacity.workers >= 1


def test_the_rate_is_the_counters_increase_over_wall_time_and_equals_the_mix(rolled_out, drift_ctx,  # type: ignore[no-untyped-def]
                                                                             drift_history) -> None:
    """The hourly advise step records each endpoint's observation; the next reads it back (named query
    advise_previous) and divides the counters' increase by the wall seconds in between: the twin's mix, per wall
    hour, comes back as the endpoint's requests per hour."""
    from kvfleet.history.keys import StepKey

    run = "t/advise-rate"
    drift_history.runs.start(run, dag_id="t", run_id=run, trigger="test", triggered_by=None, params={})
    ctx = drift_ctx(STAGE, history=drift_history, step_key=StepKey(run, "advise", 0))
    first = advise.advise_cluster(ctx)
    ctx.record(f"advise:{STAGE}", "advise", "reported", verdicts={e.endpoint: e.verdict for e in first.endpoints},
               endpoints=first.as_dict()["endpoints"], capacity=first.as_dict()["capacity"], errors=first.errors)
    assert set(advise.previous_observations(drift_history, STAGE)) == {e.endpoint for e in first.endpoints}
    time.sleep(3.0)  # wall seconds between the two observations (the rate's interval; nothing timed is asserted)
    second = advise.advise_cluster(drift_ctx(STAGE, history=drift_history), min_interval_s=1.0)
    custom = next(a for a in second.endpoints if a.endpoint == "retail/retail-assistant")
    assert custom.rate_source == "delta", custom.arithmetic
    configured = sum(n for _, n, _ in LONG)  # 60,000 requests per hour
    assert custom.requests_per_hour == pytest.approx(configured, rel=0.15), custom.arithmetic
    assert "between observations" in custom.arithmetic[0]
    assert custom.working_set_bytes is not None and custom.working_set_bytes > 0
    assert second.capacity is not None and second.capacity.recommendation != "unknown"


def test_a_previous_observation_under_the_minimum_interval_is_ignored_and_says_why(  # type: ignore[no-untyped-def]
        rolled_out, drift_ctx, drift_history) -> None:
    """An observation seconds old is no base for an hourly rate (a burst would be extrapolated): under the
    advisor's 5-minute minimum it is ignored, the rate falls back (here to unknown: the twin's pods carry start
    stamps ahead of the wall clock, so no pod age counts) and the arithmetic says why. From the history too: an
    hourly advise step recorded seconds before (say, just before the scale-out detection) is not the base."""
    from kvfleet.history.keys import StepKey

    ctx = drift_ctx(STAGE)
    first = advise.advise_cluster(ctx, previous={})
    previous = {a.endpoint: a.observation for a in first.endpoints if a.observation}
    assert previous
    close = advise.advise_cluster(ctx, previous=previous)
    judged = [a for a in close.endpoints if a.endpoint in previous]
    assert judged and all(a.rate_source == "unknown" and a.requests_per_hour is None for a in judged), judged
    for a in judged:
        assert a.working_set_bytes is None or a.verdict == "insufficient_data"
        assert any("under the 300 s minimum interval between observations and was not used" in line
                   for line in a.arithmetic), a.arithmetic
    # the same base with no minimum: the counters' increase over well under a second is taken as the rate
    assert {a.rate_source for a in advise.advise_cluster(ctx, previous=previous, min_interval_s=0).endpoints
            if a.endpoint in previous} == {"delta"}
    # from the history: the step recorded seconds ago is the only one, so the advisor reads it back and refuses it
    run = "t/advise-close"
    drift_history.runs.start(run, dag_id="t", run_id=run, trigger="test", triggered_by=None, params={})
    recorded = drift_ctx(STAGE, history=drift_history, step_key=StepKey(run, "advise", 0))
    recorded.record(f"advise:{STAGE}", "advise", "reported", endpoints=first.as_dict()["endpoints"])
    again = advise.advise_cluster(drift_ctx(STAGE, history=drift_history))
    custom = next(a for a in again.endpoints if a.endpoint == "retail/retail-assistant")
    assert custom.rate_source == "unknown" and any("minimum interval" in line for line in custom.arithmetic), custom


def test_a_tight_threshold_recommends_more_workers(rolled_out, drift_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx = drift_ctx(STAGE)
    _, loose = _observed_twice(ctx, threshold=1.0, retention_h=0.01)
    assert loose.capacity is not None and loose.capacity.recommendation not in ("add_workers", "unknown")
    # a week of retention and a 5 % threshold: the working set outgrows what the workers hold
    _, tight = _observed_twice(ctx, threshold=0.05, retention_h=720)
    assert tight.capacity is not None
    per_worker = tight.capacity.capacity_bytes / tight.capacity.workers
    need = math.ceil(tight.capacity.working_set_bytes / (0.05 * per_worker))
    assert tight.capacity.recommendation == "add_workers"
    assert tight.capacity.add_workers == max(1, need - tight.capacity.workers)


def test_the_cli_prints_json_alone(rolled_out, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fleet = tmp_path / "fleet.yaml"
    text = (ROOT / "fleet.example.yaml").read_text()
    import yaml

    doc = yaml.safe_load(text)
    doc["prices"] = {**(doc.get("prices") or {}), "ml.g5.4xlarge": 2.03}
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**os.environ, **rolled_out.exports()}
    env.pop("AIRFLOW_CONN_AWS_DEFAULT", None)
    out = subprocess.run([sys.executable, "-m", "kvfleet.cli", "advise", "--fleet", str(fleet), "--cluster", STAGE,
                          "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    out_doc = json.loads(out.stdout)
    verdicts = {e["endpoint"]: e["verdict"] for c in out_doc["clusters"] for e in c["endpoints"]}
    # the CLI judges at the wall clock, while the twin's pods carry model-time start stamps (ahead of it) and the
    # CLI has no previous observation: the rate is unknown, but the verdicts depend on the lengths and the reuse
    # only (the long-prompt endpoint pays off, the short-prompt one does not)
    assert verdicts["retail/retail-search-rag"] == "pays_off", verdicts
    assert verdicts["support/support-chat"] == "does_not_pay_off", verdicts
    assert set(verdicts.values()) <= {"pays_off", "marginal", "does_not_pay_off", "insufficient_data"}
    rag = next(e for c in out_doc["clusters"] for e in c["endpoints"] if e["endpoint"] == "retail/retail-search-rag")
    assert any("cold(n) x (1 - 1/speedup(n))" in line for line in rag["arithmetic"])
    assert any(line.startswith("verdict pays_off") for line in rag["arithmetic"]) and rag["lengths"]
    assert rag["rate_source"] == "unknown" and rag["working_set_bytes"] is None and rag["observation"]["pods"]
    # the cost side, from the inventory's prices (never fetched): each priced endpoint's replicas x its price
    stage = next(c for c in out_doc["clusters"] if c["cluster"].rsplit("/", 1)[-1] == STAGE)
    g5 = [e for e in stage["endpoints"] if e["instance_type"] == "ml.g5.4xlarge"]
    assert g5 and all(e["gpu_cost_usd_per_hour"] == round(e["replicas"] * 2.03, 4) for e in g5)
    assert stage["capacity"]["cost"]["node_price_usd_per_hour"] == 2.03
    assert stage["capacity"]["threshold"] == 0.8 and stage["capacity"]["workers_needed"] >= 0
    bad = subprocess.run([sys.executable, "-m", "kvfleet.cli", "advise", "--threshold", "nan", "--json"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and bad.stdout == "" and "--threshold" in bad.stderr and "Traceback" not in bad.stderr


def _ep(inv: Any, name: str) -> Any:
    return next(e for e in inv.endpoints_of(STAGE) if e.name == name)


def test_bytes_per_token_come_from_the_measured_stored_lines(rolled_out, drift_ctx) -> None:  # type: ignore[no-untyped-def]
    from kvfleet.stages import verify

    ctx = drift_ctx(STAGE)
    ep = _ep(rolled_out.inventory, "retail-assistant")
    before = advise.observe_endpoint(ctx, ep, _wall_now())
    assert verify.verify_endpoint(ctx, ep, 2000).verdict == "pass"  # writes a Stored line on pod A
    after = advise.observe_endpoint(ctx, ep, _wall_now())
    assert after.bytes_per_token_source is not None and after.bytes_per_token_source.startswith("measured")
    # LMCache prints GiB ("gb", /1024**3): the twin's 0.1028 for 1,925 tokens is Qwen2-7B's 57,344 B a token
    assert after.bytes_per_token == pytest.approx(57_344, rel=0.002)
    assert before.bytes_per_token_source is not None


def test_pooled_probes_do_not_grow_l2_and_a_fresh_probe_does(rolled_out, drift_ctx) -> None:  # type: ignore[no-untyped-def]
    from kvfleet.stages import verify

    ctx = drift_ctx(STAGE)
    ep = _ep(rolled_out.inventory, "retail-search-rag")
    l2 = rolled_out.twin(STAGE).l2
    pool = verify.ProbePool(slots=2, period_s=10**10)  # one slot for the whole test, whatever the wall clock
    files0 = l2.file_count()
    first = verify.verify_endpoint(ctx, ep, 1024, pool=pool)
    assert first.verdict == "pass" and first.detail["cold"] is True, first
    files1 = l2.file_count()
    assert files1 > files0  # the pool's document was written once
    again = verify.verify_endpoint(ctx, ep, 1024, pool=pool)
    assert again.detail["cold"] is False and again.verdict == "pass" and again.hit_ratio == 1.0, again
    assert "speed not judged" in (again.diagnosis or "")
    assert l2.file_count() == files1  # the same document again: nothing new in Curvine
    fresh = verify.verify_endpoint(ctx, ep, 1024)  # a rollout gate's probe: a fresh nonce, new chunks
    assert fresh.detail["cold"] is True and l2.file_count() > files1


def test_the_first_sweep_after_rollout_is_the_baseline(rolled_out, drift_ctx, drift_history) -> None:  # type: ignore[no-untyped-def]
    from kvfleet.airflow.verification import endpoint_baseline
    from kvfleet.history.keys import StepEvent, StepKey
    from kvfleet.stages import verify

    ctx = drift_ctx(STAGE)
    ep = _ep(rolled_out.inventory, "retail-assistant")
    h = drift_history
    for run in ("t/rollout", "t/sweep1", "t/sweep2", "t/rollout2"):
        h.runs.start(run, dag_id="t", run_id=run, trigger="test", triggered_by=None, params={})
    h.runs.record_step(StepKey("t/rollout", "wave"), StepEvent(f"endpoint:{ep.key}", "endpoint", "changed",
                                                          cluster=STAGE, endpoint=ep.key))
    assert endpoint_baseline(h, STAGE, ep.key) is None  # no sweep since the rollout
    for run in ("t/sweep1", "t/sweep2"):
        for n in (1000, 2500):
            r = verify.verify_endpoint(ctx, ep, n).as_dict()
            r["detail"] = {**r["detail"], "sweep": True}
            h.verifications.record(StepKey(run, "verify_cluster"), f"verify:{ep.key}:{n}", r)
    base = endpoint_baseline(h, STAGE, ep.key)
    assert base is not None and base["run_key"] == "t/sweep1" and [n for n, _ in base["points"]] == [1000, 2500]
    # judged against it: a probe cannot pass a baseline no real run reaches, and says which baseline it missed
    judged = verify.verify_endpoint(ctx, ep, 2000, baseline={"run_key": "t/sweep1", "points": [(1000, 40.0),
                                                                                               (2500, 50.0)]})
    assert judged.verdict == "degraded" and "own baseline" in (judged.diagnosis or ""), judged
    assert judged.detail["baseline_run"] == "t/sweep1"
    # a later rollout of the endpoint starts over: its first sweep after that will be the new baseline
    h.runs.record_step(StepKey("t/rollout2", "wave"), StepEvent(f"endpoint:{ep.key}", "endpoint", "changed",
                                                           cluster=STAGE, endpoint=ep.key))
    assert endpoint_baseline(h, STAGE, ep.key) is None


def test_the_scale_out_detection_can_take_the_advisor_s_recommendation(rolled_out, drift_ctx) -> None:  # type: ignore[no-untyped-def]
    """What `curvine_scale.detect` gets from ``advise.with_advised_workers`` on the twin's traffic: a week of
    retention is far beyond 2 x 100 GiB at 5 %, so the target grows to one worker per eligible node."""
    ctx = drift_ctx(STAGE)
    quiet = {"due": False, "reasons": [], "target": 2}
    # no rate known yet (first observation): the detection's own decision stands, with the reason
    unknown = advise.with_advised_workers(ctx, quiet, replicas=2, eligible=12, worker_bytes=100 * 2**30,
                                          threshold=0.05, previous={})
    assert unknown["target"] == 2 and "request rate unknown" in unknown["advisor"], unknown
    first, _ = _observed_twice(ctx)
    previous = {a.endpoint: a.observation for a in first.endpoints if a.observation}
    tight = advise.with_advised_workers(ctx, quiet, replicas=2, eligible=12, worker_bytes=100 * 2**30,
                                        threshold=0.05, previous=previous, min_interval_s=SHORT)
    assert tight["due"] and tight["target"] > 2 and tight["advised_workers"] > 2, tight
    assert any(r.startswith("advisor: working set") for r in tight["reasons"])
    roomy = advise.with_advised_workers(ctx, quiet, replicas=2, eligible=12, worker_bytes=10**15,
                                        threshold=1.0, previous=previous, min_interval_s=SHORT)
    assert not roomy["due"] and roomy["target"] == 2 and roomy["advised_workers"] <= 2


def test_a_recorded_sweep_replaces_the_published_curve(rolled_out, drift_ctx) -> None:  # type: ignore[no-untyped-def]
    """The hourly task passes each endpoint's recorded sweep: judged on it, the same traffic no longer pays off
    when the measured speedup is flat; the endpoints without one stay on the published curve."""
    flat = {"retail/retail-assistant": [(512, 1.0), (3000, 1.02)]}
    report = advise.advise_cluster(drift_ctx(STAGE), sweeps=flat, previous={})
    by = {a.endpoint: a for a in report.endpoints}
    assert by["retail/retail-assistant"].curve == "measured sweep"
    assert by["retail/retail-assistant"].verdict == "does_not_pay_off", by["retail/retail-assistant"].arithmetic
    assert by["retail/retail-search-rag"].curve == "published curve for ml.g5.4xlarge"
