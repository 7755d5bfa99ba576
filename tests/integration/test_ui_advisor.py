"""The kvfleet page's L2 advisor panel on a real history: the newest ``advise:<cluster>`` step per
cluster, each endpoint's prompt-length distribution plotted (server-rendered SVG) with the payoff threshold marked
and the same figures in a table, the verdict with its arithmetic, LOB colours as on every other view; a step that
recorded verdicts only degrades to them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kvfleet.airflow.ui import pages
from kvfleet.airflow.ui.catalog import Filters
from kvfleet.airflow.ui.svg import LobColours
from kvfleet.fleet import economics as E
from kvfleet.history.keys import StepEvent, StepKey

pytestmark = pytest.mark.integration
RAG = [(1800.0, 120.0), (2600.0, 200.0), (3200.0, 40.0)]
CHAT = [(180.0, 200.0), (420.0, 140.0), (700.0, 20.0)]


def advice(endpoint: str, lengths: list[tuple[float, float]]) -> dict[str, Any]:
    """One endpoint's advice as `kvfleet advise --json` prints it, with the distribution it was computed from."""
    traffic = E.EndpointTraffic(endpoint=endpoint, instance_type="ml.g5.4xlarge",
                                lengths=[E.LengthBucket(t, n) for t, n in lengths], window_s=3600.0, reuse_ratio=0.8)
    return {**E.advise_endpoint(traffic).as_dict(), "lengths": [{"tokens": t, "requests": n} for t, n in lengths]}


@pytest.fixture
def seeded(history: Any) -> dict[str, Any]:
    rk = "kvfleet_hit_verification/scheduled__2026-12-01T10:00:00+00:00"
    history.runs.start(rk, dag_id="kvfleet_hit_verification", run_id=rk.split("/", 1)[1], trigger="schedule",
                      triggered_by=None, params={})
    for ep, lob in (("support/support-rag", "support"), ("retail/retail-chat", "retail")):
        history.runs.record_step(StepKey(rk, "verify_cluster", 0), StepEvent(f"endpoint:{ep}", "endpoint", "changed",
                                                                         cluster="c1", endpoint=ep, lob=lob))
    rag, chat = advice("support/support-rag", RAG), advice("retail/retail-chat", CHAT)
    capacity = E.advise_cluster("c1", [E.EndpointAdvice(**{k: v for k, v in a.items() if k != "lengths"})
                                       for a in (rag, chat)], capacity_bytes=200 * 2**30, workers=2).as_dict()
    older = "kvfleet_hit_verification/scheduled__2026-12-01T09:00:00+00:00"  # an earlier run's report is not shown
    history.runs.start(older, dag_id="kvfleet_hit_verification", run_id=older.split("/", 1)[1], trigger="schedule",
                      triggered_by=None, params={})
    history.runs.record_step(StepKey(older, "advise", 0), StepEvent("advise:c1", "advise", "reported", cluster="c1",
                                                               detail={"verdicts": {rag["endpoint"]: "marginal",
                                                                                    "retail/retail-old": "marginal"}}))
    history.runs.record_step(StepKey(rk, "advise", 0), StepEvent("advise:c1", "advise", "reported", cluster="c1", detail={
        "verdicts": {rag["endpoint"]: rag["verdict"], chat["endpoint"]: chat["verdict"]},
        "endpoints": [rag, chat], "capacity": capacity, "errors": []}))
    history.runs.record_step(StepKey(rk, "advise", 1), StepEvent("advise:c2", "advise", "reported", cluster="c2", detail={
        "verdicts": {"retail/retail-docs": "does_not_pay_off"}, "capacity": None,
        "errors": ["Curvine master: unreachable"]}))
    history.runs.end(rk, "success", {})
    return {"rag": rag, "chat": chat, "capacity": capacity, "older": older, "newer": rk}


