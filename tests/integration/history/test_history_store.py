"""The history store on real PostgreSQL: migrations, idempotent writes, append-only audit, drift life cycle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import InternalError

from kvfleet.fleet import constants as C
from kvfleet.history import migrate
from kvfleet.history.keys import StepEvent, StepKey
from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration

TABLES = {"runs", "step_events", "curvine_releases", "drift_findings", "hit_verifications", "capacity_snapshots",
          "audit_log", "cluster_locks"}


def test_migrations_from_empty_then_down_and_up_again(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    assert migrate.current_revision(engine) is None
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert set(inspect(engine).get_table_names()) >= TABLES
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    assert not TABLES & set(inspect(engine).get_table_names())
    migrate.upgrade(engine)
    assert set(inspect(engine).get_table_names()) >= TABLES
    engine.dispose()


def _open(h: HistoryRepos, key: str = "kvfleet_rollout/r1") -> StepKey:
    h.runs.start(key, dag_id="kvfleet_rollout", run_id="r1", trigger="manual", triggered_by="alice",
                params={"fleet": "f.yaml"})
    return StepKey(key, "cluster.stage1", 0)


def test_a_retried_step_writes_one_row_and_one_audit_line(history: HistoryRepos) -> None:
    key = _open(history)
    ev = StepEvent(step="tiered_storage", stage="tiered_storage", outcome="changed", cluster="c1",
                   detail={"json_with_colon": "a:2", "ratio": "1:2"})
    assert history.runs.record_step(key, ev) is True
    assert history.runs.record_step(key, ev) is False  # the retry
    assert history.runs.record_step(StepKey(key.run_key, key.task_id, 1), ev) is True  # another map index
    assert len(history.runs.steps(key.run_key)) == 2
    with history.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM audit_log")).scalar() == 2
        detail = conn.execute(text("SELECT detail FROM step_events LIMIT 1")).scalar()
    assert detail["json_with_colon"] == "a:2"


def test_audit_log_is_append_only(history: HistoryRepos) -> None:
    history.audit.record("k1", actor="bob", action="operator:paused", cluster="c1")
    with pytest.raises(InternalError, match="append-only"), history.engine.begin() as conn:
        conn.execute(text("UPDATE audit_log SET actor = 'mallory'"))
    with pytest.raises(InternalError, match="append-only"), history.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_log"))


def test_verification_retry_is_idempotent(history: HistoryRepos) -> None:
    key = _open(history)
    result = {"cluster": "c1", "endpoint": "retail/chat", "lob": "retail", "verdict": "pass", "hit_ratio": 1.0}
    assert history.verifications.record(key, "verify", result)
    assert not history.verifications.record(key, "verify", result)
    rows = history.queries.rows("verifications", cutoff=datetime.now(UTC) - timedelta(days=1), lob="retail", endpoint=None)
    assert [r["verdict"] for r in rows] == ["pass"]


def test_drift_opens_touches_and_resolves(history: HistoryRepos) -> None:
    f = {"fingerprint": "c1|operator_paused|op", "kind": "operator_paused", "severity": "critical",
         "object_ref": "deployment/op", "field": "spec.replicas", "expected": "1", "actual": "0"}
    assert history.drift.sync("c1", [f], "run1") == {"opened": 1, "still_open": 0, "resolved": 0}
    assert history.drift.sync("c1", [f], "run2") == {"opened": 0, "still_open": 1, "resolved": 0}
    (row,) = history.queries.rows("open_drift")
    assert row["kind"] == "operator_paused" and row["first_seen"] <= row["last_seen"]
    assert history.drift.sync("c1", [], "run3") == {"opened": 0, "still_open": 0, "resolved": 1}
    assert history.queries.rows("open_drift") == []
    # seen again later: a new finding, with a new first_seen
    assert history.drift.sync("c1", [f], "run4")["opened"] == 1


def test_recent_runs_counts_outcomes(history: HistoryRepos) -> None:
    key = _open(history)
    history.runs.record_step(key, StepEvent("a", "tiered_storage", "changed", cluster="c1"))
    history.runs.record_step(key, StepEvent("b", "curvine", "unchanged", cluster="c1"))
    history.runs.end(key.run_key, "success", {"ok": True})
    (run,) = history.queries.rows("recent_runs", cutoff=datetime.now(UTC) - timedelta(days=7), limit=10)
    assert (run["status"], run["changed"], run["unchanged"], run["triggered_by"]) == ("success", 1, 1, "alice")


def test_a_reinstalled_release_replaces_the_revision_it_reuses(history: HistoryRepos) -> None:
    """helm restarts at revision 1 after an uninstall: the row with the old "updated" time must not survive."""
    row = {"cluster": "c1", "namespace": "curvine", "release": "curvine", "revision": 1, "chart_version": "0.3.2",
           "run_key": None}
    history.curvine.record(**row, status="deployed", flags=dict.fromkeys(C.FORMAT_FLAGS, True),
                                   values={"cluster": {"formatMaster": True}}, helm_updated="2026-01-01T00:00:00Z")
    history.curvine.set_status(cluster="c1", namespace="curvine", release="curvine", revision=1,
                                       status="superseded")
    assert history.curvine.revisions("c1", "curvine", "curvine")[1]["status"] == "superseded"
    history.curvine.record(**row, status="deployed", flags=dict.fromkeys(C.FORMAT_FLAGS, False),
                                   values={"cluster": {"formatMaster": False}}, helm_updated="2026-02-01T00:00:00Z")
    assert history.curvine.revisions("c1", "curvine", "curvine") == {1: {
        "status": "deployed", "helm_updated": "2026-02-01T00:00:00Z", "flags": dict.fromkeys(C.FORMAT_FLAGS, False)}}


def test_cluster_plan_is_the_run_s_plan_cut_to_one_cluster(history: HistoryRepos) -> None:
    """A rollout's per-cluster tasks read their cluster's part of the plan from ``runs.plan`` (not the whole plan
    through XCom): the plan's other keys, and ``clusters`` holding that cluster's entry alone, as stored."""
    key = "kvfleet_rollout/cluster-plan"
    a = {"cluster": "a", "waves": [{"wave": "a-0", "index": 0, "kind": "canary", "endpoints": [{"ref": "r/x"}]}]}
    b = {"cluster": "b", "waves": [{"wave": "b-0", "index": 0, "kind": "wave", "endpoints": [{"ref": "s/y"}]}]}
    plan = {"clusters": [a, b], "wave_size": 3, "canary": True, "note": "ratio :2 in text"}
    history.runs.start(key, dag_id="kvfleet_rollout", run_id="cluster-plan", trigger="manual", triggered_by=None,
                      params={}, plan=plan)
    assert history.runs.cluster_plan(key, "b") == {"wave_size": 3, "canary": True, "note": "ratio :2 in text",
                                              "clusters": [b]}
    assert history.runs.cluster_plan(key, "a") == {**{k: v for k, v in plan.items() if k != "clusters"}, "clusters": [a]}
    assert history.runs.cluster_plan(key, "c") is None  # not in the plan
    assert history.runs.cluster_plan("kvfleet_rollout/no-such-run", "a") is None
    history.runs.start("kvfleet_rollout/no-plan", dag_id="kvfleet_rollout", run_id="no-plan", trigger="manual",
                      triggered_by=None, params={})
    assert history.runs.cluster_plan("kvfleet_rollout/no-plan", "a") is None
