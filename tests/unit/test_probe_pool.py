"""The probe pool, pure parts: the bounded rotating pool of probe documents (``verify.ProbePool``) and the endpoint's
own speed baseline (``verdict.baseline_from_rows`` / ``baseline_speedup`` / ``verdict_of``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kvfleet.fleet import verdict as V
from kvfleet.stages import verify

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_a_day_of_hourly_probes_uses_at_most_the_pool_s_documents_per_cold_pod() -> None:
    pool = verify.ProbePool()
    hours = [T0 + timedelta(hours=h) for h in range(72)]
    docs = {pool.nonce("ns/ep", "uid-a", 2000, t) for t in hours}
    assert len(docs) == verify.PROBE_POOL_SLOTS == 24  # three days, still one day's documents
    first_day = [pool.nonce("ns/ep", "uid-a", 2000, t) for t in hours[:24]]
    assert len(set(first_day)) == 24  # no document repeats within a day: each of those probes is cold


def test_a_new_cold_pod_gets_fresh_documents_and_lengths_never_share_one() -> None:
    pool = verify.ProbePool(slots=3)
    a = {pool.nonce("ns/ep", "uid-a", 2000, T0 + timedelta(hours=h)) for h in range(3)}
    b = {pool.nonce("ns/ep", "uid-b", 2000, T0 + timedelta(hours=h)) for h in range(3)}
    assert len(a) == len(b) == 3 and not a & b
    # the sweep's lengths must not share a document: a shorter one would be a cached prefix of a longer one
    assert pool.nonce("ns/ep", "uid-a", 1000, T0) != pool.nonce("ns/ep", "uid-a", 1500, T0)
    assert pool.nonce("ns/ep", "uid-a", 2000, T0) != pool.nonce("ns/other", "uid-a", 2000, T0)
    # and the document is the nonce's: the same slot always sends byte-identical text
    assert verify.build_prompt(600, pool.nonce("ns/ep", "uid-a", 600, T0)) == verify.build_prompt(
        600, verify.probe_nonce("ns/ep", "uid-a", 600, pool.slot_at(T0)))


def _rows(run: str, at: str, points: list[tuple[int, float, float]]) -> list[dict[str, object]]:
    return [{"run_key": run, "at": at, "prompt_tokens": n, "speedup": s, "hit_ratio": h} for n, s, h in points]


def test_the_first_full_hit_sweep_after_rollout_is_the_baseline() -> None:
    rows = (_rows("r1", "2026-12-01T01:00", [(512, 1.1, 0.5), (2000, 2.0, 0.2)])  # misses: says nothing of speed
            + _rows("r2", "2026-12-01T02:00", [(512, 1.2, 1.0), (1000, 1.6, 1.0), (2500, 2.4, 1.0)])
            + _rows("r3", "2026-12-01T03:00", [(512, 1.0, 1.0), (2500, 1.1, 1.0)]))
    base = V.baseline_from_rows(rows)
    assert base is not None and base["run_key"] == "r2" and base["points"] == [(512, 1.2), (1000, 1.6), (2500, 2.4)]
    assert V.baseline_speedup(base, 1750) == pytest.approx(2.0)  # interpolated between 1,000 and 2,500
    assert V.baseline_speedup(base, 3000) == 2.4  # flat outside the sweep
    assert V.baseline_from_rows([]) is None and V.baseline_speedup(None, 2000) is None
    assert V.baseline_from_rows(_rows("r", "t", [(2000, 2.0, 1.0)])) is None  # one point: no curve


def test_degraded_also_means_slower_than_its_own_baseline() -> None:
    # g6e: the stand-in curve expects 1.34x at 2,000+ tokens; a probe at 1.5x passes it, but the endpoint's own
    # first sweep ran at 2.4x: 1.5 < 2.4 x (1 - 0.25) = 1.8 -> degraded
    assert V.verdict_of(1.0, 1.5, 1.34) == "pass"
    assert V.verdict_of(1.0, 1.5, 1.34, baseline=2.4) == "degraded"
    assert V.verdict_of(1.0, 1.9, 1.34, baseline=2.4) == "pass"
    # the published curve stays in force (g5): a probe at its own (slow) baseline but below the curve is degraded
    assert V.verdict_of(1.0, 1.5, 2.7, baseline=1.5) == "degraded"
    assert V.verdict_of(0.0, 3.0, 1.34, baseline=2.4) == "fail"
    assert "ml.g5.4xlarge" in V.PUBLISHED_SPEED_TYPES and "ml.g6e.4xlarge" not in V.PUBLISHED_SPEED_TYPES
