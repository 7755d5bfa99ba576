"""The kvfleet page's Fleet view lists the freezes in force (scope, who, when, why, the command that lifts each),
whatever its filters, escaped; a lifted freeze and a stop are not listed."""

from __future__ import annotations

from typing import Any

import pytest

from kvfleet.airflow.ui import pages
from kvfleet.airflow.ui.catalog import Filters
from kvfleet.airflow.ui.svg import LobColours
from kvfleet.history.holds import ALL, CLUSTER, LOB, Scope

pytestmark = pytest.mark.integration
PROD = "default/us-east-1/ml-prod-use1"


def render(history: Any, **query: str) -> tuple[dict[str, Any], str]:
    f = Filters.from_query(query)
    data = pages.fleet_data(history, f)
    html = str(pages.render_fleet(data, f, LobColours([]), "/kvfleet", {"clusters": [], "lobs": []}))
    return data, html


def test_the_fleet_view_lists_the_freezes_in_force(history: Any) -> None:
    data, html = render(history)
    assert data["freezes"] == [] and 'id="fleet-frozen"' not in html
    history.holds.freeze(Scope(CLUSTER, PROD), "node repair <script>alert(1)</script>", "alice")
    history.holds.freeze(Scope(LOB, "retail"), "launch", "bob")
    history.holds.freeze(Scope(ALL), "over", "carol")
    history.holds.lift(Scope(ALL), "done", "carol")
    history.holds.stop(Scope(ALL), "outage", "dave")
    data, html = render(history, lob="payments")  # a filter narrows the endpoints, not the freezes
    assert [(f["scope"], f["target"], f["by"]) for f in data["freezes"]] == [("cluster", PROD, "alice"),
                                                                              ("lob", "retail", "bob")]
    assert 'id="fleet-frozen"' in html and 'id="fleet-freezes"' in html
    assert f"cluster {PROD}" in html and "lob retail" in html and "alice" in html and "bob" in html
    assert f"kvfleet freeze off --cluster {PROD} --reason" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>" not in html
    assert "carol" not in html and "dave" not in html and "outage" not in html
    assert "/kvfleet/runbook#9-freeze-and-emergency-stop" in html
