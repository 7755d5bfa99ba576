"""The LMCache log parser and its join to the client's request id, on lines built the way the real processes write
them: LMCache's CustomFormatter (colour codes, location suffix) through Python's own ``logging.Formatter``, the
format strings of the 0.3.9.post2 and 0.5.6 wheels, vLLM's engine-core prefix and vLLM's engine request ids
(tests/conformance/facts/lmcache_vllm_logs.yaml names each source)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import yaml

from kvfleet.fleet import lmcache_log

FACTS = yaml.safe_load((Path(__file__).resolve().parents[1] / "conformance" / "facts" /
                        "lmcache_vllm_logs.yaml").read_text())
FMT = FACTS["versions"]
SSE = "cmpl-0123456789abcdef0123456789abcdef"
OTHER = "cmpl-0123456789abcdef0123456789abcdee"  # another client's request in the same window


def real_line(message: str, *, level: int = logging.INFO, where: str = "cache_engine.py:303",
              logger: str = "lmcache.v1.cache_engine", engine_prefix: bool = True) -> str:
    """One line as LMCache's CustomFormatter prints it (run through logging.Formatter, not hand-written), behind
    vLLM's ``(EngineCore_DP0 pid=…)`` prefix."""
    f = FACTS["formatter"]
    name = logging.getLevelName(level)
    fmt = f["format"].replace("{colour}", f["colours"][name]).replace("{reset}", f["reset"]) \
        .replace("{underline}", f["underline"])
    formatter = logging.Formatter(fmt)
    formatter.converter = time.gmtime
    filename, lineno = where.split(":")
    record = logging.LogRecord(logger, level, f"/x/{filename}", int(lineno), message, None, None)
    line = formatter.format(record)
    return ("(EngineCore_DP0 pid=412) " if engine_prefix else "") + line


def lookup(version: str, req: str, total: int, hits: int, need: int, computed: int = 0) -> str:
    fmt = FMT[version]["lookup"]["format"]
    args = (req, total, hits, need) if version == "0.3.9" else (req, total, computed, hits, need)
    return real_line(fmt % args, where="vllm_v1_adapter.py:1330", logger="lmcache.integration.vllm.vllm_v1_adapter")


def store(version: str, req: str, stored: int, total: int, ms: float = 10.71) -> str:
    args = (stored, total, 0.1028, ms, 9.6, 1.0, 2.0)
    fmt = FMT[version]["store"]["format"]
    return real_line(fmt % ((req, *args) if version == "0.5.6" else args))


def retrieve(version: str, req: str, got: int, ms: float = 55.75) -> str:
    args = (got, got, got, 0.1028, ms, 1.84)
    fmt = FMT[version]["retrieve"]["format"]
    return real_line(fmt % ((req, *args) if version == "0.5.6" else args), where="cache_engine.py:531")


def test_a_real_line_has_the_colour_codes_and_the_location_suffix() -> None:
    line = lookup("0.3.9", f"{SSE}-0-3fa85f64", 1925, 0, 0)
    assert line.startswith("(EngineCore_DP0 pid=412) \x1b[32;20m[") and "LMCache INFO:\x1b[0m Reqid: " in line
    assert line.endswith(" \x1b[3m(vllm_v1_adapter.py:1330:lmcache.integration.vllm.vllm_v1_adapter)\x1b[0m")


@pytest.mark.parametrize("engine_id", [SSE, f"{SSE}-0", f"{SSE}-0-3fa85f64", f"{SSE}-3fa85f64"])
def test_v039_lookup_store_retrieve_join_the_sse_id(engine_id: str) -> None:
    cold = "\n".join([lookup("0.3.9", engine_id, 1925, 0, 0), store("0.3.9", engine_id, 1925, 1925)])
    warm = "\n".join([lookup("0.3.9", engine_id, 1925, 1925, 1924), retrieve("0.3.9", engine_id, 1925)])
    a, b = lmcache_log.parse(cold), lmcache_log.parse(warm)
    assert (a.lookup_for(SSE).total, a.lookup_for(SSE).hit) == (1925, 0)
    assert a.stored_tokens(SSE) == 1925 and a.stores[0].gb == 0.1028 and a.stores[0].ms == 10.71
    assert (b.lookup_for(SSE).hit, b.lookup_for(SSE).need_to_load) == (1925, 1924)
    assert b.retrieve_ms(SSE) == 55.75 and a.garbled == b.garbled == []


