"""Conformance: the twin's synthetic vLLM traffic and kvfleet's counter-rate reading (facts/vllm_traffic_mix.yaml).
The mix is a modelling choice in wall-clock hours; the reset rule follows Prometheus' rate()."""

from __future__ import annotations

import inspect
from pathlib import Path

import yaml

from kvfleet.fleet import economics as E
from kvfleet.stages import advise

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "vllm_traffic_mix.yaml").read_text())


def test_every_upstream_fact_names_its_source() -> None:
    for name in ("prompt_histogram", "counter_rate", "pod_start_time"):
        src = FACTS[name]["source"]
        assert src["repo"] and src["path"] and (src.get("version") or src.get("commit") or src.get("symbol")), name
    assert FACTS["traffic_mix"]["modelling_choice"] is True and "wall" in FACTS["traffic_mix"]["unit"]


def test_the_twin_s_default_mix_is_the_sheet_s() -> None:
    from kvfleet_sandbox.controllers.vllm import engine

    assert {k: [list(r) for r in v] for k, v in engine.DEFAULT_TRAFFIC.items()} == FACTS["traffic_mix"][
        "default_mix_per_hour"]
    # the twin turns the pod's model-time age into wall seconds (Clock.real), so a mix is per wall hour
    assert "clock.real(" in inspect.getsource(engine.VllmSimulation._synthetic)


def test_kvfleet_reads_the_prompt_histogram_and_applies_rate_s_reset_rule() -> None:
    assert FACTS["prompt_histogram"]["name"] == advise.PROMPT_HISTOGRAM
    # a counter lower than before restarted from zero inside the interval: its new value is the increase
    reset = E.request_rate([E.PodCount("p", 30.0, 86_400.0)], {"p": 500.0}, 60.0)
    assert reset.source == "delta" and reset.per_hour == 30.0 * 60
    assert E.MIN_POD_AGE_S == 300.0