def render(history: Any, **query: str) -> tuple[dict[str, Any], str]:
    f = Filters.from_query(query, default_since="7d")
    data = pages.advisor_data(history, f)
    colours = LobColours(pages.lobs(history))
    ctx = {"clusters": ["c1", "c2"], "lobs": pages.lobs(history)}
    return data, pages.page("advisor", pages.render_advisor(data, f, colours, "/kvfleet", ctx), base="/kvfleet",
                            user="alice", colours=colours)


def bars(html: str, chart_id: str) -> list[tuple[float, float, str, str]]:
    svg = re.search(rf'<svg[^>]*id="{re.escape(chart_id)}".*?</svg>', html, re.S)
    assert svg, chart_id
    return [(float(x), float(y), fill, below) for fill, x, y, below in re.findall(
        r'<rect [^>]*fill="(#[0-9A-Fa-f]{6})" data-x="([\d.]+)" data-y="([\d.]+)" data-below="(\w+)"', svg.group(0))]


def test_the_panel_plots_each_endpoints_lengths_against_the_payoff_threshold(history: Any, seeded: Any) -> None:
    data, html = render(history)
    assert [c["cluster"] for c in data["clusters"]] == ["c1", "c2"]
    c1 = data["clusters"][0]
    # each endpoint's newest advice: a run scoped to some endpoints does not hide the others' older advice
    assert [(e["endpoint"], e["verdict"], e["lob"], e["run_key"]) for e in c1["endpoints"]] == [
        ("retail/retail-chat", "does_not_pay_off", "retail", seeded["newer"]),
        ("retail/retail-old", "marginal", None, seeded["older"]),
        ("support/support-rag", "pays_off", "support", seeded["newer"])]
    assert c1["capacity"] == seeded["capacity"] and c1["run_key"] == seeded["newer"]
    colours = LobColours(["retail", "support"])
    rag = bars(html, "plot-lengths-c1-support/support-rag")
    assert [(x, y) for x, y, _, _ in rag] == RAG and {b for *_, b in rag} == {"false"}
    assert {fill for _, _, fill, _ in rag} == {colours("support")}
    chat = bars(html, "plot-lengths-c1-retail/retail-chat")
    assert [(x, y) for x, y, _, _ in chat] == CHAT and {b for *_, b in chat} == {"true"}  # all below 1,000 tokens
    assert {fill for _, _, fill, _ in chat} == {colours("retail")}
    assert html.count('<g class="threshold" data-x="1000">') == 2 and "payoff ≈ 1,000 tokens" in html
    # the same figures as a table (no SVG, no JS needed), and the verdict's arithmetic as the model wrote it
    rows = re.findall(r'<td data-col="tokens" data-value="([\d.]+)".*?data-col="requests" data-value="([\d.]+)"',
                      html.split('id="lengths-c1-retail/retail-chat"')[1].split("</table>")[0])
    assert [(float(t), float(n)) for t, n in rows] == CHAT
    for line in seeded["chat"]["arithmetic"] + seeded["capacity"]["arithmetic"]:
        assert f"<li>{line}</li>".replace("&", "&amp;") in html.replace("&gt;", ">").replace("&#x27;", "'")
    assert f'data-recommendation="{seeded["capacity"]["recommendation"]}"' in html
    assert "<script" not in html


def test_a_step_with_verdicts_only_and_the_filters(history: Any, seeded: Any) -> None:
    data, html = render(history, cluster="c2")
    (c2,) = data["clusters"]
    assert [{k: e[k] for k in ("endpoint", "verdict", "lengths", "lob")} for e in c2["endpoints"]] == [
        {"endpoint": "retail/retail-docs", "verdict": "does_not_pay_off", "lengths": [], "lob": None}]
    assert "recorded no prompt-length distribution" in html and "could not read: Curvine master: unreachable" in html
    assert 'id="plot-lengths-' not in html
    data, _ = render(history, lob="retail")
    assert [e["endpoint"] for c in data["clusters"] for e in c["endpoints"]] == ["retail/retail-chat"]
