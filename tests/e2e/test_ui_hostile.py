"""The kvfleet page against hostile input, through FastAPI's TestClient with Airflow's real auth manager
(SimpleAuthManager) and a history written through the History API the product uses.

What holds: a query string the page cannot use is a 400 naming the parameter, the value (shortened), the allowed
range and the fix, never a 500; the app's OpenAPI schema (and any docs page) is refused to an anonymous caller, as
every view is; and markup or script in any recorded field, in a pending gate, in a filter or in the user's name is
shown as text in every view, never run or parsed as markup.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from airflow_auth import simple_auth_manager

pytestmark = [pytest.mark.integration]
JWT_SECRET = "kvfleet-ui-hostile-secret-" + "0123456789abcdef" * 3


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory, airflow_db: bool) -> Iterator[Any]:
    """Airflow's SimpleAuthManager with a viewer, initialised as the API server does."""
    with simple_auth_manager(tmp_path_factory.mktemp("auth"), JWT_SECRET, "alice:viewer",
                             {"alice": "alice-pw"}) as manager:
        yield manager


def _bearer(manager: Any, user: str) -> dict[str, str]:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return {"Authorization": f"Bearer {manager.generate_jwt(SimpleAuthManagerUser(username=user, role='viewer'))}"}


def _client(history: Any, pending: list[Any] | None = None) -> Any:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from kvfleet.airflow.ui.app import create_app

    root = FastAPI()
    root.mount("/kvfleet", create_app(lambda: history, lambda: list(pending or [])))
    return TestClient(root, base_url="http://127.0.0.1:8080")


@pytest.fixture
def client(history: Any, auth: Any) -> Iterator[Any]:
    with _client(history) as c:
        yield c


@pytest.fixture
def alice(auth: Any) -> dict[str, str]:
    return _bearer(auth, "alice")


# ---- query strings the page cannot use ----------------------------------------------------------------------------

BAD_QUERIES = [
    # (parameter, value, what the answer must also say)
    ("limit", "²", ("1 to 5000",)),  # a Unicode digit: str.isdigit() says yes, int() says no
    ("limit", "٣", ("1 to 5000",)),
    ("limit", "7" * 5000, ("1 to 5000", "5,000 characters")),  # past int()'s digit limit
    ("limit", "-1", ("1 to 5000",)),
    ("cluster", "ml-prod\x00use1", ("U+0000", "control character")),
    ("lob", "retail\x00", ("U+0000", "control character")),
    ("endpoint", "retail/\x00chat", ("U+0000", "control character")),
    ("after", "\x00", ("U+0000", "control character")),
    ("cluster", "x" * 254, ("254 characters", "253")),
    ("cluster", "ml-prod/use1", ("account/region/name",)),  # neither a cluster's name nor its key
    ("since", "²d", ("7d",)),
    ("since", "9" * 5000 + "d", ("7d", "5,001 characters")),
    ("since", "99999999d", ("out of range", "36500d")),
]


@pytest.mark.parametrize(("param", "value", "says"), BAD_QUERIES,
                         ids=[f"{p}-{v[:6].encode('unicode_escape').decode()}-{len(v)}" for p, v, _ in BAD_QUERIES])
def test_a_bad_query_parameter_is_a_400_that_says_what_to_do(client: Any, alice: dict[str, str], param: str,
                                                             value: str, says: tuple[str, ...]) -> None:
    for path in ("/kvfleet/api/fleet", "/kvfleet/fleet", "/kvfleet/api/trends", "/kvfleet/drift",
                 "/kvfleet/api/queries/ui_fleet"):
        resp = client.get(path, params={param: value, "endpoint": "x"} if param != "endpoint" else {param: value},
                          headers=alice)
        assert resp.status_code == 400, (path, resp.status_code, resp.text[:300])
        detail = resp.json()["detail"]
        assert detail.startswith(f"{param}: "), detail
        assert len(detail) < 400, f"the value is shortened in the answer: {len(detail)} characters"
        assert value[:20].encode("unicode_escape").decode() in detail or value[:20] in detail, detail
        for text in says:
            assert text in detail, (text, detail)
        assert "\x00" not in detail