def test_v056_lines_with_engine_ids_and_computed_tokens() -> None:
    engine_id = f"{SSE}-0-9c1e55aa"
    scan = lmcache_log.parse("\n".join([
        lookup("0.5.6", engine_id, 2000, 1792, 1792),
        store("0.5.6", engine_id, 1792, 2000, ms=9.9),
        retrieve("0.5.6", engine_id, 1792, ms=52.0)]))
    found = scan.lookup_for(SSE)
    assert (found.req_id, found.computed, found.hit, found.need_to_load) == (engine_id, 0, 1792, 1792)
    assert scan.stored_tokens(SSE) == 1792 and scan.retrieve_ms(SSE) == 52.0
    assert scan.stores[0].gb == 0.1028 and scan.garbled == []


def test_the_kv_group_store_form_of_lmcache_main() -> None:
    fmt = FMT["main_after_0.5.6"]["store"]["format"]
    line = real_line(fmt % (f"{SSE}-0-3fa85f64", 0, 1792, 2000, 0.0957, 9.9, 9.66, 1.0, 2.0))
    scan = lmcache_log.parse(line)
    assert scan.stored_tokens(SSE) == 1792 and scan.stores[0].kv_group == "0" and scan.garbled == []


def test_the_0_5_6_below_min_retrieve_lookup_and_the_none_lookups() -> None:
    below = FMT["0.5.6"]["lookup_below_min_retrieve"]["format"] % (f"{SSE}-0", 2000, 0, 256, 256, 512)
    none_039 = FMT["0.3.9"]["lookup_none"]["format"] % (f"{OTHER}-0", 10)
    scan = lmcache_log.parse("\n".join([real_line(below), real_line(none_039, level=logging.DEBUG)]))
    assert (scan.lookup_for(SSE).hit, scan.lookup_for(SSE).need_to_load) == (256, 256)
    assert scan.lookup_for(OTHER).hit is None and scan.garbled == []


@pytest.mark.parametrize("version", ["0.3.9", "0.5.6"])
def test_a_prefix_sharing_request_never_joins(version: str) -> None:
    """``cmpl-ab`` must not pick up ``cmpl-abc-0``'s lines, nor a longer id's, nor a malformed suffix."""
    short = "cmpl-ab"
    log = "\n".join([lookup(version, "cmpl-abc-0", 2000, 2000, 1999), retrieve(version, "cmpl-abc-0", 2000),
                     lookup(version, "cmpl-ab-0-3fa85f64-1", 2000, 2000, 1999)])
    scan = lmcache_log.parse(log)
    assert scan.lookup_for(short) is None and scan.retrieve_ms(short) is None and scan.stored_tokens(short) == 0
    assert scan.lookup_for("cmpl-abc").hit == 2000


@pytest.mark.parametrize(("client", "engine", "joined"), [
    ("cmpl-ab", "cmpl-ab", True), ("cmpl-ab", "cmpl-ab-0", True), ("cmpl-ab", "cmpl-ab-0-3fa85f64", True),
    ("chatcmpl-ab", "chatcmpl-ab-3fa85f64", True), ("cmpl-ab", "cmpl-ab-17", True),
    ("cmpl-ab", "cmpl-abc-0", False), ("cmpl-ab", "cmpl-abc", False), ("cmpl-ab", "cmpl-a", False),
    ("cmpl-ab", "cmpl-ab-", False), ("cmpl-ab", "cmpl-ab-x", False), ("cmpl-ab", "cmpl-ab-0-3fa8", False),
    ("cmpl-ab", "cmpl-ab-0-3fa85f64-1", False), ("cmpl-ab", "xcmpl-ab-0", False), ("", "cmpl-ab", False),
    ("cmpl-ab", None, False)])
def test_the_join_rule(client: str, engine: str | None, joined: bool) -> None:
    assert lmcache_log.joins(client, engine) is joined


