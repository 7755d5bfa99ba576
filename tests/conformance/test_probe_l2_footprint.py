"""Conformance: what removes or expires a probe's L2 chunks (facts/probe_l2_footprint.yaml), and kvfleet's
answer to it: the hourly DAG's bounded probe pool, and the GiB reading of LMCache's Stored size."""

from __future__ import annotations

import inspect
from pathlib import Path

import yaml

from kvfleet.fleet import economics as E
from kvfleet.stages import verify

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "probe_l2_footprint.yaml").read_text())


def test_every_fact_names_its_source() -> None:
    for side in ("lmcache", "curvine"):
        for name, fact in FACTS[side].items():
            if name in ("package", "source_commit"):
                continue
            src = fact["source"]
            assert src["repo"] in ("LMCache/LMCache", "CurvineIO/curvine") and src["path"], name
            assert src.get("version") or FACTS[side].get("source_commit"), name


def test_nothing_kvfleet_reaches_removes_only_the_probe_s_chunks_so_the_hourly_dag_pools() -> None:
    lm, cv = FACTS["lmcache"], FACTS["curvine"]
    assert lm["no_eviction"]["evicts"] is False
    assert lm["clear_by_tokens"]["reachable_from_outside"] is False
    assert lm["internal_api_clear"]["enabled_by_default"] is False
    assert cv["ttl_by_set_attr_not_inherited"]["inherited_by_children"] is False
    assert cv["ttl_per_file_at_create"]["default_ttl_ms"] == 0
    # hence the pool, on the hourly DAG's path
    from kvfleet.airflow import verification

    assert "verify.ProbePool()" in inspect.getsource(verification.verify_cluster)
    assert verify.PROBE_POOL_SLOTS * verify.PROBE_POOL_PERIOD_S == 86_400  # a day of cold probes per cold pod


def test_the_stored_size_is_gib_as_the_advisor_reads_it() -> None:
    assert FACTS["lmcache"]["stored_size_unit"]["divisor"] == E.GIB
    bpt, _ = E.bytes_per_token_for([(0.1028, 1925)])
    # 0.1028 is printed with 4 decimals: 57,340.6 B, within 0.01 % of 2 x 28 x 4 x 128 x 2 = 57,344
    assert abs(bpt - E.kv_bytes_per_token(28, 4, 128, 2)) / 57_344 < 1e-4