# ---- the OpenAPI schema and docs ----------------------------------------------------------------------------------

SCHEMA_PATHS = ("/kvfleet/api/openapi.json", "/kvfleet/openapi.json", "/kvfleet/docs", "/kvfleet/redoc",
                "/kvfleet/api/docs", "/kvfleet/api/redoc", "/kvfleet/docs/oauth2-redirect")


def test_the_openapi_schema_is_refused_to_an_anonymous_caller(client: Any, alice: dict[str, str],
                                                              auth: Any) -> None:
    for path in SCHEMA_PATHS:
        resp = client.get(path, follow_redirects=False)
        assert resp.status_code in (303, 401, 404), (path, resp.status_code)
        assert "openapi" not in resp.text and "/api/fleet" not in resp.text, path
        if resp.status_code == 303:
            assert resp.headers["location"].startswith("/auth/login?next="), path
    assert client.get("/kvfleet/api/openapi.json", headers={"Authorization": "Bearer not-a-token"}).status_code in (
        401, 403)
    # a signed-in user who may read DAG runs still gets it
    schema = client.get("/kvfleet/api/openapi.json", headers=alice)
    assert schema.status_code == 200
    assert "/api/fleet" in schema.json()["paths"] and "/api/openapi.json" not in schema.json()["paths"]


