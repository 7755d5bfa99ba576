"""The kvfleet page's app through FastAPI's TestClient, with Airflow's real auth manager (SimpleAuthManager) and a
history written through the history repositories the product uses (no rollout: the browser test runs one).

What holds: no data without a valid Airflow user (401 for the API, a redirect to Airflow's login for a page, 403
for a forged token), the JSON shapes of every view, that figures equal what `Queries.rows` (the CLI's named
queries) returns for the same rows, that bad filters are 400s naming the field, and that the plugin registers
the app at /kvfleet with a navigation entry.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from airflow_auth import simple_auth_manager

pytestmark = [pytest.mark.integration]
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
JWT_SECRET = "kvfleet-ui-test-secret-" + "0123456789abcdef" * 3


def seed_history(history: Any) -> dict[str, Any]:
    """A rollout of 3 endpoints on 2 clusters with verifications (one a sweep), a gate answered by a human, Curvine
    revisions and capacity, and drift opened, remediated and resolved; written as the stages write them."""
    from kvfleet.history.keys import StepEvent, StepKey

    rk = "kvfleet_rollout/manual__2026-11-30T10:00:00+00:00"
    history.runs.start(rk, dag_id="kvfleet_rollout", run_id=rk.split("/", 1)[1], trigger="manual",
                      triggered_by="alice", params={"wave_size": 3})
    eps = [("ml-prod-use1", "retail/retail-search-rag", "retail"), ("ml-prod-use1", "support/support-chat", "support"),
           ("ml-stage-usw2", "payments/payments-fraud", "payments")]
    for i, (cluster, ep, lob) in enumerate(eps):
        key = StepKey(rk, "cluster.wave_0", i)
        history.runs.record_step(key, StepEvent(f"endpoint:{ep}", "endpoint", "changed", cluster=cluster, endpoint=ep,
                                           lob=lob, detail={"cr": "changed"}))
        history.verifications.record(key, f"verify:0:{ep}", {
            "cluster": cluster, "endpoint": ep, "lob": lob, "instance_type": "ml.g5.4xlarge", "prompt_tokens": 2000,
            "stored_tokens": 1792, "hit_tokens": 1792, "hit_ratio": 1.0, "ttft_cold_ms": 620.0 + i,
            "ttft_warm_ms": 260.0, "speedup": round((620.0 + i) / 260.0, 3), "expected_speedup": 2.367,
            "verdict": "pass" if i != 1 else "degraded", "diagnosis": None if i != 1 else "slow warm TTFT"})
        history.runs.record_step(key, StepEvent("gate:0", "gate", "passed" if i != 1 else "review", cluster=cluster))
    history.runs.record_step(StepKey(rk, "cluster.gate_0", 0), StepEvent(
        "gate_response:cluster.gate_0", "gate", "continue", cluster="ml-prod-use1",
        detail={"chosen": "Approve", "asked": "ask_review", "waves": [0]}), actor="alice")
    # a sweep of the first endpoint by the hourly verification DAG
    vk = "kvfleet_hit_verification/scheduled__2026-11-30T11:00:00+00:00"
    history.runs.start(vk, dag_id="kvfleet_hit_verification", run_id=vk.split("/", 1)[1], trigger="schedule",
                      triggered_by=None, params={"sweep": True})
    sweep = {500: 1.02, 1000: 1.66, 1500: 2.01, 2000: 2.35, 2500: 2.62, 3000: 2.69}
    for n, s in sweep.items():
        history.verifications.record(StepKey(vk, "verify_cluster", 0), f"verify:retail/retail-search-rag:{n}", {
            "cluster": "ml-prod-use1", "endpoint": "retail/retail-search-rag", "lob": "retail",
            "instance_type": "ml.g5.4xlarge", "prompt_tokens": n, "hit_ratio": 1.0, "ttft_cold_ms": 0.31 * n,
            "ttft_warm_ms": 0.31 * n / s, "speedup": s, "expected_speedup": 2.0, "verdict": "pass"})
    history.runs.end(vk, "success", {})
    history.curvine.record(cluster="ml-prod-use1", namespace="curvine", release="curvine", revision=1,
                                   chart_version="0.2.1", status="superseded",
                                   flags={"formatMaster": True, "formatWorker": True, "formatJournal": True},
                                   values={}, run_key=rk, helm_updated="2026-11-30 10:01:00")
    history.curvine.record(cluster="ml-prod-use1", namespace="curvine", release="curvine", revision=2,
                                   chart_version="0.2.1", status="deployed",
                                   flags={"formatMaster": False, "formatWorker": False, "formatJournal": False},
                                   values={}, run_key=rk, helm_updated="2026-11-30 10:02:00")
    for phase, cap in (("install", 2), ("verify", 3)):
        history.curvine.record_capacity(run_key=rk, step=f"curvine:{phase}", cluster="ml-prod-use1", phase=phase,
                                overview={"capacity": cap * 100 * 2**30, "fs_used": 2**30, "live_workers": cap,
                                          "lost_workers": 0, "files_total": 10, "dir_total": 2})
    history.runs.end(rk, "success", {})
    dk = "kvfleet_drift_check/scheduled__2026-11-30T12:00:00+00:00"
    history.runs.start(dk, dag_id="kvfleet_drift_check", run_id=dk.split("/", 1)[1], trigger="schedule",
                      triggered_by=None, params={})
    finding = {"fingerprint": "patch_lost:support/support-chat:env", "kind": "patch_lost_to_reconcile",
               "severity": "high", "object_ref": "Deployment support/support-chat", "field": "env.LMCACHE",
               "expected": "set", "actual": "missing", "lob": "support", "endpoint": "support/support-chat"}
    history.drift.sync("ml-prod-use1", [finding], dk)
    history.drift.record_remediation(finding["fingerprint"], {"action": "reapply_overlay", "outcome": "changed"})
    history.drift.sync("ml-prod-use1", [], dk + "-2")
    still = {**finding, "fingerprint": "operator_paused:ml-stage-usw2", "kind": "operator_paused_too_long",
             "object_ref": "Deployment hyperpod-inference-operator", "endpoint": None, "lob": None, "field": None}
    history.drift.sync("ml-stage-usw2", [still], dk)
    history.runs.end(dk, "success", {})
    failed = "kvfleet_curvine_upgrade/manual__2026-11-30T13:00:00+00:00"
    history.runs.start(failed, dag_id="kvfleet_curvine_upgrade", run_id=failed.split("/", 1)[1], trigger="manual",
                      triggered_by="bob", params={})
    history.runs.end(failed, "failed", {})
    return {"rollout": rk, "sweep": sweep}


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory, airflow_db: bool) -> Iterator[Any]:
    """Airflow's SimpleAuthManager with two users whose passwords are known, initialised as the API server does
    (on a migrated metadata database: token revocation is checked there)."""
    with simple_auth_manager(tmp_path_factory.mktemp("auth"), JWT_SECRET, "alice:viewer",
                             {"alice": "alice-pw", "nobody": "nobody-pw"}) as manager:
        yield manager


def _token(manager: Any, user: str, role: str | None) -> str:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return str(manager.generate_jwt(SimpleAuthManagerUser(username=user, role=role)))


@pytest.fixture
def client(history: Any, auth: Any) -> Iterator[Any]:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from kvfleet.airflow.ui.app import create_app

    root = FastAPI()
    root.mount("/kvfleet", create_app(lambda: history))
    with TestClient(root, base_url="http://127.0.0.1:8080") as c:
        yield c


@pytest.fixture
def seeded(history: Any) -> dict[str, Any]:
    return seed_history(history)


@pytest.fixture
def alice(auth: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {_token(auth, 'alice', 'viewer')}"}


def test_no_data_without_a_user(client: Any, seeded: dict[str, Any], auth: Any) -> None:
    for path in ("/kvfleet/api/fleet", "/kvfleet/api/runs", "/kvfleet/api/queries", "/kvfleet/api/queries/recent_runs"):
        resp = client.get(path)
        assert resp.status_code == 401, (path, resp.text)
        assert "rows" not in resp.text and "retail" not in resp.text
    page = client.get("/kvfleet/fleet", follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"].startswith("/auth/login?next=")
    assert "kvfleet%2Ffleet" in page.headers["location"]
    forged = _token(auth, "alice", "viewer")[:-4] + "AAAA"
    assert client.get("/kvfleet/api/fleet", headers={"Authorization": f"Bearer {forged}"}).status_code == 403
    # a token signed with another secret is refused too
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    other = JWTGenerator(secret_key="not-the-secret-" + "0123456789abcdef" * 4, valid_for=60, audience="apache-airflow")
    assert client.get("/kvfleet/api/fleet",
                      headers={"Authorization": f"Bearer {other.generate({'sub': 'alice', 'role': 'admin'})}"}
                      ).status_code in (401, 403)


def test_a_user_without_a_role_may_not_read(client: Any, seeded: dict[str, Any], auth: Any) -> None:
    resp = client.get("/kvfleet/api/fleet", headers={"Authorization": f"Bearer {_token(auth, 'nobody', None)}"})
    assert resp.status_code == 403
    assert "may not read DAG runs" in resp.json()["detail"]


def test_the_ui_cookie_is_accepted(client: Any, seeded: dict[str, Any], auth: Any) -> None:
    client.cookies.set("_token", _token(auth, "alice", "viewer"))
    try:
        page = client.get("/kvfleet/fleet")
    finally:
        client.cookies.clear()
    assert page.status_code == 200
    assert "signed in as alice" in page.text


def test_fleet_json_and_filters(client: Any, seeded: dict[str, Any], alice: dict[str, str], history: Any) -> None:
    data = client.get("/kvfleet/api/fleet", headers=alice).json()
    assert data["view"] == "fleet" and data["endpoints"] == 3
    rows = {(e["cluster"], e["endpoint"]): e for c in data["clusters"] for g in c["lobs"] for e in g["endpoints"]}
    newest = {}
    for v in sorted(history.queries.rows("verifications", cutoff=EPOCH, lob=None, endpoint=None), key=lambda r: r["at"]):
        newest[(v["cluster"], v["endpoint"])] = v
    for key, row in rows.items():
        assert row["last_verdict"] == newest[key]["verdict"]
        assert row["speedup"] == pytest.approx(newest[key]["speedup"])
    assert rows[("ml-prod-use1", "retail/retail-search-rag")]["speedup"] == pytest.approx(2.69)  # the sweep's last
    assert rows[("ml-prod-use1", "support/support-chat")]["l2_state"] == "applied"  # drift resolved
    assert rows[("ml-prod-use1", "support/support-chat")]["last_verdict"] == "degraded"
    assert data["open_drift"] == 0  # the operator finding is cluster-wide, not an endpoint's
    only = client.get("/kvfleet/api/fleet", params={"lob": "payments"}, headers=alice).json()
    assert [e["endpoint"] for c in only["clusters"] for g in c["lobs"] for e in g["endpoints"]] == [
        "payments/payments-fraud"]
    assert client.get("/kvfleet/api/fleet", params={"cluster": "nope"}, headers=alice).json()["endpoints"] == 0


def test_trends_plot_the_sweep_against_the_published_curve(client: Any, seeded: dict[str, Any],
                                                           alice: dict[str, str]) -> None:
    params = {"cluster": "ml-prod-use1", "endpoint": "retail/retail-search-rag", "since": "3650d"}
    data = client.get("/kvfleet/api/trends", params=params, headers=alice).json()
    assert data["instance_type"] == "ml.g5.4xlarge"
    assert data["published"]["points"] == [[500, 0.99], [1000, 1.7], [2500, 2.7]]
    assert {s["prompt_tokens"]: s["speedup"] for s in data["sweep"]} == seeded["sweep"]
    assert len(data["verifications"]) == 7
    html = client.get("/kvfleet/trends", params=params, headers=alice).text
    assert 'id="plot-sweep"' in html and 'data-series="published points"' in html
    assert 'data-x="2500" data-y="2.7"' in html and 'data-x="2500" data-y="2.62"' in html
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_every_view_answers_json_and_html(client: Any, seeded: dict[str, Any], alice: dict[str, str],
                                          history: Any) -> None:
    from kvfleet.airflow.ui.pages import VIEWS

    for view in VIEWS:
        data = client.get(f"/kvfleet/api/{view}", params={"since": "3650d"}, headers=alice)
        assert data.status_code == 200, (view, data.text)
        assert data.json()["view"] == view
        page = client.get(f"/kvfleet/{view}", params={"since": "3650d"}, headers=alice)
        assert page.status_code == 200, view
        assert ("<svg" in page.text) == (view in ("drift", "curvine")), view  # trends: pick an endpoint first
    runs = client.get("/kvfleet/api/runs", params={"since": "3650d"}, headers=alice).json()
    cli = history.queries.rows("recent_runs", cutoff=EPOCH, limit=500)
    assert [(r["run_key"], r["status"]) for r in runs["runs"]] == [(r["run_key"], r["status"]) for r in cli]
    assert runs["statuses"] == {"failed": 1, "success": 3}
    gates = client.get("/kvfleet/api/gates", params={"since": "3650d"}, headers=alice).json()
    human = [g for g in gates["rows"] if g.get("chosen")]
    assert len(human) == 1 and human[0]["chosen"] == "Approve"
    assert human[0].get("decided_by", human[0].get("answered_by")) == "alice"
    if gates["source"] == "gate_decisions":  # the automatic gates are listed beside the human decisions
        assert sorted(s["outcome"] for s in gates["steps"]) == ["continue", "passed", "passed", "review"]
    drift = client.get("/kvfleet/api/drift", params={"since": "3650d"}, headers=alice).json()
    assert drift["per_cluster"]["ml-prod-use1"] == {"seen": 1, "open": 0, "resolved": 1, "remediated": 1,
                                                     "remediation_refused": 0, "remediation_failed": 0}
    assert drift["per_cluster"]["ml-stage-usw2"]["open"] == 1
    curvine = client.get("/kvfleet/api/curvine", params={"cluster": "ml-prod-use1"}, headers=alice).json()
    [c] = curvine["curvine"]
    assert [(r["revision"], r["format_master"]) for r in c["releases"]] == [(1, True), (2, False)]
    assert [r["capacity_bytes"] for r in c["capacity"]] == [200 * 2**30, 300 * 2**30]


def test_named_queries_plug_in_and_bad_filters_are_400s(client: Any, seeded: dict[str, Any],
                                                       alice: dict[str, str]) -> None:
    listed = {q["name"]: q for q in client.get("/kvfleet/api/queries", headers=alice).json()["queries"]}
    assert listed["verifications"]["parameters"] == ["cutoff", "lob", "endpoint"]
    assert {"ui_fleet", "ui_gate_steps", "recent_runs"} <= set(listed)
    rows = client.get("/kvfleet/api/queries/verifications", params={"lob": "payments", "since": "3650d"},
                      headers=alice).json()["rows"]
    assert [r["endpoint"] for r in rows] == ["payments/payments-fraud"]
    bad = client.get("/kvfleet/api/runs", params={"since": "yesterday"}, headers=alice)
    assert bad.status_code == 400 and "since" in bad.json()["detail"] and "7d" in bad.json()["detail"]
    bad = client.get("/kvfleet/api/runs", params={"limit": "0"}, headers=alice)
    assert bad.status_code == 400 and "limit" in bad.json()["detail"] and "1 to 5000" in bad.json()["detail"]
    missing = client.get("/kvfleet/api/queries/..%2Fmigrations%2F0001_initial.up", headers=alice)
    assert missing.status_code == 404
    assert client.get("/kvfleet/api/queries/no_such_query", headers=alice).status_code == 404


def test_the_plugin_mounts_the_app_and_links_it_from_the_navigation() -> None:
    from fastapi import FastAPI

    from kvfleet.airflow.plugin import KvfleetPlugin

    [app] = KvfleetPlugin.fastapi_apps
    assert app["url_prefix"] == "/kvfleet" and isinstance(app["app"], FastAPI)
    [view] = KvfleetPlugin.external_views
    assert view["href"] == "kvfleet/fleet" and view["destination"] == "nav" and view["url_route"] == "kvfleet"
    # the UI's plugin serializer accepts the entry as Airflow 3.3 defines it
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    assert ExternalViewResponse.model_validate(view).href == "kvfleet/fleet"


def test_lob_colours_are_fixed_per_lob() -> None:
    from kvfleet.airflow.ui.svg import PALETTE, LobColours

    a, b = LobColours(["retail", "payments", "support"]), LobColours(["support", "retail", "payments", None])
    assert [a(x) for x in ("payments", "retail", "support")] == list(PALETTE[:3])
    assert all(a(x) == b(x) for x in ("payments", "retail", "support", "unknown-lob"))


def test_sql_files_bind_only_named_parameters() -> None:
    from kvfleet.airflow.ui import catalog

    for name in catalog.available():
        if name.startswith("ui_"):
            text = (catalog.queries_dir() / f"{name}.sql").read_text()
            assert text.startswith("--"), f"{name}.sql starts with a comment saying what it answers"
    assert catalog.bind_names("ui_fleet") == ["clusters", "lob"]  # a cluster filter asks for its key and older name
    assert Path(catalog.queries_dir()).is_dir()
    assert catalog.Filters().cutoff(EPOCH + timedelta(days=30)) == EPOCH  # 30 days back by default
    assert catalog.Filters.from_query({"since": "12h"}).cutoff(EPOCH) == EPOCH - timedelta(hours=12)


def test_the_drift_view_pages_its_findings(client: Any, seeded: dict[str, Any], alice: dict[str, str],
                                          history: Any) -> None:
    """The drift view lists one page of findings (limit) with its per-cluster counts over all of them; the page's
    next link, followed, gives the rest; a cursor that is not one is a 400 naming after."""
    import re
    from html import unescape

    every = history.queries.rows("drift_since", cutoff=EPOCH)
    first = client.get("/kvfleet/api/drift", params={"since": "3650d", "limit": "1"}, headers=alice).json()
    assert len(first["findings"]) == 1 and first["next"]
    assert sum(c["seen"] for c in first["per_cluster"].values()) == len(every) == 2
    html = client.get("/kvfleet/drift", params={"since": "3650d", "limit": "1"}, headers=alice).text
    (href,) = set(re.findall(r'<a class="next" rel="next" href="([^"]+)"', html))
    second = client.get(unescape(href).replace("/kvfleet/drift", "/kvfleet/api/drift"), headers=alice).json()
    assert second["next"] is None and len(second["findings"]) == 1
    assert sorted(r["object_ref"] for r in first["findings"] + second["findings"]) == sorted(
        r["object_ref"] for r in every)
    page2 = client.get(unescape(href), headers=alice).text
    assert second["findings"][0]["kind"] in page2.split('id="drift-findings"')[1] and 'class="first"' in page2
    bad = client.get("/kvfleet/api/drift", params={"after": "nope"}, headers=alice)
    assert bad.status_code == 400 and "after: 'nope' is not a cursor of the drift list" in bad.text


def test_red_rows_link_to_the_runbook_which_the_page_serves(client: Any, seeded: dict[str, Any],
                                                            alice: dict[str, str]) -> None:
    import re

    from kvfleet.airflow.gates import RUNBOOK_ANCHORS

    drift = client.get("/kvfleet/drift", params={"since": "3650d"}, headers=alice).text
    rows = re.findall(r"<tr>(.*?)</tr>", drift)
    [paused] = [r for r in rows if "operator_paused_too_long" in r]  # open, high: red
    assert f'href="/kvfleet/runbook#{RUNBOOK_ANCHORS["drift"]}"' in paused
    [resolved] = [r for r in rows if "patch_lost_to_reconcile" in r]  # resolved and remediated: no call to act
    assert "/kvfleet/runbook" not in resolved
    runs = re.findall(r"<tr>(.*?)</tr>", client.get("/kvfleet/runs", params={"since": "3650d"}, headers=alice).text)
    [failed] = [r for r in runs if "kvfleet_curvine_upgrade" in r]
    assert f'href="/kvfleet/runbook#{RUNBOOK_ANCHORS["curvine_upgrade"]}"' in failed
    assert all("/kvfleet/runbook" not in r for r in runs if 'data-value="success"' in r)
    book = client.get("/kvfleet/runbook", headers=alice)
    assert book.status_code == 200
    for anchor in RUNBOOK_ANCHORS.values():  # every link the page and the gates make lands on a heading
        assert f'id="{anchor}"' in book.text
    assert "<table>" in book.text and "<script" not in book.text
    assert client.get("/kvfleet/runbook", follow_redirects=False).status_code == 303  # no user: to the login


def test_pending_gates_show_their_evidence_and_link_to_airflows_answer_page(history: Any, auth: Any,
                                                                            seeded: dict[str, Any],
                                                                            alice: dict[str, str]) -> None:
    import re

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from kvfleet.airflow.gates import wave_gate_text
    from kvfleet.airflow.hitl import PendingGate
    from kvfleet.airflow.ui.app import create_app

    rk = seeded["rollout"]
    run_id = rk.split("/", 1)[1]
    text = wave_gate_text(asked="ask_review", run_key=rk, reason="verification inconclusive",
                          wave={"cluster": "ml-prod-use1", "waves": [0], "review": ["support/support-chat"],
                                "endpoints": {"support/support-chat": "degraded — slow warm TTFT"}},
                          verifications=history.queries.rows("verifications", cutoff=EPOCH, lob=None,
                                                      endpoint="support/support-chat"),
                          open_drift=history.queries.rows("open_drift"))
    gate = PendingGate("kvfleet_rollout", run_id, "cluster.gate_0", 0, text.subject, text.body,
                       ["Approve", "Skip endpoint", "Abort"])
    root = FastAPI()
    root.mount("/kvfleet", create_app(lambda: history, lambda: [gate]))
    with TestClient(root, base_url="http://127.0.0.1:8080") as c:
        data = c.get("/kvfleet/api/gates", headers=alice).json()
        html = c.get("/kvfleet/gates", headers=alice).text
    [pending] = data["pending"]
    assert pending["subject"] == text.subject and pending["run_key"] == rk
    answer = (f"/dags/kvfleet_rollout/runs/{run_id.replace(':', '%3A').replace('+', '%2B')}/tasks/cluster.gate_0"
              "/mapped/0/required_actions")
    assert pending["required_actions"] == answer
    # the evidence: the run's newest verification of every endpoint, per cluster, with the figures of the history
    verifs = {(v["cluster"], v["endpoint"]): v for v in history.queries.rows("verifications", cutoff=EPOCH, lob=None,
                                                                      endpoint=None) if v["run_key"] == rk}
    for (cluster, endpoint), v in verifs.items():
        assert f"#### {cluster}: verifications of this run" in pending["evidence"]
        [line] = [x for x in pending["evidence"].splitlines() if x.startswith(f"| `{endpoint}` |")]
        assert f"| {v['hit_ratio']:.2f} | {v['speedup']:.2f}×" in line
    assert "operator_paused_too_long" in pending["evidence"]  # the open drift on ml-stage-usw2
    section = re.search(r'<section class="gate".*?</section>', html, re.S)
    assert section is not None
    assert f'href="{answer}"' in section[0] and 'target="_top"' in section[0]
    assert "<table>" in section[0] and "support/support-chat" in section[0]
    assert html.count("<h3>") >= 1 and text.subject.split(" — ")[0] in html


def test_the_gates_view_survives_airflows_database_failing(history: Any, auth: Any, seeded: dict[str, Any],
                                                           alice: dict[str, str]) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from kvfleet.airflow.ui.app import create_app

    def broken() -> list[Any]:
        raise ConnectionError("metadata database down")

    root = FastAPI()
    root.mount("/kvfleet", create_app(lambda: history, broken))
    with TestClient(root, base_url="http://127.0.0.1:8080") as c:
        page = c.get("/kvfleet/gates", params={"since": "3650d"}, headers=alice)
    assert page.status_code == 200
    assert "could not be read from Airflow (ConnectionError)" in page.text and "Human decisions" in page.text


def test_no_gate_waiting_reads_airflows_hitl_records(client: Any, seeded: dict[str, Any],
                                                     alice: dict[str, str]) -> None:
    data = client.get("/kvfleet/api/gates", headers=alice).json()
    assert data["pending"] == [] and "pending_error" not in data
    assert "No gate is waiting." in client.get("/kvfleet/gates", headers=alice).text


def test_with_no_history_configured_the_page_is_a_503_naming_the_cause(auth: Any, alice: dict[str, str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The history fails closed: the page's default factory (the configured history) refuses, and the page says
    why instead of a bare 500."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from kvfleet.airflow.ui.app import create_app

    monkeypatch.delenv("KVFLEET_HISTORY_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_KVFLEET_HISTORY", raising=False)
    root = FastAPI()
    root.mount("/kvfleet", create_app())
    with TestClient(root, base_url="http://127.0.0.1:8080") as c:
        for path in ("/kvfleet/api/runs", "/kvfleet/runs"):
            resp = c.get(path, headers=alice)
            assert resp.status_code == 503, (path, resp.status_code, resp.text[:300])
            assert "no history database is configured" in resp.json()["detail"]
