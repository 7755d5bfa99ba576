"""``/kvfleet/metrics`` through FastAPI's TestClient, with Airflow's real auth manager (SimpleAuthManager) and a
history written through the repositories the product uses: two LOBs on two clusters.

What holds: no metrics without a valid Airflow user (401/403, never a login redirect: Prometheus cannot follow one),
an authenticated scrape parses with prometheus_client's own parser and its values are the seeded history's, the
per-endpoint series stop at the cap (the most recently verified kept) and ``kvfleet_metrics_truncated`` counts the
rest, Airflow's HITL records failing leaves the history's metrics in place, and every metric the Grafana dashboard
queries is one the scrape exports.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from airflow_auth import simple_auth_manager

pytestmark = [pytest.mark.integration]
JWT_SECRET = "kvfleet-metrics-test-secret-" + "0123456789abcdef" * 3
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kvfleet.json"
C1, C2 = "ml-prod-use1", "ml-stage-usw2"
ROLLOUT = "kvfleet_rollout/manual__2026-12-01T10:00:00+00:00"
ASKED_S = 300.0  # how long ago the pending gate was asked


def _verify(history: Any, key: Any, step: str, cluster: str, ep: str, lob: str, verdict: str, hit: float,
            speedup: float) -> None:
    history.verifications.record(key, step, {
        "cluster": cluster, "endpoint": ep, "lob": lob, "instance_type": "ml.g5.4xlarge", "prompt_tokens": 2000,
        "hit_ratio": hit, "ttft_cold_ms": 600.0, "ttft_warm_ms": 600.0 / speedup, "speedup": speedup,
        "expected_speedup": 2.3, "verdict": verdict})


def seed(history: Any) -> None:
    """Three endpoints of two LOBs on two clusters (retail/search on C1 verified twice: fail, then pass), a wave gate
    answered by a human, runs that succeeded, failed and still run, drift open on both clusters, a live lease on
    C1 and an expired one on C2, the operator paused on C2 and paused then restored on C1."""
    from kvfleet.history.keys import StepEvent, StepKey

    history.runs.start(ROLLOUT, dag_id="kvfleet_rollout", run_id=ROLLOUT.split("/", 1)[1], trigger="manual",
                       triggered_by="alice", params={})
    key = StepKey(ROLLOUT, "cluster.wave_0", 0)
    _verify(history, key, "verify:0:a", C1, "retail/search", "retail", "fail", 0.1, 1.0)
    _verify(history, key, "verify:0:b", C1, "support/chat", "support", "degraded", 0.5, 1.25)
    _verify(history, key, "verify:0:c", C2, "retail/recs", "retail", "pass", 1.0, 2.5)
    _verify(history, key, "verify:1:a", C1, "retail/search", "retail", "pass", 0.875, 2.4)
    history.runs.record_step(key, StepEvent("gate:0", "gate", "review", cluster=C1))
    history.runs.record_step(StepKey(ROLLOUT, "cluster.gate_0", 0), StepEvent(
        "gate_response:cluster.gate_0", "gate", "continue", cluster=C1,
        detail={"chosen": "Approve", "asked": "ask_review", "waves": [0]}), actor="alice")
    history.runs.record_step(key, StepEvent("operator_pause:x", "operator", "changed", cluster=C1))
    history.runs.record_step(key, StepEvent("operator_restore:x", "operator", "changed", cluster=C1))
    history.runs.record_step(key, StepEvent("operator_pause:y", "operator", "changed", cluster=C2))
    history.runs.end(ROLLOUT, "success", {})
    for dag, run, status in (("kvfleet_rollout", "manual__2", "failed"), ("kvfleet_curvine_upgrade", "manual__3",
                                                                           "failed"),
                             ("kvfleet_drift_check", "scheduled__4", None)):
        history.runs.start(f"{dag}/{run}", dag_id=dag, run_id=run, trigger="manual", triggered_by="bob", params={})
        if status:
            history.runs.end(f"{dag}/{run}", status, {})
    dk = "kvfleet_drift_check/scheduled__4"
    lost = {"kind": "patch_lost_to_reconcile", "severity": "high", "object_ref": "Deployment support/chat",
            "expected": "set", "actual": "missing", "lob": "support", "endpoint": "support/chat"}
    history.drift.sync(C1, [{**lost, "fingerprint": "lost:env", "field": "env"},
                            {**lost, "fingerprint": "lost:vol", "field": "volumes"}], dk)
    history.drift.sync(C2, [{**lost, "fingerprint": "paused:C2", "kind": "operator_paused_too_long", "lob": None,
                             "endpoint": None, "object_ref": "Deployment hyperpod-inference-operator"}], dk)
    history.leases.try_take(C1, ROLLOUT, "rollout", ttl_s=3600)
    history.leases.try_take(C2, "kvfleet_curvine_upgrade/manual__3", "curvine", ttl_s=1,
                            now=datetime.now(UTC) - timedelta(hours=1))


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory, airflow_db: bool) -> Iterator[Any]:
    """Airflow's SimpleAuthManager, initialised as the API server does (as in test_ui_api)."""
    with simple_auth_manager(tmp_path_factory.mktemp("auth"), JWT_SECRET, "prometheus:viewer",
                             {"prometheus": "prometheus-pw"}) as manager:
        yield manager