def test_the_openapi_schema_is_refused_to_a_user_who_may_not_read_runs(client: Any, auth: Any) -> None:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = auth.generate_jwt(SimpleAuthManagerUser(username="nobody", role=None))
    resp = client.get("/kvfleet/api/openapi.json", headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 403 and "paths" not in resp.text


# ---- markup in the data -------------------------------------------------------------------------------------------


def hostile(tag: str) -> str:
    """A value that is markup and script if inserted unescaped, in text or in an attribute (either quote); the
    trailing entity shows whether it was escaped twice. ``tag`` says which field it came from."""
    return f"{tag}\"'><script>alert(1)</script><img src=x onerror=alert(1)><svg onload=alert(1)>&amp;"


def hostile_key(tag: str) -> str:
    """A cluster's key, as the history names a cluster (account/region/name), whose region and name are markup and
    script if inserted unescaped, in text or in an attribute (either quote), ending with an entity: a part holds no
    '/', so its script is left unclosed. A filter on it is a cluster's key the page looks up (``hostile``'s '/'
    would make it neither a name nor a key: a 400)."""
    part = f"{tag}\"'><script>alert(1)<img src=x onerror=alert(1)><svg onload=alert(1)>&amp;"
    return f"default/{part}/{part}"


H = {name: hostile(name) for name in (
    "cluster", "cluster2", "lob", "endpoint", "instance", "verdict", "diagnosis", "dag", "run", "trigger", "who",
    "stage", "outcome", "chosen", "kind", "severity", "object", "field", "expected", "actual", "action", "remedy",
    "release", "chart", "rstatus", "phase", "step", "adv_verdict", "adv_error", "capacity", "arith", "assume",
    "subject", "body", "option", "task", "user", "filter")}
H["cluster"] = hostile_key("cluster")
ENDPOINT = f"ns{H['endpoint']}/name"  # the endpoint's own characters: "ns/name" with markup in the namespace


def seed_hostile(history: Any) -> dict[str, Any]:
    """A run, a verification, a gate answered by a human, Curvine revisions and capacity, an open drift finding with
    a refused remediation and an advise report: every text field the views show carries markup."""
    from kvfleet.fleet import economics as E
    from kvfleet.history.keys import StepEvent, StepKey

    cluster, lob = H["cluster"], H["lob"]
    run_key = f"{H['dag']}/{H['run']}"
    history.runs.start(run_key, dag_id=H["dag"], run_id=H["run"], trigger=H["trigger"], triggered_by=H["who"],
                      params={})
    key = StepKey(run_key, H["task"], 0)
    history.runs.record_step(key, StepEvent(f"endpoint:{ENDPOINT}", H["stage"], "changed", cluster=cluster,
                                       endpoint=ENDPOINT, lob=lob, detail={"cr": H["outcome"]}))
    history.verifications.record(key, "verify:0", {
        "cluster": cluster, "endpoint": ENDPOINT, "lob": lob, "instance_type": H["instance"], "prompt_tokens": 2000,
        "hit_ratio": 0.5, "ttft_cold_ms": 600.0, "ttft_warm_ms": 300.0, "speedup": 2.0, "expected_speedup": 2.3,
        "verdict": H["verdict"], "diagnosis": H["diagnosis"]})
    history.runs.record_step(StepKey(run_key, "cluster.gate_0", 0), StepEvent(
        "gate_response:cluster.gate_0", "gate", "continue", cluster=cluster,
        detail={"chosen": H["chosen"], "asked": "ask_review", "waves": [0]}), actor=H["who"])
    history.curvine.record(cluster=cluster, namespace="curvine", release=H["release"], revision=1,
                                   chart_version=H["chart"], status=H["rstatus"],
                                   flags={"formatMaster": True, "formatWorker": False, "formatJournal": None},
                                   values={}, run_key=run_key, helm_updated="2026-11-30 10:01:00")
    history.curvine.record_capacity(run_key=run_key, step=H["step"], cluster=cluster, phase=H["phase"],
                            overview={"capacity": 100 * 2**30, "fs_used": 2**30, "live_workers": 1,
                                      "lost_workers": 0, "files_total": 1, "dir_total": 1})
    finding = {"fingerprint": f"fp:{H['kind']}", "kind": H["kind"], "severity": H["severity"],
               "object_ref": H["object"], "field": H["field"], "expected": H["expected"], "actual": H["actual"],
               "lob": lob, "endpoint": ENDPOINT}
    history.drift.sync(cluster, [finding], run_key)
    history.drift.record_remediation(finding["fingerprint"], {"action": H["action"], "outcome": H["remedy"]})
    traffic = E.EndpointTraffic(endpoint=ENDPOINT, instance_type="ml.g5.4xlarge",
                                lengths=[E.LengthBucket(2600.0, 200.0)], window_s=3600.0, reuse_ratio=0.8)
    advice = {**E.advise_endpoint(traffic).as_dict(), "verdict": H["adv_verdict"], "arithmetic": [H["arith"]],
              "assumptions": [H["assume"]], "lengths": [{"tokens": 2600.0, "requests": 200.0}], "lob": lob}
    history.runs.record_step(StepKey(run_key, "advise", 0), StepEvent(f"advise:{cluster}", "advise", "reported",
                                                                 cluster=cluster, detail={
        "verdicts": {ENDPOINT: H["adv_verdict"]}, "endpoints": [advice], "errors": [H["adv_error"]],
        "capacity": {"recommendation": H["capacity"], "add_workers": 1, "arithmetic": [H["arith"]]}}))
    history.runs.end(run_key, H["rstatus"], {})
    return {"run_key": run_key}


def pending_gate() -> Any:
    from kvfleet.airflow.hitl import PendingGate

    body = f"{H['body']}\n\n| endpoint | verdict |\n|---|---|\n| {H['endpoint']} | x |\n\n[link](javascript:alert(1))"
    return PendingGate(H["dag"], H["run"], H["task"], 0, H["subject"], body, [H["option"], "Abort"])


class Parsed(HTMLParser):
    """A page as the browser's parser meets it: every element with its attributes, and the text (entities
    decoded)."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self.text.extend(v for _, v in attrs if v)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


SHOWN = {  # each view shows these fields (as text or in an attribute)
    "fleet": ("filter", "user"),  # filtered to no endpoint: the filter is echoed in its form
    "fleet-all": ("cluster", "lob", "endpoint", "verdict", "user"),
    "trends": ("cluster", "lob", "endpoint", "instance", "verdict", "diagnosis", "run", "user"),
    "advisor": ("cluster", "lob", "endpoint", "adv_verdict", "adv_error", "capacity", "arith", "assume", "run"),
    "drift": ("cluster", "lob", "endpoint", "kind", "severity", "field", "expected", "actual", "action", "remedy"),
    "curvine": ("cluster", "release", "chart", "rstatus", "step", "phase", "run"),
    "gates": ("cluster", "chosen", "who", "subject", "body", "option", "task", "run", "endpoint"),
    "runs": ("dag", "run", "trigger", "who", "rstatus"),
}
MARKDOWN = {"body"}  # a gate's body is markdown: its entity is decoded once, as markdown does
QUERY = {"since": "3650d"}
QUERIES = {"fleet": {**QUERY, "endpoint": H["filter"]}, "trends": {**QUERY, "cluster": H["cluster"],
                                                                  "endpoint": ENDPOINT}}


def test_markup_in_any_field_is_shown_as_text_in_every_view(history: Any, auth: Any) -> None:
    from kvfleet.airflow.ui.pages import VIEWS

    seed_hostile(history)
    headers = _bearer(auth, H["user"])
    with _client(history, [pending_gate()]) as c:
        pages = {view: c.get(f"/kvfleet/{view}", params=QUERIES.get(view, QUERY), headers=headers)
                 for view in VIEWS}
        pages["fleet-all"] = c.get("/kvfleet/fleet", params=QUERY, headers=headers)
    assert set(SHOWN) == {*VIEWS, "fleet-all"}
    for view, resp in pages.items():
        assert resp.status_code == 200, (view, resp.text[:300])
        parsed = Parsed(resp.text)
        assert {t for t, _ in parsed.tags}.isdisjoint({"script", "img", "iframe", "object"}), view
        handlers = [(t, a) for t, a in parsed.tags for a in a if a.lower().startswith("on")]
        assert handlers == [], (view, handlers)
        links = [a.get("href") or "" for t, a in parsed.tags if t == "a"]
        assert not any(href.strip().lower().startswith("javascript:") for href in links), (view, links)
        # the payload reached the page, shown whole: neither dropped nor escaped twice
        text = "\n".join(parsed.text)
        for field in SHOWN.get(view, ()):
            shown = H[field].replace("&amp;", "&") if field in MARKDOWN else H[field]
            assert shown in text, (view, field)
    fleet = Parsed(pages["fleet-all"].text)
    assert any(a.get("data-cluster") == H["cluster"] for t, a in fleet.tags if t == "table")
    svg = [a for t, a in Parsed(pages["drift"].text).tags if t == "g" and a.get("class") == "bar"]
    assert svg and svg[0]["data-kind"] == H["kind"] and svg[0]["data-cluster"] == H["cluster"]


def test_markup_is_made_by_autoescaped_templates_only() -> None:
    """What keeps the test above true for the next view: the page's markup comes from templates with autoescape on,
    none of which turns it off or marks a value safe, and the Python side makes Markup only from a template's output
    (``templating.render``) or markdown-it's (``runbook.render``)."""
    import re
    from pathlib import Path

    from kvfleet.airflow.ui import templating

    ui = Path(templating.__file__).parent
    assert templating.ENV.autoescape is True
    templates = sorted(p for p in (ui / "templates").rglob("*") if p.is_file())
    assert {p.name for p in templates} >= {"page.html", "table.html", "xy_chart.svg", "timeline.svg"}
    for path in templates:
        text = path.read_text()
        assert not re.search(r"\|\s*safe\b|autoescape\s+false|Markup", text), path.name
    makers = {p.name for p in ui.glob("*.py") if re.search(r"\bMarkup\(", p.read_text())}
    assert makers == {"templating.py", "runbook.py"}
    assert not any(re.search(r"\bfrom html import\b|\bhtml\.escape\b", p.read_text()) for p in ui.glob("*.py"))
