"""One tolerant parser for LMCache 0.3.x and 0.5.x log lines (FACTS.md §4.4); garbled lines are reported."""

from __future__ import annotations

from kvfleet.fleet import lmcache_log

V039 = """\
[2026-11-29 10:00:00,001] LMCache INFO: Reqid: cmpl-a, Total tokens 1925, LMCache hit tokens: 0, need to load: 0
[2026-11-29 10:00:00,020] LMCache INFO: Stored 1925 out of total 1925 tokens. size: 0.1028 gb, cost 10.7100 ms, throughput: 9.6000 GB/s; offload_time: 1.0000 ms, put_time: 2.0000 ms
[2026-11-29 10:00:01,001] LMCache INFO: Reqid: cmpl-b, Total tokens 1925, LMCache hit tokens: 1925, need to load: 1924
[2026-11-29 10:00:01,060] LMCache INFO: Retrieved 1925 out of 1925 required tokens (from 1925 total tokens). size: 0.1028 gb, cost 55.7500 ms, throughput: 1.8400 GB/s;
"""
V056 = """\
(EngineCore_DP0 pid=7) [2026-11-29 10:00:00,001] LMCache INFO: Reqid: cmpl-c, Total tokens 2000, Inference Engine computed tokens: 0, LMCache hit tokens: 1792, need to load: 1792
(EngineCore_DP0 pid=7) [2026-11-29 10:00:00,020] LMCache INFO: [req_id=cmpl-c] Stored 1792 out of total 2000 tokens. size: 0.0957 GB, cost 9.9000 ms, throughput: 9.6600 GB/s; offload_time: 1.0 ms, put_time: 2.0 ms
(EngineCore_DP0 pid=7) [2026-11-29 10:00:00,080] LMCache INFO: [req_id=cmpl-c] Retrieved 1792 out of 1792 required tokens (from 2000 total tokens). size: 0.0957 gb, cost 52.0000 ms, throughput: 1.8400 GB/s;
"""
BLOG = """\
LMCache INFO: Reqid: x-1, Total tokens 1925, LMCache hit tokens: 1925, need to load: 1924
LMCache INFO: Retrieved 1925 out of 1925 required tokens. cost 55.75 ms, throughput: 1.84 GB/s
"""


def test_v039_lines() -> None:
    scan = lmcache_log.parse(V039)
    a, b = scan.lookup_for("cmpl-a"), scan.lookup_for("cmpl-b")
    assert (a.total, a.hit, a.need_to_load) == (1925, 0, 0)
    assert (b.hit, b.need_to_load) == (1925, 1924)
    assert scan.stored_tokens() == 1925 and scan.stores[0].gb == 0.1028 and scan.stores[0].ms == 10.71
    assert scan.retrieve_ms() == 55.75 and scan.garbled == []


def test_v056_lines_with_request_ids_and_computed_tokens() -> None:
    scan = lmcache_log.parse(V056)
    lookup = scan.lookup_for("cmpl-c")
    assert (lookup.computed, lookup.hit) == (0, 1792)
    assert scan.stored_tokens("cmpl-c") == 1792 and scan.stored_tokens("cmpl-other") == 0
    assert scan.retrieve_ms("cmpl-c") == 52.0


def test_the_blogs_abbreviated_retrieve_line() -> None:
    scan = lmcache_log.parse(BLOG)
    assert scan.lookup_for("x-1").hit == 1925 and scan.retrieve_ms() == 55.75


def test_none_hit_and_errors_and_garbled_lines_do_not_crash() -> None:
    scan = lmcache_log.parse(
        "LMCache INFO: Reqid: r, Total tokens 10, LMCache hit tokens: None.\n"
        "LMCache ERROR: Failed to write file /mnt/x: zip() argument 2 is shorter\n"
        "LMCache INFO: Stored lots of tokens, trust me\n"
        "unrelated vLLM line\n")
    assert scan.lookup_for("r").hit is None
    assert scan.errors == ["Failed to write file /mnt/x: zip() argument 2 is shorter"]
    assert scan.garbled == ["LMCache INFO: Stored lots of tokens, trust me"]
