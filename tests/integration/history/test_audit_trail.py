"""The trustworthy audit history on real PostgreSQL: terminal statuses, write-ahead records, gate decisions,
the hash chain and its roles, drift resolutions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from kvfleet.errors import GateRefused
from kvfleet.history import migrate
from kvfleet.history.db import OWNER_ROLE, WRITER_ROLE
from kvfleet.history.keys import StepEvent, StepKey
from kvfleet.history.repos import HistoryRepos
from kvfleet.outcomes import UNKNOWN, derive_status

pytestmark = pytest.mark.integration
WEEK_AGO = datetime.now(UTC) - timedelta(days=7)


def _run(h: HistoryRepos, key: str = "kvfleet_rollout/r1") -> StepKey:
    h.runs.start(key, dag_id=key.split("/")[0], run_id=key.split("/")[1], trigger="manual", triggered_by="alice",
                params={})
    h.runs.record_step(StepKey(key, "plan"), StepEvent("plan", "plan", "planned"))
    return StepKey(key, "cluster.wave_0", 0)


def _ep(h: HistoryRepos, key: StepKey, ep: str, outcome: str, **detail: Any) -> None:
    h.runs.record_step(key, StepEvent(f"endpoint:{ep}", "endpoint", outcome, cluster="c1", endpoint=ep, lob="retail",
                                 detail=detail))


# ---- terminal status ----------------------------------------------------------------------------------------


def test_a_clean_run_that_airflow_marks_success_is_success(history: HistoryRepos) -> None:
    key = _run(history)
    _ep(history, key, "retail/a", "changed")
    history.runs.end(key.run_key, "success", {"lobs": 1})
    assert history.runs.close(key.run_key, "success") == "success"
    run = history.runs.get(key.run_key)
    assert run is not None and run["status"] == "success" and run["ended_at"] is not None
    assert run["summary"]["lobs"] == 1 and run["summary"]["close"]["failures"] == 0  # the task's summary is kept


def test_failed_endpoints_and_skipped_waves_are_completed_with_failures_not_success(history: HistoryRepos) -> None:
    key = _run(history)
    _ep(history, key, "retail/a", "changed")
    _ep(history, key, "retail/b", "failed", reason="pods not ready")
    _ep(history, key, "retail/c", "refused", reason="worker env wrong")
    _ep(history, StepKey(key.run_key, "cluster.wave_1", 0), "retail/d", "skipped_by_gate")
    history.runs.end(key.run_key, "success")  # what finish wrote
    assert history.runs.close(key.run_key, "success") == "completed_with_failures"
    summary = history.runs.get(key.run_key)["summary"]["close"]  # type: ignore[index]
    assert (summary["failures"], summary["skipped"]) == (2, 1)


def test_a_run_airflow_marks_failed_is_failed_even_if_a_task_wrote_success(history: HistoryRepos) -> None:
    key = _run(history)
    _ep(history, key, "retail/a", "changed")
    history.runs.end(key.run_key, "success")
    assert history.runs.close(key.run_key, "failed", "task_failure (cluster.wave_1)") == "failed"
    run = history.runs.get(key.run_key)
    assert run["status"] == "failed" and run["reason"] == "task_failure (cluster.wave_1)"  # type: ignore[index]


def test_a_still_running_run_is_closed_failed_with_the_failed_step_as_reason(history: HistoryRepos) -> None:
    key = _run(history)
    history.runs.record_step(StepKey(key.run_key, "cluster.stages", 0), StepEvent(
        "error:cluster.stages", "run", "failed", detail={"error": "TemporaryError: UpdateCluster timed out"}))
    assert history.runs.get(key.run_key)["status"] == "running"  # type: ignore[index]
    assert history.runs.close(key.run_key, "failed") == "failed"
    assert history.runs.get(key.run_key)["reason"] == "TemporaryError: UpdateCluster timed out"  # type: ignore[index]


def test_a_gate_abort_is_aborted(history: HistoryRepos) -> None:
    key = _run(history)
    history.runs.record_step(StepKey(key.run_key, "cluster.gate_0", 0), StepEvent(
        "gate_response:cluster.gate_0", "gate", "abort", cluster="c1", detail={"chosen": "Abort"}), actor="bob")
    _ep(history, StepKey(key.run_key, "cluster.wave_1", 0), "retail/b", "aborted", reason="Abort by bob")
    assert history.runs.close(key.run_key, "failed") == "aborted"
    assert history.runs.get(key.run_key)["reason"] == "Abort by bob"  # type: ignore[index]


def test_a_plan_that_failed_before_start_run_gets_a_refused_row_with_its_reason(history: HistoryRepos) -> None:
    run_key = "kvfleet_rollout/manual__2026-01-01"
    assert history.runs.get(run_key) is None
    # what run_status.on_task_failure writes for the plan task (it opens the row)
    assert history.runs.ensure(run_key, trigger="manual", triggered_by="carol", params={"lobs": ["nope"]})
    history.runs.record_step(StepKey(run_key, "plan"), StepEvent("error:plan", "plan", "refused", detail={
        "error": "InventoryError: unknown LOB 'nope'"}))
    assert history.runs.close(run_key, "failed", "task_failure (plan)") == "refused"
    run = history.runs.get(run_key)
    assert run is not None
    assert (run["dag_id"], run["run_id"], run["status"], run["reason"], run["triggered_by"]) == (
        "kvfleet_rollout", "manual__2026-01-01", "refused", "InventoryError: unknown LOB 'nope'", "carol")


def test_the_callback_alone_still_creates_the_row(history: HistoryRepos) -> None:
    run_key = "kvfleet_drift_check/scheduled__x"
    assert history.runs.close(run_key, "failed", "task_failure (scope)", failed_task="scope") == "failed"
    run = history.runs.get(run_key)
    assert run is not None and run["status"] == "failed" and run["reason"] == "task_failure (scope)"
    assert run["summary"]["close"]["created_by_callback"] is True


def test_a_refused_upgrade_is_refused(history: HistoryRepos) -> None:
    key = _run(history, "kvfleet_curvine_upgrade/m1")
    history.runs.record_step(key, StepEvent("overrides", "curvine-upgrade", "refused", cluster="c1",
                                       detail={"reason": "formatMaster=true would wipe the master"}))
    assert history.runs.close(key.run_key, "failed") == "refused"
    assert history.runs.get(key.run_key)["reason"] == "formatMaster=true would wipe the master"  # type: ignore[index]


def test_a_refused_drift_remediation_makes_the_run_red_not_refused(history: HistoryRepos) -> None:
    key = _run(history, "kvfleet_drift_check/d1")
    history.runs.record_step(key, StepEvent("drift_remediate:patch_endpoints:refused", "drift", "refused", cluster="c1"))
    assert history.runs.close(key.run_key, "success") == "completed_with_failures"


def test_derive_status_never_turns_failed_into_success() -> None:
    for steps in ([], [{"stage": "endpoint", "outcome": "changed", "endpoint": "a", "detail": {}}]):
        assert derive_status("failed", steps)[0] == "failed"
    with pytest.raises(ValueError, match="airflow_state"):
        derive_status("running", [])


# ---- write-ahead records ------------------------------------------------------------------------------------


def test_write_ahead_records_intent_then_outcome_and_an_orphan_reads_unknown(history: HistoryRepos) -> None:
    key = _run(history)
    with history.audit.write_ahead(key, "apply_iec", "InferenceEndpointConfig retail/a", {"generation": 3},
                             cluster="c1", endpoint="retail/a") as wa:
        wa.detail = {"resourceVersion": "42"}
    with pytest.raises(GateRefused), history.audit.write_ahead(key, "apply_iec", "InferenceEndpointConfig retail/b",
                                                         cluster="c1", endpoint="retail/b"):
        raise GateRefused("worker env wrong")
    # a worker killed between the intent and the outcome: only the intent
    orphan = history.audit.intent(key, "apply_iec", "InferenceEndpointConfig retail/c", cluster="c1", endpoint="retail/c")
    assert history.audit.intent(key, "apply_iec", "InferenceEndpointConfig retail/c", cluster="c1",
                          endpoint="retail/c") == orphan  # a retried task gets the same intent back
    rows = {r["endpoint"]: r for r in history.queries.rows("write_ahead", cutoff=WEEK_AGO, run_key=key.run_key,
                                                     cluster=None, endpoint=None, limit=50)}
    assert {e: r["outcome"] for e, r in rows.items()} == {
        "retail/a": "changed", "retail/b": "refused", "retail/c": UNKNOWN}
    assert [i["id"] for i in history.audit.open_intents(cluster="c1")] == [orphan]
    # the run is closed honestly: a change nobody knows the fate of is not a success
    assert history.runs.close(key.run_key, "success") == "completed_with_failures"
    # the next run looks at the live object and resolves it
    history.audit.resolve_intent(orphan, {"spec.kvCache": "present"}, run_key="kvfleet_drift_check/d2")
    assert history.audit.open_intents(cluster="c1") == []


def test_audit_endpoint_shows_the_changes_of_a_failed_wave(history: HistoryRepos) -> None:
    key = _run(history)
    for ep in ("retail/a", "retail/b", "retail/c"):
        with history.audit.write_ahead(key, "apply_iec", f"InferenceEndpointConfig {ep}", cluster="c1", endpoint=ep):
            pass
    with pytest.raises(RuntimeError), history.audit.write_ahead(key, "scale_down", "deployment retail/a", cluster="c1",
                                                          endpoint="retail/a"):
        raise RuntimeError("API server gone")
    history.runs.close(key.run_key, "failed")
    rows = history.queries.rows("endpoint_changes", endpoint="a", cutoff=WEEK_AGO)
    assert {(r["step"], r["outcome"], r["run_status"]) for r in rows} == {
        ("apply_iec InferenceEndpointConfig retail/a", "changed", "failed"),
        ("scale_down deployment retail/a", "failed", "failed")}


# ---- gate decisions -----------------------------------------------------------------------------------------


def test_gate_decisions_name_the_responder_the_verifications_and_the_wait(history: HistoryRepos) -> None:
    key = _run(history)
    wave = StepKey(key.run_key, "cluster.wave_0", 0)
    history.verifications.record(wave, "verify:0:retail/a", {"cluster": "c1", "endpoint": "retail/a",
                                                           "verdict": "degraded", "hit_ratio": 1.0, "speedup": 1.4})
    history.runs.record_step(wave, StepEvent("gate:0", "gate", "review", cluster="c1",
                                        detail={"verdicts": {"retail/a": "degraded"}}))
    history.runs.record_step(StepKey(key.run_key, "cluster.gate_0", 0), StepEvent(
        "gate_response:cluster.gate_0", "gate", "continue", cluster="c1",
        detail={"chosen": "Approve", "asked": "ask_review", "waves": [0]}), actor="dana")
    other = _run(history, "kvfleet_rollout/r2")
    history.runs.record_step(StepKey(other.run_key, "cluster.gate_1", 0), StepEvent(
        "gate_response:cluster.gate_1", "gate", "abort", cluster="c1",
        detail={"chosen": "Reject", "asked": "ask_approval", "waves": [1]}), actor="timeout")
    rows = history.queries.rows("gate_decisions", cutoff=WEEK_AGO, run_key=None, limit=50)
    by_run = {r["run_key"]: r for r in rows}
    approve = by_run[key.run_key]
    assert (approve["answered_by"], approve["chosen"], approve["decision"], approve["timed_out"]) == (
        "dana", "Approve", "continue", False)
    assert approve["verifications"]["retail/a"]["verdict"] == "degraded" and approve["wave_verdict"] == "review"
    assert approve["waited_s"] is not None and approve["waited_s"] >= 0
    timeout = by_run[other.run_key]
    assert (timeout["answered_by"], timeout["timed_out"], timeout["chosen"]) == ("timeout", True, "Reject")
    only = history.queries.rows("gate_decisions", cutoff=WEEK_AGO, run_key=other.run_key, limit=50)
    assert [r["run_key"] for r in only] == [other.run_key]


# ---- drift -------------------------------------------------------------------------------------------------


def test_remediated_findings_are_resolved_by_the_run_and_show_the_remediation(history: HistoryRepos) -> None:
    f = {"fingerprint": "c1|patch_lost|retail/a", "kind": "patch_lost_to_reconcile", "severity": "high",
         "object_ref": "deployment/a", "field": "volumes", "expected": "l2", "actual": "none", "endpoint": "retail/a"}
    history.drift.sync("c1", [f], "d1")
    history.drift.record_remediation(f["fingerprint"], {"action": "patch_endpoints", "outcome": "changed"})
    (row,) = history.queries.rows("open_drift")
    assert (row["remediation_action"], row["remediation_outcome"]) == ("patch_endpoints", "changed")
    assert history.drift.resolve_remediated("c1", [f["fingerprint"], "c1|other"], "d1") == 1
    assert history.queries.rows("open_drift") == []
    (row,) = history.queries.rows("drift_since", cutoff=WEEK_AGO)
    assert (row["resolution"], row["remediation_outcome"]) == ("remediated", "changed")


# ---- tamper evidence ----------------------------------------------------------------------------------------


@pytest.fixture
def two_roles(pg) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """A fresh database owned by the owner role, migrated as the owner; (owner URL, writer URL)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    pg.ensure_database(name)
    admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" OWNER TO {OWNER_ROLE}'))
    owner = pg.url(name, OWNER_ROLE)
    engine = create_engine(owner)
    migrate.upgrade(engine)
    engine.dispose()
    yield owner, pg.url(name, WRITER_ROLE)
    from kvfleet.history.db import dispose_engines

    dispose_engines()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_the_chain_verifies_and_an_owner_update_with_the_trigger_disabled_is_named(
        two_roles: tuple[str, str]) -> None:
    owner_url, writer_url = two_roles
    history = HistoryRepos.on(create_engine(writer_url))
    key = _run(history)
    for ep in ("retail/a", "retail/b", "retail/c"):
        _ep(history, key, ep, "changed")
    result = history.audit.verify_chain()
    assert result["ok"] and result["rows"] == 3 and result["head"]["seq"] == 3
    with history.engine.connect() as conn:
        victim = conn.execute(text("SELECT id FROM audit_log WHERE seq = 2")).scalar_one()
    owner = create_engine(owner_url)
    with owner.begin() as conn:
        conn.execute(text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only"))
        conn.execute(text("UPDATE audit_log SET actor = 'mallory' WHERE id = :i"), {"i": victim})
        conn.execute(text("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only"))
    result = history.audit.verify_chain()
    assert not result["ok"] and result["broken"]["id"] == victim and "changed" in result["broken"]["problem"]
    # a deleted row breaks the sequence at the row after it
    with owner.begin() as conn:
        conn.execute(text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only"))
        conn.execute(text("UPDATE audit_log SET actor = 'kvfleet' WHERE id = :i"), {"i": victim})  # put back
        conn.execute(text("DELETE FROM audit_log WHERE seq = 1"))
        conn.execute(text("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only"))
    broken = history.audit.verify_chain()["broken"]
    assert broken["seq"] == 2 and "sequence" in broken["problem"]
    owner.dispose()
    history.engine.dispose()


@pytest.mark.parametrize("statement", [
    "TRUNCATE audit_log",
    "ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only",
    "ALTER TABLE audit_log DISABLE TRIGGER ALL",
    "DROP TRIGGER audit_log_append_only ON audit_log",
    "DROP TRIGGER audit_log_chain ON audit_log",
    "UPDATE audit_log SET actor = 'mallory'",
    "DELETE FROM audit_log",
    "ALTER TABLE audit_log ADD COLUMN x int",
    "UPDATE kvfleet_alembic_version SET version_num = 'x'",
])
def test_the_writer_role_cannot_remove_or_rewrite_the_audit_log(two_roles: tuple[str, str], statement: str) -> None:
    _, writer_url = two_roles
    history = HistoryRepos.on(create_engine(writer_url))
    _ep(history, _run(history), "retail/a", "changed")  # the writer can write
    with pytest.raises(DBAPIError, match="permission denied|must be owner|append-only"), \
            history.engine.begin() as conn:
        conn.execute(text(statement))
    with history.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM audit_log")).scalar_one() == 1
    history.engine.dispose()


def test_a_writer_cannot_forge_the_chain_fields(two_roles: tuple[str, str]) -> None:
    _, writer_url = two_roles
    history = HistoryRepos.on(create_engine(writer_url))
    with history.engine.begin() as conn:
        conn.execute(text("INSERT INTO audit_log (event_key, actor, action, seq, prev_hash, row_hash) "
                          "VALUES ('forged', 'mallory', 'x', 99, 'aa', 'bb')"))
    assert history.audit.verify_chain()["ok"]
    history.engine.dispose()
