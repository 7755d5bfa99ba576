"""Conformance: the twin's LMCache/vLLM log lines against the recorded upstream facts
(facts/lmcache_vllm_logs.yaml), and kvfleet's parser against the twin's lines. No server is started: the lines come
from the twin's own formatting functions (``kvfleet_sandbox.controllers._lmcache``)."""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from pathlib import Path

import pytest
import yaml

from kvfleet.fleet import lmcache_log
from kvfleet_sandbox.controllers import _lmcache as lm

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "lmcache_vllm_logs.yaml").read_text())
IDS = FACTS["vllm"]["request_ids"]
WHEN = dt.datetime(2025, 12, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)


def test_every_fact_names_its_source() -> None:
    for version in FACTS["versions"].values():
        for name, fact in version.items():
            if name == "package":
                continue
            src = fact["source"]
            assert src["repo"].startswith("LMCache/LMCache") and src["path"].endswith(".py") and src.get("version")
    for fact in (FACTS["formatter"], FACTS["vllm"]["engine_process_prefix"], *IDS.values()):
        if "source" in fact:
            assert fact["source"]["repo"] and fact["source"]["path"]


@pytest.mark.parametrize("version", lm.VERSIONS)
def test_the_twins_format_strings_are_the_wheels(version: str) -> None:
    sheet = FACTS["versions"][version]
    assert lm.LOOKUP_FMT[version] == sheet["lookup"]["format"]
    assert lm.STORE_FMT[version] == sheet["store"]["format"]
    assert lm.RETRIEVE_FMT[version] == sheet["retrieve"]["format"]
    for what in ("lookup", "store", "retrieve"):
        filename, line, logger = lm.LOCATIONS[version][what]
        src = sheet[what]["source"]
        assert (filename, line, logger) == (Path(src["path"]).name, src["line"], src["logger"])


@pytest.mark.parametrize("level", ["INFO", "WARNING", "ERROR"])
def test_the_twins_prefix_is_what_customformatter_prints(level: str) -> None:
    """The twin's line equals Python's logging.Formatter run with the recorded CustomFormatter format, behind
    vLLM's plain (no-tty) engine-core prefix."""
    f = FACTS["formatter"]
    fmt = (f["format"].replace("{colour}", f["colours"][level]).replace("{reset}", f["reset"])
           .replace("{underline}", f["underline"]))
    formatter = logging.Formatter(fmt)
    formatter.converter = lambda secs: WHEN.utctimetuple()  # type: ignore[assignment,method-assign]
    record = logging.LogRecord("lmcache.v1.cache_engine", getattr(logging, level), "/x/cache_engine.py", 303,
                               "a message", None, None)
    record.created, record.msecs = WHEN.timestamp(), WHEN.microsecond // 1000
    prefix = FACTS["vllm"]["engine_process_prefix"]["plain"].format(
        process_name=FACTS["vllm"]["engine_process_prefix"]["process_name"], pid=77)
    expected = prefix + formatter.format(record)
    assert lm.stamp(WHEN, level, "a message", ("cache_engine.py", 303, "lmcache.v1.cache_engine"), 77) == expected


def test_the_twins_engine_ids_have_vllms_shapes() -> None:
    client = "cmpl-" + uuid.uuid4().hex
    chat = "chatcmpl-" + uuid.uuid4().hex
    assert re.fullmatch(IDS["client_completion"]["shape"], client)
    assert re.fullmatch(IDS["client_chat"]["shape"], chat)
    engine = lm.engine_request_id(client, uuid.uuid4().hex, 0)
    engine_chat = lm.engine_request_id(chat, uuid.uuid4().hex, None)
    assert re.fullmatch(IDS["engine_completion_newer"]["shape"], engine)
    assert re.fullmatch(IDS["engine_chat_newer"]["shape"], engine_chat)
    assert re.search(IDS["engine_suffix"]["shape"], engine) and re.search(IDS["engine_suffix"]["shape"], engine_chat)