def test_v056_another_requests_lines_in_the_same_window_do_not_count() -> None:
    log = "\n".join([
        lookup("0.5.6", f"{OTHER}-0-11111111", 2000, 0, 0),
        lookup("0.5.6", f"{SSE}-0-22222222", 2000, 0, 0),
        store("0.5.6", f"{OTHER}-0-11111111", 1792, 2000, ms=5.0),  # the other request's store, after ours' lookup
        retrieve("0.5.6", f"{OTHER}-0-11111111", 1792, ms=40.0)])
    scan = lmcache_log.parse(log)
    assert scan.lookup_for(SSE).hit == 0 and scan.stored_tokens(SSE) == 0 and scan.retrieve_ms(SSE) is None
    assert scan.stored_tokens(OTHER) == 1792 and scan.retrieve_ms(OTHER) == 40.0


def test_v039_id_less_lines_belong_to_the_latest_lookup_before_them() -> None:
    """0.3.x store/retrieve lines carry no id: a store after another request's lookup is not ours."""
    log = "\n".join([
        lookup("0.3.9", f"{SSE}-0-22222222", 1925, 0, 0),
        store("0.3.9", "-", 1925, 1925, ms=10.0),  # ours
        lookup("0.3.9", f"{OTHER}-0-11111111", 1000, 512, 512),
        retrieve("0.3.9", "-", 512, ms=40.0),  # the other request's
        store("0.3.9", "-", 488, 1000, ms=3.0)])  # the other request's
    scan = lmcache_log.parse(log)
    assert scan.stored_tokens(SSE) == 1925 and scan.retrieve_ms(SSE) is None
    assert scan.stored_tokens(OTHER) == 488 and scan.retrieve_ms(OTHER) == 40.0
    assert scan.stored_tokens() == 1925 + 488


def test_chunked_prefill_stores_in_several_lines_are_summed() -> None:
    engine_id = f"{SSE}-0-22222222"
    scan = lmcache_log.parse("\n".join([lookup("0.5.6", engine_id, 2048, 0, 0),
                                        store("0.5.6", engine_id, 1024, 1024), store("0.5.6", engine_id, 1024, 1024)]))
    assert scan.stored_tokens(SSE) == 2048


def test_error_messages_lose_colour_codes_and_the_location_suffix() -> None:
    error = FMT["0.5.6"]["fs_write_error"]["format"] % (
        "/mnt/curvine/l2cache/x.data", "zip() argument 2 is shorter than argument 1")
    line = real_line(error, level=logging.ERROR, where="fs_connector.py:376",
                     logger="lmcache.v1.storage_backend.connector.fs_connector")
    assert "\x1b[31;20m" in line
    scan = lmcache_log.parse(line)
    assert scan.errors == ["Failed to write file /mnt/curvine/l2cache/x.data: zip() argument 2 is shorter than "
                           "argument 1"]
    assert all("\x1b" not in e for e in scan.errors)


def test_the_blogs_abbreviated_lines_without_prefixes_still_parse() -> None:
    scan = lmcache_log.parse(
        "LMCache INFO: Reqid: x-1, Total tokens 1925, LMCache hit tokens: 1925, need to load: 1924\n"
        "LMCache INFO: Retrieved 1925 out of 1925 required tokens. cost 55.75 ms, throughput: 1.84 GB/s\n")
    assert scan.lookup_for("x-1").hit == 1925 and scan.retrieve_ms("x-1") == 55.75


def test_garbled_lines_are_reported_without_colour_and_never_raise() -> None:
    scan = lmcache_log.parse("\n".join([
        real_line("Stored lots of tokens, trust me"),
        real_line("Reqid: r, Chunked KV loading: capped from 900 to 512 external tokens (max_tokens_per_load=512)",
                  level=logging.DEBUG),
        "unrelated vLLM line"]))
    assert len(scan.garbled) == 1 and "\x1b" not in scan.garbled[0]
    assert "LMCache INFO: Stored lots of tokens, trust me" in scan.garbled[0]
    assert scan.lookups == [] and scan.errors == []