def _bearer(manager: Any, user: str, role: str | None) -> dict[str, str]:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return {"Authorization": f"Bearer {manager.generate_jwt(SimpleAuthManagerUser(username=user, role=role))}"}


def _pending() -> list[Any]:
    from kvfleet.airflow.hitl import PendingGate

    asked = datetime.now(UTC) - timedelta(seconds=ASKED_S)
    return [PendingGate("kvfleet_rollout", "manual__5", "cluster.gate_0", 0, "gate", None, ["Approve"], asked),
            PendingGate("kvfleet_rollout", "manual__6", "cluster.gate_0", 1, "gate", None, ["Approve"],
                        asked + timedelta(seconds=60))]


def _unreadable() -> list[Any]:
    raise RuntimeError("Airflow's metadata database is down")


def _client(history: Any, **kwargs: Any) -> Any:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from kvfleet.airflow.ui.app import create_app

    root = FastAPI()
    root.mount("/kvfleet", create_app(lambda: history, **kwargs))
    return TestClient(root, base_url="http://127.0.0.1:8080")


def scrape(client: Any, headers: dict[str, str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The scrape as {(sample name, sorted labels): value}, parsed by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = client.get("/kvfleet/metrics", headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain; version=")
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def series(samples: dict[tuple[str, Any], float], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def L(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


@pytest.fixture
def seeded(history: Any) -> Any:
    seed(history)
    return history


def test_no_metrics_without_a_user(seeded: Any, auth: Any) -> None:
    with _client(seeded, pending_factory=_pending) as client:
        anonymous = client.get("/kvfleet/metrics", follow_redirects=False)
        assert anonymous.status_code == 401, anonymous.text  # not a redirect to the login page
        assert "kvfleet_" not in anonymous.text
        forged = _bearer(auth, "prometheus", "viewer")["Authorization"][:-4] + "AAAA"
        assert client.get("/kvfleet/metrics", headers={"Authorization": forged}).status_code == 403
        no_role = client.get("/kvfleet/metrics", headers=_bearer(auth, "nobody", None))
        assert no_role.status_code == 403 and "may not read DAG runs" in no_role.json()["detail"]


def test_the_scrape_is_the_history(seeded: Any, auth: Any) -> None:
    with _client(seeded, pending_factory=_pending) as client:
        m = scrape(client, _bearer(auth, "prometheus", "viewer"))
    assert series(m, "kvfleet_runs_total") == {L(dag="kvfleet_rollout", status="success"): 1,
                                               L(dag="kvfleet_rollout", status="failed"): 1,
                                               L(dag="kvfleet_curvine_upgrade", status="failed"): 1}
    assert series(m, "kvfleet_runs_running") == {L(dag="kvfleet_drift_check"): 1}
    # gates: two waiting on the rollout, the older asked ASKED_S ago; one answered after its wave's gate step
    assert series(m, "kvfleet_gates_waiting") == {L(dag="kvfleet_rollout"): 2, L(dag="kvfleet_curvine_upgrade"): 0}
    oldest = series(m, "kvfleet_gate_oldest_waiting_seconds")
    assert ASKED_S <= oldest[L(dag="kvfleet_rollout")] < ASKED_S + 600 and oldest[L(dag="kvfleet_curvine_upgrade")] == 0
    assert m[("kvfleet_gates_readable", ())] == 1
    assert series(m, "kvfleet_gate_wait_seconds_count") == {L(cluster=C1, decision="continue"): 1}
    assert series(m, "kvfleet_gate_wait_seconds_sum")[L(cluster=C1, decision="continue")] >= 0
    # drift by cluster, kind and LOB
    assert series(m, "kvfleet_drift_open_findings") == {
        L(cluster=C1, kind="patch_lost_to_reconcile", lob="support"): 2,
        L(cluster=C2, kind="operator_paused_too_long", lob=""): 1}
    # each endpoint's newest verification; counts of latest and recorded verdicts per LOB
    search, chat, recs = L(cluster=C1, endpoint="retail/search", lob="retail"), \
        L(cluster=C1, endpoint="support/chat", lob="support"), L(cluster=C2, endpoint="retail/recs", lob="retail")
    assert series(m, "kvfleet_verification_latest_verdict") == {
        L(**dict(search), verdict="pass"): 1, L(**dict(chat), verdict="degraded"): 1, L(**dict(recs), verdict="pass"): 1}
    assert series(m, "kvfleet_hit_ratio") == {search: 0.875, chat: 0.5, recs: 1.0}
    assert series(m, "kvfleet_ttft_speedup") == {search: 2.4, chat: 1.25, recs: 2.5}
    assert series(m, "kvfleet_ttft_expected_speedup") == {search: 2.3, chat: 2.3, recs: 2.3}
    assert series(m, "kvfleet_endpoints_by_verdict") == {L(lob="retail", verdict="pass"): 2,
                                                         L(lob="retail", verdict="fail"): 0,
                                                         L(lob="support", verdict="degraded"): 1}
    assert series(m, "kvfleet_verifications_total") == {L(lob="retail", verdict="pass"): 2,
                                                        L(lob="retail", verdict="fail"): 1,
                                                        L(lob="support", verdict="degraded"): 1}
    assert m[("kvfleet_metrics_truncated", L(series="endpoint"))] == 0
    # leases: C1 live and held by the rollout, C2's ttl past
    assert series(m, "kvfleet_lease_held") == {L(cluster=C1, holder_dag="kvfleet_rollout"): 1,
                                               L(cluster=C2, holder_dag="kvfleet_curvine_upgrade"): 0}
    expiry = series(m, "kvfleet_lease_expiry_timestamp_seconds")
    assert expiry[L(cluster=C1, holder_dag="kvfleet_rollout")] > datetime.now(UTC).timestamp()
    # the operator: restored on C1, paused on C2
    assert series(m, "kvfleet_operator_paused") == {L(cluster=C1): 0, L(cluster=C2): 1}
    assert series(m, "kvfleet_operator_paused_seconds")[L(cluster=C1)] == 0
    assert series(m, "kvfleet_operator_paused_seconds")[L(cluster=C2)] >= 0


def test_endpoint_series_stop_at_the_cap(seeded: Any, auth: Any) -> None:
    with _client(seeded, pending_factory=_pending, metrics_endpoint_cap=2) as client:
        m = scrape(client, _bearer(auth, "prometheus", "viewer"))
    # the two most recently verified: retail/search (verified again last), then retail/recs
    assert set(series(m, "kvfleet_hit_ratio")) == {L(cluster=C1, endpoint="retail/search", lob="retail"),
                                                   L(cluster=C2, endpoint="retail/recs", lob="retail")}
    for name in ("kvfleet_verification_latest_verdict", "kvfleet_ttft_speedup",
                 "kvfleet_verification_timestamp_seconds"):
        assert len(series(m, name)) == 2, name
    assert m[("kvfleet_metrics_truncated", L(series="endpoint"))] == 1
    assert m[("kvfleet_metrics_endpoint_series_cap", ())] == 2
    # the per-LOB counts still count every endpoint
    assert sum(series(m, "kvfleet_endpoints_by_verdict").values()) == 3


def test_hitl_records_failing_keep_the_history_metrics(seeded: Any, auth: Any) -> None:
    with _client(seeded, pending_factory=_unreadable) as client:
        m = scrape(client, _bearer(auth, "prometheus", "viewer"))
    assert m[("kvfleet_gates_readable", ())] == 0
    assert not series(m, "kvfleet_gates_waiting")
    assert series(m, "kvfleet_drift_open_findings")


def test_the_dashboard_queries_only_exported_metrics(seeded: Any, auth: Any) -> None:
    with _client(seeded, pending_factory=_pending) as client:
        exported = {name for name, _ in scrape(client, _bearer(auth, "prometheus", "viewer"))}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in _panels(dashboard["panels"]) for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    assert len(exprs) >= 20
    queried = {name for e in exprs for name in re.findall(r"\bkvfleet_[a-z0-9_]+", e)}
    assert queried, exprs
    assert queried <= exported, sorted(queried - exported)
    # every metric family the scrape exports has a panel
    families = {re.sub(r"_(total|sum|count)$", "", n) for n in exported}
    shown = {re.sub(r"_(total|sum|count)$", "", n) for n in queried}
    assert families <= shown, sorted(families - shown)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def test_an_empty_history_scrapes(history: Any, auth: Any) -> None:
    with _client(history, pending_factory=list) as client:
        m = scrape(client, _bearer(auth, "prometheus", "viewer"))
    assert m[("kvfleet_metrics_truncated", L(series="endpoint"))] == 0
    assert series(m, "kvfleet_gates_waiting") == {L(dag="kvfleet_rollout"): 0, L(dag="kvfleet_curvine_upgrade"): 0}
    assert not series(m, "kvfleet_runs_total") and not series(m, "kvfleet_hit_ratio")