@pytest.mark.parametrize("version", lm.VERSIONS)
def test_the_twins_lines_parse_and_join_with_kvfleets_parser(version: str) -> None:
    """A cold then a warm request as the twin logs them (plus another client's request in the window): kvfleet's
    parser finds lookup, store and retrieve of each client id, and nothing of the other's."""
    loc = lm.LOCATIONS[version]
    cold, warm, other = ("cmpl-" + uuid.uuid4().hex for _ in range(3))
    e_cold, e_warm, e_other = (lm.engine_request_id(c, uuid.uuid4().hex, 0) for c in (cold, warm, other))
    stored = 1792 if version == "0.5.6" else 2000
    lines = [
        lm.stamp(WHEN, "INFO", lm.lookup_line(version, e_cold, 2000, 0, 0, 0), loc["lookup"], 9),
        lm.stamp(WHEN, "INFO", lm.store_line(version, e_cold, stored, 2000, 0.1, 10.0, 4.0, 6.0), loc["store"], 9),
        lm.stamp(WHEN, "INFO", lm.lookup_line(version, e_warm, 2000, 0, stored, stored), loc["lookup"], 9),
        lm.stamp(WHEN, "INFO", lm.retrieve_line(version, e_warm, stored, stored, 2000, 0.1, 50.0), loc["retrieve"],
                 9),
        lm.stamp(WHEN, "INFO", lm.lookup_line(version, e_other, 600, 0, 0, 0), loc["lookup"], 9),
        lm.stamp(WHEN, "INFO", lm.store_line(version, e_other, 512, 600, 0.1, 3.0, 1.0, 2.0), loc["store"], 9),
    ]
    assert all("\x1b[32;20m[" in line and line.endswith("\x1b[0m") for line in lines)
    assert not any(f"{c}," in line or f"{c}]" in line for line in lines for c in (cold, warm))  # never the SSE id
    scan = lmcache_log.parse("\n".join(lines))
    assert scan.garbled == [] and scan.errors == []
    assert scan.lookup_for(cold).hit == 0 and scan.stored_tokens(cold) == stored
    assert scan.lookup_for(warm).hit == stored and scan.retrieve_ms(warm) == 50.0 and scan.stored_tokens(warm) == 0
    assert scan.stored_tokens(other) == 512 and scan.retrieve_ms(other) is None
    assert scan.lookup_for(cold[:-1]) is None  # a prefix of the id joins nothing
    carries = FACTS["versions"][version]["store"]["carries_request_id"]
    assert (scan.stores[0].req_id == e_cold) is carries


def test_the_twins_error_line_parses_to_a_plain_message() -> None:
    msg = "Failed to write file /l2cache/x.data: zip() argument 2 is shorter than argument 1"
    line = lm.stamp(WHEN, "ERROR", msg, lm.LOCATIONS["0.5.6"]["fs_error"], 9)
    assert line.count("\x1b[31;20m") == 1
    assert lmcache_log.parse(line).errors == [msg]


@pytest.mark.parametrize(("image", "version"), [tuple(t) for t in FACTS["twin_image_tags"]])
def test_the_twin_picks_the_format_from_the_image_tag(image: str, version: str) -> None:
    assert lm.version_for_image(image, "0.3.9") == version
    assert lm.version_for_image(image, "0.5.6") == version


@pytest.mark.parametrize(("client", "engine"), [tuple(p) for p in FACTS["join_rule"]["must_join"]])
def test_the_parsers_join_rule_joins(client: str, engine: str) -> None:
    assert lmcache_log.joins(client, engine)


@pytest.mark.parametrize(("client", "engine"), [tuple(p) for p in FACTS["join_rule"]["must_not_join"]])
def test_the_parsers_join_rule_refuses(client: str, engine: str) -> None:
    assert not lmcache_log.joins(client, engine)
