"""The summaries kept at write time (revision 0008) and the keyset-paged queries, on real PostgreSQL: each
summary query returns what the full query it replaces returns over the same rows, through the product's own writes;
pages put together are the full listing; the writer role reads the summaries and cannot write them."""

from __future__ import annotations

import json
import math
import re
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

from kvfleet import cli
from kvfleet.airflow.ui import pages
from kvfleet.airflow.ui.catalog import Filters, QueryError
from kvfleet.airflow.ui.svg import LobColours
from kvfleet.history import migrate
from kvfleet.history.db import OWNER_ROLE, WRITER_ROLE
from kvfleet.history.keys import StepEvent, StepKey
from kvfleet.history.queries import decode_cursor, encode_cursor
from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration
NOW = datetime.now(UTC)

# What hit_stats_weekly and open_intents computed before revision 0008, over every row (the reference).
FULL_HIT_STATS = """
SELECT lob, date_trunc('week', at) AS week, COUNT(*) AS verifications,
       AVG(hit_ratio) AS avg_hit_ratio, AVG(speedup) AS avg_speedup,
       AVG(expected_speedup) AS avg_expected_speedup,
       COUNT(*) FILTER (WHERE verdict = 'pass') AS passed
FROM hit_verifications WHERE at >= :cutoff GROUP BY lob, week ORDER BY week DESC, lob
"""
FULL_OPEN_INTENTS = """
SELECT i.id FROM audit_log i WHERE i.kind = 'intent'
  AND NOT EXISTS (SELECT 1 FROM audit_log o WHERE o.intent_id = i.id) ORDER BY i.id
"""


def _rows(engine: Engine, sql: str, **binds: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(sql), binds).mappings()]


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Equal rows; averages to 1e-12 (a sum of sums rounds differently from one running sum)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.keys() != y.keys():
            return False
        for k in x:
            if isinstance(x[k], float) and isinstance(y[k], float):
                if not math.isclose(x[k], y[k], rel_tol=1e-12):
                    return False
            elif x[k] != y[k] or type(x[k]) is not type(y[k]):
                return False
    return True


def _verification(engine: Engine, at: datetime, lob: str | None, verdict: str, hit: float | None,
                  speedup: float | None, n: list[int]) -> None:
    n[0] += 1
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO hit_verifications (run_key, task_id, map_index, step, cluster, endpoint, lob, verdict, "
            "hit_ratio, speedup, expected_speedup, at) VALUES ('kvfleet_hit_verification/r', 'v', -1, :s, 'c1', "
            "'ns/e', :lob, :v, :h, :sp, 2.4, :at)"), {"s": f"verify:{n[0]}", "lob": lob, "v": verdict, "h": hit,
                                                     "sp": speedup, "at": at})


def test_hit_stats_weekly_from_the_buckets_equals_the_full_aggregate(history: HistoryRepos) -> None:
    engine = history.engine
    history.runs.start("kvfleet_hit_verification/r", dag_id="kvfleet_hit_verification", run_id="r",
                      trigger="schedule", triggered_by=None, params={})
    n = [0]
    for i in range(60):  # 40 days back, several per quarter hour, a NULL LOB and NULL figures among them
        at = NOW - timedelta(hours=16 * i, minutes=7 * i)
        _verification(engine, at, (None, "rag", "chat")[i % 3], ("pass", "fail")[i % 5 == 0],
                      None if i % 7 == 0 else 0.5 + i / 200, None if i % 11 == 0 else 2.0 + i / 100, n)
        _verification(engine, at + timedelta(minutes=3), "rag", "pass", 1.0, 2.5, n)
    # cutoffs inside a quarter hour, on one, and before everything
    cutoffs = [NOW - timedelta(days=30, minutes=4), NOW - timedelta(days=7),
               datetime(2026, 1, 5, 0, 15, tzinfo=UTC), NOW - timedelta(days=400)]
    for cutoff in cutoffs:  # rows in the quarter hour of each cutoff, on both sides of it
        _verification(engine, cutoff + timedelta(seconds=1), "chat", "pass", 0.9, 2.6, n)
        _verification(engine, cutoff - timedelta(seconds=1), "chat", "fail", 0.2, 1.1, n)
    for cutoff in cutoffs:
        assert _same(history.queries.rows("hit_stats_weekly", cutoff=cutoff), _rows(engine, FULL_HIT_STATS, cutoff=cutoff))
    with engine.begin() as conn:  # an owner's correction and deletion are followed too
        conn.execute(text("UPDATE hit_verifications SET hit_ratio = 0.1, lob = 'ads' WHERE id % 4 = 0"))
        conn.execute(text("DELETE FROM hit_verifications WHERE id % 9 = 0"))
    for cutoff in cutoffs:
        assert _same(history.queries.rows("hit_stats_weekly", cutoff=cutoff), _rows(engine, FULL_HIT_STATS, cutoff=cutoff))
    assert history.queries.rows("hit_stats_weekly", cutoff=NOW + timedelta(days=1)) == []


def _per_cluster(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """The kvfleet page's drift counts from every finding since the cutoff (what pages.drift_data computes)."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        c = out.setdefault(r["cluster"], {"seen": 0, "open": 0, "resolved": 0, "remediated": 0,
                                          "remediation_refused": 0, "remediation_failed": 0})
        c["seen"] += 1
        c["resolved" if r["resolved_at"] is not None else "open"] += 1
        outcome = (r.get("remediation") or {}).get("outcome")
        if outcome == "changed":
            c["remediated"] += 1
        elif outcome in ("refused", "failed"):
            c[f"remediation_{outcome}"] += 1
    return out


def _finding(fp: str, kind: str = "stale_pods") -> dict[str, Any]:
    return {"fingerprint": fp, "kind": kind, "severity": "high", "object_ref": f"Deployment/{fp}",
            "endpoint": f"ns/{fp}", "lob": "rag"}


def _seed_drift(history: HistoryRepos) -> None:
    """Findings on two clusters, remediated, refused, failed, resolved, spread over days, and in the UTC day of a
    cutoff on both sides of it."""
    engine = history.engine
    history.runs.start("kvfleet_drift_check/r", dag_id="kvfleet_drift_check", run_id="r", trigger="schedule",
                      triggered_by=None, params={})
    run = "kvfleet_drift_check/r"
    history.drift.sync("c1", [_finding(f"a{i}") for i in range(6)], run)
    history.drift.sync("c2", [_finding(f"b{i}") for i in range(3)], run)
    history.drift.record_remediation("a0", {"action": "safe_patch", "outcome": "changed"})
    history.drift.record_remediation("a1", {"action": "safe_patch", "outcome": "refused"})
    history.drift.record_remediation("b0", {"action": "safe_patch", "outcome": "failed"})
    history.drift.resolve_remediated("c1", ["a0"], run)
    history.drift.sync("c1", [_finding(f"a{i}") for i in range(1, 4)], run)  # a4, a5 gone; a1..a3 touched
    with engine.begin() as conn:  # spread last_seen over days, as weeks of checks would
        conn.execute(text("UPDATE drift_findings SET first_seen = now() - make_interval(days => id::int * 2, "
                          "hours => id::int), last_seen = now() - make_interval(days => id::int, hours => id::int)"))
        # findings in the UTC day of a cutoff, on both sides of it (the part read from the rows)
        conn.execute(text("UPDATE drift_findings SET last_seen = :t WHERE id IN (1, 2)"),
                     {"t": NOW - timedelta(days=4, hours=5) + timedelta(seconds=1)})
        conn.execute(text("UPDATE drift_findings SET last_seen = :t WHERE id = 3"),
                     {"t": NOW - timedelta(days=4, hours=5) - timedelta(seconds=1)})


DRIFT_CUTOFFS = (NOW - timedelta(days=30), NOW - timedelta(days=4, hours=5), NOW - timedelta(hours=1),
                 NOW - timedelta(days=3650))


def test_drift_summary_equals_the_counts_over_every_finding(history: HistoryRepos) -> None:
    _seed_drift(history)
    for cutoff in DRIFT_CUTOFFS:
        summary = {r.pop("cluster"): r for r in history.queries.rows("drift_summary", cutoff=cutoff, cluster=None)}
        assert summary == _per_cluster(history.queries.rows("drift_since", cutoff=cutoff))
        only = history.queries.rows("drift_summary", cutoff=cutoff, cluster="c2")
        assert [r["cluster"] for r in only] == (["c2"] if "c2" in summary else [])
    assert history.queries.rows("drift_summary", cutoff=NOW - timedelta(days=3650), cluster=None)[0]["remediated"] == 1


def _since(cutoff: datetime) -> str:
    """A page's ``since`` (whole seconds) that reaches back to ``cutoff`` or a little before it."""
    return f"{math.ceil((datetime.now(UTC) - cutoff).total_seconds() / 60) + 1}m"


@pytest.mark.parametrize("cluster", [None, "c1", "c2", "nope"])
def test_the_drift_view_counts_as_before_and_its_pages_are_every_finding(history: HistoryRepos,
                                                                         cluster: str | None) -> None:
    """The kvfleet page's drift view reads drift_summary and pages drift_page: its counts are those it computed
    from every finding (drift_since) before, and its pages, followed by their cursors, are every finding."""
    _seed_drift(history)
    for cutoff in DRIFT_CUTOFFS:
        since = _since(cutoff)
        every = [r for r in history.queries.rows("drift_since", cutoff=Filters(since=since).cutoff())
                 if cluster is None or r["cluster"] == cluster]
        got: list[dict[str, Any]] = []
        after = None
        for _ in range(20):
            data = pages.drift_data(history, Filters(since=since, limit=2,
                                                     text={"cluster": cluster, "after": after}))
            assert data["per_cluster"] == _per_cluster(every)
            assert len(data["findings"]) <= 2
            got += data["findings"]
            after = data["next"]
            if after is None:
                break
        assert [(r["first_seen"], r["object_ref"], r["cluster"]) for r in got] == sorted(
            ((r["first_seen"], r["object_ref"], r["cluster"]) for r in every), key=lambda t: t[0], reverse=True)
        assert len({r["id"] for r in got}) == len(every)
    with pytest.raises(QueryError, match="after: 'not a cursor!' is not a cursor of the drift list") as bad:
        pages.drift_data(history, Filters(text={"after": "not a cursor!"}))
    assert bad.value.status == 400
    other = encode_cursor("verifications_page", [NOW, 1])
    with pytest.raises(QueryError, match="is not a cursor of the drift list"):
        pages.drift_data(history, Filters(text={"after": other}))


def test_the_drift_view_links_its_next_page(history: HistoryRepos) -> None:
    _seed_drift(history)
    f = Filters(since="3650d", limit=2)
    data = pages.drift_data(history, f)
    html = pages.render_drift(data, f, LobColours([]), "/kvfleet", {"clusters": ["c1", "c2"]})
    (href,) = set(re.findall(r'<a class="next" rel="next" href="([^"]+)"', html))
    assert unescape(href) == f"/kvfleet/drift?since=3650d&limit=2&after={data['next']}"
    assert 'class="first"' not in html and 'id="drift-paging-end"' in html
    assert len(re.findall(r"<tr>", html.split('id="drift-findings"')[1])) == 1 + 2  # the head and 2 rows
    last = pages.drift_data(history, Filters(since="3650d", limit=500))
    html = pages.render_drift(last, Filters(since="3650d", limit=500), LobColours([]), "/kvfleet", {"clusters": []})
    assert 'rel="next"' not in html and 'id="drift-paging-end"' not in html
    assert f'data-shown="{len(last["findings"])}" data-total="{len(last["findings"])}"' in html


def test_open_intents_are_kept_at_write_time(history: HistoryRepos) -> None:
    engine = history.engine
    history.runs.start("kvfleet_rollout/r1", dag_id="kvfleet_rollout", run_id="r1", trigger="manual",
                      triggered_by="alice", params={})
    key = StepKey("kvfleet_rollout/r1", "cluster.wave_0", 0)
    done = history.audit.intent(key, "apply_iec", "IEC ns/a", cluster="c1", endpoint="ns/a")
    history.audit.outcome(done, "changed")
    orphan = history.audit.intent(key, "apply_iec", "IEC ns/b", cluster="c1", endpoint="ns/b")
    other = history.audit.intent(StepKey("kvfleet_rollout/r1", "cluster.wave_1", 0), "scale", "Deployment ns/c",
                           cluster="c2", endpoint="ns/c")
    assert history.audit.intent(key, "apply_iec", "IEC ns/b", cluster="c1", endpoint="ns/b") == orphan  # a retry
    assert [r["id"] for r in history.audit.open_intents()] == [orphan, other] == [
        r["id"] for r in _rows(engine, FULL_OPEN_INTENTS)]
    assert [r["id"] for r in history.audit.open_intents(endpoint="b")] == [orphan]
    (run,) = history.queries.rows("recent_runs", cutoff=NOW - timedelta(days=1), limit=5)
    assert run["unknown_changes"] == 2
    history.audit.resolve_intent(orphan, {"replicas": 2}, run_key="kvfleet_drift_check/r9")
    assert [r["id"] for r in history.audit.open_intents()] == [other] == [r["id"] for r in _rows(engine, FULL_OPEN_INTENTS)]
    (run,) = history.queries.rows("recent_runs", cutoff=NOW - timedelta(days=1), limit=5)
    assert run["unknown_changes"] == 1


def test_pages_put_together_are_the_full_listing(history: HistoryRepos) -> None:
    engine = history.engine
    history.runs.start("kvfleet_hit_verification/r", dag_id="kvfleet_hit_verification", run_id="r",
                      trigger="schedule", triggered_by=None, params={})
    n = [0]
    same_time = NOW - timedelta(hours=2)
    for i in range(23):  # ties on `at` too: the id breaks them
        _verification(engine, same_time if i % 4 == 0 else NOW - timedelta(minutes=13 * i), "rag", "pass", 1.0,
                      2.5, n)
    full = history.queries.rows("verifications", cutoff=NOW - timedelta(days=7), lob=None, cluster=None, endpoint=None)
    got: list[dict[str, Any]] = []
    after = None
    pages = 0
    while True:
        rows, after = history.queries.page("verifications_page", limit=5, after=after, cutoff=NOW - timedelta(days=7),
                                   lob=None, cluster=None, endpoint=None)
        got += rows
        pages += 1
        if after is None:
            break
    assert pages == 5 and len(got) == len(full) == 23
    assert [r["step"] if "step" in r else (r["at"], r["id"]) for r in got] == sorted(
        ((r["at"], r["id"]) for r in got), reverse=True)
    assert {(r["at"], r["run_key"]) for r in got} == {(r["at"], r["run_key"]) for r in full}
    assert [r["at"] for r in got] == [r["at"] for r in full]  # same order (newest first)

    history.runs.start("kvfleet_drift_check/r", dag_id="kvfleet_drift_check", run_id="r", trigger="schedule",
                      triggered_by=None, params={})
    history.drift.sync("c1", [_finding(f"a{i}") for i in range(7)], "kvfleet_drift_check/r")
    for name, binds, full_name, full_binds in (
            ("open_drift_page", {"cutoff": None, "cluster": None}, "open_drift", {}),
            ("drift_page", {"cutoff": NOW - timedelta(days=1), "cluster": None}, "drift_since",
             {"cutoff": NOW - timedelta(days=1)})):
        got, after = [], None
        while True:
            rows, after = history.queries.page(name, limit=2, after=after, **binds)
            got += rows
            if after is None:
                break
        full = history.queries.rows(full_name, **full_binds)
        assert sorted(r["object_ref"] for r in got) == sorted(r["object_ref"] for r in full) and len(got) == 7
        assert len({r["id"] for r in got}) == 7


def test_a_cursor_is_checked() -> None:
    cursor = encode_cursor("drift_page", [NOW, 12])
    assert decode_cursor("drift_page", cursor) == [NOW, 12]
    with pytest.raises(ValueError, match="for another listing"):
        decode_cursor("verifications_page", cursor)
    with pytest.raises(ValueError, match="is not a page cursor"):
        decode_cursor("drift_page", "not a cursor!")
    forged = encode_cursor("drift_page", ["yesterday", 12])
    with pytest.raises(ValueError, match="is not a time"):
        decode_cursor("drift_page", forged)
    for bad_id in ("12; DROP TABLE x", True, 10**20, -1):  # bool is an int; outside bigint: refused, not a 5xx
        with pytest.raises(ValueError, match="is not a row id"):
            decode_cursor("drift_page", encode_cursor("drift_page", [NOW, bad_id]))


def test_the_cli_pages_verifications_and_drift(history: HistoryRepos, capsys: pytest.CaptureFixture[str]) -> None:
    engine = history.engine
    history.runs.start("kvfleet_hit_verification/r", dag_id="kvfleet_hit_verification", run_id="r",
                      trigger="schedule", triggered_by=None, params={})
    n = [0]
    for i in range(3):
        _verification(engine, NOW - timedelta(minutes=i), "rag", "pass", 1.0, 2.5, n)
    assert cli.main(["audit", "verifications", "--json", "--limit", "2"]) == 0
    out = capsys.readouterr()
    first = json.loads(out.out)
    assert len(first) == 2 and first[0]["run_key"] == "kvfleet_hit_verification/r"  # a list of rows, as before
    cursor = json.loads(out.err.strip().splitlines()[-1])["next"]
    assert cli.main(["audit", "verifications", "--json", "--limit", "2", "--after", cursor]) == 0
    out = capsys.readouterr()
    (last,) = json.loads(out.out)
    assert last["at"] < first[-1]["at"] and '"next"' not in out.err
    assert cli.main(["audit", "verifications", "--limit", "2"]) == 0
    assert f"--after {cursor}" in capsys.readouterr().out
    assert cli.main(["audit", "drift", "--after", cursor]) == 2
    assert "cursor is for another listing" in capsys.readouterr().err
    assert cli.main(["audit", "runs", "--after", cursor]) == 2
    assert "only verifications, drift take --after" in capsys.readouterr().err


# ---- the roles --------------------------------------------------------------------------------------------


@pytest.fixture
def two_roles(pg) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """A fresh database owned by the owner role, migrated as the owner; (owner URL, writer URL)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    pg.ensure_database(name)
    admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" OWNER TO {OWNER_ROLE}'))
    engine = create_engine(pg.url(name, OWNER_ROLE))
    migrate.upgrade(engine)
    engine.dispose()
    yield pg.url(name, OWNER_ROLE), pg.url(name, WRITER_ROLE)
    from kvfleet.history.db import dispose_engines

    dispose_engines()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.mark.parametrize("statement", [
    "DELETE FROM audit_open_intents",
    "TRUNCATE audit_open_intents",
    "INSERT INTO audit_open_intents (intent_id) SELECT id FROM audit_log",
    "UPDATE hit_stats_buckets SET passed = 0",
    "DELETE FROM drift_day_counts",
    "ALTER TABLE audit_log DISABLE TRIGGER audit_log_open_intents",
    "DROP TRIGGER hit_verifications_stats_ins ON hit_verifications",
    "ALTER TABLE drift_findings DISABLE TRIGGER drift_findings_counts_upd",
])
def test_the_writer_reads_the_summaries_and_cannot_write_them(two_roles: tuple[str, str], statement: str) -> None:
    _, writer_url = two_roles
    history = HistoryRepos.on(create_engine(writer_url))
    history.runs.start("kvfleet_rollout/r1", dag_id="kvfleet_rollout", run_id="r1", trigger="manual",
                      triggered_by="alice", params={})
    orphan = history.audit.intent(StepKey("kvfleet_rollout/r1", "cluster.wave_0", 0), "apply_iec", "IEC ns/a",
                            cluster="c1", endpoint="ns/a")  # the writer's insert fills the owner's summary
    history.drift.sync("c1", [_finding("a0")], "kvfleet_rollout/r1")
    with pytest.raises(DBAPIError, match="permission denied|must be owner"), history.engine.begin() as conn:
        conn.execute(text(statement))
    assert [r["id"] for r in history.audit.open_intents()] == [orphan]
    assert history.queries.rows("drift_summary", cutoff=NOW - timedelta(days=1), cluster=None)[0]["open"] == 1
    history.engine.dispose()


FULL_RECURRENCE = """
SELECT cluster, kind, count(DISTINCT (coalesce(endpoint, object_ref), first_run_key)) AS occurrences,
       min(first_seen) AS first_seen, max(first_seen) AS last_opened
FROM drift_findings WHERE first_seen >= :cutoff AND kind = :kind GROUP BY cluster, kind ORDER BY cluster, kind
"""


def test_drift_recurrence_counts_one_event_per_object_and_check(history: HistoryRepos) -> None:
    for run in ("kvfleet_drift_check/r1", "kvfleet_drift_check/r2"):
        history.runs.start(run, dag_id="kvfleet_drift_check", run_id=run[-2:], trigger="schedule",
                          triggered_by=None, params={})
    kind = "patch_lost_to_reconcile"

    def lost(fp: str, endpoint: str | None, field: str) -> dict[str, Any]:
        return {**_finding(fp, kind), "endpoint": endpoint, "field": field, "object_ref": "Deployment/x"}

    # r1: one endpoint lost two fields (one event), a cluster-level object lost one (another event)
    history.drift.sync("c1", [lost("f1", "ns/a", "volume"), lost("f2", "ns/a", "mount"),
                                 lost("f3", None, "spec")], "kvfleet_drift_check/r1")
    history.drift.sync("c2", [lost("f4", "ns/a", "volume")], "kvfleet_drift_check/r1")
    history.drift.sync("c1", [], "kvfleet_drift_check/r2")  # resolved ...
    history.drift.sync("c1", [lost("f1", "ns/a", "volume")], "kvfleet_drift_check/r2")  # ... and lost again
    rows = history.queries.rows("drift_recurrence", cutoff=NOW - timedelta(days=1), kind=kind)
    assert [(r["cluster"], r["occurrences"]) for r in rows] == [("c1", 3), ("c2", 1)]
    assert _same(rows, _rows(history.engine, FULL_RECURRENCE, cutoff=NOW - timedelta(days=1), kind=kind))


# ---- each endpoint's latest state (revision 0009) -----------------------------------------------------------

UI_FLEET_BEFORE_0009 = (Path(__file__).with_name("ui_fleet_before_0009.sql")).read_text()
FLEET_FILTERS = ({"cluster": None, "lob": None}, {"cluster": "c1", "lob": None}, {"cluster": None, "lob": "rag"},
                 {"cluster": "c2", "lob": "chat"}, {"cluster": None, "lob": "nope"})


def _fleet_same_as_before(history: HistoryRepos) -> list[dict[str, Any]]:
    """ui_fleet (read from endpoint_state) returns what it returned before revision 0009, under every filter."""
    for binds in FLEET_FILTERS:
        new = history.queries.rows("ui_fleet", **binds)
        old = _rows(history.engine, UI_FLEET_BEFORE_0009, **binds)
        assert _same(new, old), (binds, new, old)
    return history.queries.rows("ui_fleet", cluster=None, lob=None)


def _step(history: HistoryRepos, run: str, n: int, step: str, stage: str, outcome: str, cluster: str | None,
          endpoint: str | None, lob: str | None = None) -> None:
    history.runs.record_step(StepKey(run, "cluster.wave_1", n), StepEvent(step=step, stage=stage, outcome=outcome,
                                                                     cluster=cluster, endpoint=endpoint, lob=lob))


def _verify(history: HistoryRepos, run: str, n: int, cluster: str, endpoint: str, lob: str | None, verdict: str,
            speedup: float | None) -> None:
    history.verifications.record(StepKey(run, "verify_cluster", n), f"verify:{endpoint}:{n}", {
        "cluster": cluster, "endpoint": endpoint, "lob": lob, "instance_type": "ml.g5.4xlarge",
        "prompt_tokens": 2000, "hit_ratio": 1.0 if verdict == "pass" else 0.4, "speedup": speedup,
        "expected_speedup": 2.4, "verdict": verdict, "diagnosis": None if verdict == "pass" else "l2 read slow"})


def _seed_fleet(history: HistoryRepos) -> None:
    """A small history with every case ui_fleet tells apart, written as the stages write it."""
    for run, dag in (("kvfleet_rollout/r1", "kvfleet_rollout"), ("kvfleet_rollout/r2", "kvfleet_rollout"),
                     ("kvfleet_hit_verification/v1", "kvfleet_hit_verification"),
                     ("kvfleet_drift_check/d1", "kvfleet_drift_check")):
        history.runs.start(run, dag_id=dag, run_id=run.split("/")[1], trigger="schedule", triggered_by=None,
                          params={})
    n = iter(range(1000))
    for c in ("c1", "c2"):
        for i, lob in enumerate(("rag", "chat", "rag", None)):
            ep = f"ns/e{i}"
            _step(history, "kvfleet_rollout/r1", next(n), f"endpoint:{ep}", "endpoint", "changed", c, ep, lob)
            _verify(history, "kvfleet_hit_verification/v1", next(n), c, ep, lob, "pass", 2.5)
    # newer endpoint steps: failed, refused, a plan (ignored), skipped (not applied), unchanged
    _step(history, "kvfleet_rollout/r2", next(n), "endpoint:ns/e0", "endpoint", "failed", "c1", "ns/e0", "rag")
    _step(history, "kvfleet_rollout/r2", next(n), "endpoint:ns/e1", "endpoint", "planned", "c1", "ns/e1", "chat")
    _step(history, "kvfleet_rollout/r2", next(n), "endpoint:ns/e2", "endpoint", "skipped_by_gate", "c1", "ns/e2", "rag")
    _step(history, "kvfleet_rollout/r2", next(n), "endpoint:ns/e1", "endpoint", "refused", "c2", "ns/e1", "chat")
    _step(history, "kvfleet_rollout/r2", next(n), "endpoint:ns/e2", "endpoint", "unchanged", "c2", "ns/e2", "rag")
    # changes of other stages (the newest change), and steps that are neither (ignored)
    _step(history, "kvfleet_drift_check/d1", next(n), "drift:ns/e3", "drift", "changed", "c1", "ns/e3")
    _step(history, "kvfleet_hit_verification/v1", next(n), "verify:ns/e0", "verify", "passed", "c1", "ns/e0")
    _step(history, "kvfleet_hit_verification/v1", next(n), "verify:ns/e1", "verify", "failed", "c2", "ns/e1")
    # an endpoint with a change only (not listed), one with a verification only, one with open drift only
    _step(history, "kvfleet_drift_check/d1", next(n), "drift:ns/x", "drift", "changed", "c1", "ns/x")
    _verify(history, "kvfleet_hit_verification/v1", next(n), "c3", "ns/only-verified", "ads", "fail", None)
    _verify(history, "kvfleet_hit_verification/v1", next(n), "c1", "ns/e1", "chat", "degraded", 1.2)
    # endpoint steps without a cluster or an endpoint (listed as unknown, nothing joined)
    _step(history, "kvfleet_rollout/r2", next(n), "endpoint:ns/nocluster", "endpoint", "changed", None, "ns/nc")
    _step(history, "kvfleet_rollout/r2", next(n), "endpoint:nothing", "endpoint", "changed", "c2", None)
    history.drift.sync("c1", [_finding("f1", "stale_pods") | {"endpoint": "ns/e2"},
                                 _finding("f2", "pvc_unbound") | {"endpoint": "ns/e2", "lob": None},
                                 _finding("f3", "operator_paused") | {"endpoint": None, "lob": None},
                                 _finding("f4", "stale_pods") | {"endpoint": "ns/drift-only", "lob": "search"}],
                          "kvfleet_drift_check/d1")
    history.drift.sync("c2", [_finding("g1", "cr_mismatch") | {"endpoint": "ns/e0", "lob": "chat"}],
                          "kvfleet_drift_check/d1")
    with history.engine.begin() as conn:  # two changes of one endpoint at the same time: the id breaks the tie
        conn.execute(text("UPDATE step_events SET at = now() + interval '1 minute' "
                          "WHERE cluster = 'c2' AND endpoint = 'ns/e1' AND outcome IN ('refused', 'failed')"))


def test_ui_fleet_from_endpoint_state_equals_the_query_it_replaces(history: HistoryRepos) -> None:
    _seed_fleet(history)
    rows = {(r["cluster"], r["endpoint"]): r for r in _fleet_same_as_before(history)}
    assert rows[("c1", "ns/e0")]["l2_state"] == "failed" and rows[("c1", "ns/e1")]["l2_state"] == "applied"
    assert rows[("c1", "ns/e2")]["l2_state"] == "drifted" and rows[("c1", "ns/e2")]["open_drift"] == 2
    assert rows[("c1", "ns/e2")]["drift_kinds"] == "pvc_unbound, stale_pods"
    assert rows[("c1", "ns/e1")]["last_verdict"] == "degraded"
    assert rows[("c1", "ns/e3")]["last_change_stage"] == "drift"
    assert rows[("c3", "ns/only-verified")]["l2_state"] == "unknown"
    assert rows[("c1", "ns/drift-only")]["lob"] == "search"
    assert (None, "ns/nc") in rows and ("c2", None) in rows and ("c1", "ns/x") not in rows
    engine = history.engine
    # an owner's corrections and deletions are followed too
    with engine.begin() as conn:
        conn.execute(text("UPDATE step_events SET outcome = 'changed' WHERE cluster = 'c1' AND outcome = 'failed'"))
        conn.execute(text("UPDATE step_events SET endpoint = 'ns/e9' WHERE cluster = 'c2' AND step = 'endpoint:ns/e2'"))
        conn.execute(text("DELETE FROM hit_verifications WHERE cluster = 'c1' AND verdict = 'degraded'"))
        conn.execute(text("UPDATE hit_verifications SET verdict = 'fail', lob = 'ads' WHERE cluster = 'c2' "
                          "AND endpoint = 'ns/e3'"))
        conn.execute(text("UPDATE drift_findings SET kind = 'hash_seed_missing' WHERE fingerprint = 'f1'"))
        conn.execute(text("UPDATE drift_findings SET lob = 'ads', first_seen = now() - interval '3 days' "
                          "WHERE fingerprint = 'g1'"))
        conn.execute(text("DELETE FROM drift_findings WHERE fingerprint = 'f4'"))
    _fleet_same_as_before(history)
    with engine.begin() as conn:  # a whole run deleted (its steps and verifications cascade)
        conn.execute(text("DELETE FROM runs WHERE run_key = 'kvfleet_rollout/r2'"))
    rows = {(r["cluster"], r["endpoint"]): r for r in _fleet_same_as_before(history)}
    assert rows[("c1", "ns/e0")]["endpoint_outcome"] == "changed"
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM runs"))
        conn.execute(text("DELETE FROM drift_findings"))  # not tied to a run
    assert _fleet_same_as_before(history) == []
    assert _rows(engine, "SELECT * FROM endpoint_state") == []  # nothing left behind


def test_a_new_verification_step_and_finding_update_the_fleet_view(history: HistoryRepos) -> None:
    _seed_fleet(history)

    def row(cluster: str, endpoint: str) -> dict[str, Any]:
        return next(r for r in history.queries.rows("ui_fleet", cluster=cluster, lob=None) if r["endpoint"] == endpoint)

    assert row("c2", "ns/e3")["last_verdict"] == "pass"
    _verify(history, "kvfleet_hit_verification/v1", 900, "c2", "ns/e3", None, "fail", 0.9)
    assert (row("c2", "ns/e3")["last_verdict"], row("c2", "ns/e3")["speedup"]) == ("fail", 0.9)
    _step(history, "kvfleet_rollout/r1", 901, "endpoint:ns/e3@2", "endpoint", "refused", "c2", "ns/e3", "ads")
    assert (row("c2", "ns/e3")["l2_state"], row("c2", "ns/e3")["lob"]) == ("failed", "ads")
    assert row("c2", "ns/e3")["last_change_outcome"] == "refused"
    _step(history, "kvfleet_drift_check/d1", 902, "drift:ns/e3@3", "drift", "unchanged", "c2", "ns/e3")
    assert row("c2", "ns/e3")["last_change_outcome"] == "refused"  # an unchanged check is not a change
    history.drift.sync("c2", [_finding("h1", "stale_pods") | {"endpoint": "ns/e3"}], "kvfleet_drift_check/d1")
    assert (row("c2", "ns/e3")["l2_state"], row("c2", "ns/e3")["open_drift"]) == ("drifted", 1)
    history.drift.sync("c2", [], "kvfleet_drift_check/d1")  # every finding of c2 gone: resolved
    assert (row("c2", "ns/e3")["l2_state"], row("c2", "ns/e3")["open_drift"]) == ("failed", 0)
    _verify(history, "kvfleet_hit_verification/v1", 903, "c9", "ns/new", "rag", "pass", 2.6)
    assert row("c9", "ns/new")["l2_state"] == "unknown"
    _fleet_same_as_before(history)


def test_revision_0009_fills_the_summary_from_recorded_rows(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine, "0008_query_rollups")
    history = HistoryRepos.on(engine)
    _seed_fleet(history)
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert len(_fleet_same_as_before(history)) == 12  # 2 × 4 seeded, 1 verified, 1 drifted, 2 keyless
    migrate.downgrade(engine, "0008_query_rollups")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('endpoint_state')")).scalar_one() is None
        assert conn.execute(text("SELECT count(*) FROM pg_trigger WHERE tgname LIKE '%endpoint_state%'")
                            ).scalar_one() == 0
    engine.dispose()


def test_two_writers_of_one_endpoint_leave_its_newest_verification(history: HistoryRepos) -> None:
    """A recount locks the endpoint's row before reading: a writer whose row went in first but whose trigger runs
    while another writer of the endpoint is uncommitted waits for it and then reads its row (a recount that read
    first and upserted after would put the older verification back: this test fails without the lock step)."""
    history.runs.start("kvfleet_hit_verification/v1", dag_id="kvfleet_hit_verification", run_id="v1",
                      trigger="schedule", triggered_by=None, params={})
    engine = history.engine
    _verify(history, "kvfleet_hit_verification/v1", 0, "c1", "ns/k", None, "pass", 2.5)  # the row exists already
    insert = ("INSERT INTO hit_verifications (run_key, task_id, map_index, step, cluster, endpoint, verdict) "
              "SELECT 'kvfleet_hit_verification/v1', 'v', -1, s, 'c1', e, 'pass' FROM (VALUES (1, 'a', 'ns/k'), "
              "(2, 'b', 'ns/other')) v(n, s, e) WHERE v.n = 1 OR length(CAST(pg_advisory_xact_lock(4242) AS text)) = 0")
    gate = engine.connect()
    gate.execute(text("BEGIN"))
    gate.execute(text("SELECT pg_advisory_xact_lock(4242)"))  # holds writer A after its first row
    a = engine.connect()
    a_pid = a.execute(text("SELECT pg_backend_pid()")).scalar_one()
    a.commit()

    def writer_a() -> None:
        with a.begin():
            a.execute(text(insert))

    def wait_for(what: str) -> None:
        for _ in range(600):
            with engine.connect() as conn:
                event = conn.execute(text("SELECT wait_event FROM pg_stat_activity WHERE pid = :p"),
                                     {"p": a_pid}).scalar_one_or_none()
            if event == what:
                return
            threading.Event().wait(0.05)
        raise AssertionError(f"writer A never waited on {what}")

    thread = threading.Thread(target=writer_a)
    thread.start()
    wait_for("advisory")  # A's row for ns/k is in (lower id); A has not reached its trigger
    b = engine.connect()
    b.execute(text("BEGIN"))
    b.execute(text("INSERT INTO hit_verifications (run_key, task_id, map_index, step, cluster, endpoint, verdict) "
                   "VALUES ('kvfleet_hit_verification/v1', 'v', -1, 'c', 'c1', 'ns/k', 'fail')"))  # B's trigger ran
    gate.rollback()  # A goes on: its trigger now waits for B's lock on ns/k
    wait_for("transactionid")
    b.commit()
    thread.join(timeout=60)
    assert not thread.is_alive()
    newest = _rows(engine, "SELECT id, verdict FROM hit_verifications WHERE endpoint = 'ns/k' ORDER BY id DESC")[0]
    assert newest["verdict"] == "fail"
    (state,) = _rows(engine, "SELECT v_id, v_verdict FROM endpoint_state WHERE endpoint = 'ns/k'")
    assert (state["v_id"], state["v_verdict"]) == (newest["id"], "fail")
    _fleet_same_as_before(history)
    for conn in (gate, a, b):
        conn.close()


@pytest.mark.parametrize("statement", [
    "DELETE FROM endpoint_state",
    "TRUNCATE endpoint_state",
    "UPDATE endpoint_state SET open_drift = 0",
    "INSERT INTO endpoint_state (cluster, endpoint) VALUES ('c1', 'ns/forged')",
    "SELECT kvfleet_endpoint_state_refresh(ARRAY['c1'], ARRAY['ns/a'])",
    "ALTER TABLE step_events DISABLE TRIGGER step_events_endpoint_state_ins",
    "DROP TRIGGER hit_verifications_endpoint_state_ins ON hit_verifications",
])
def test_the_writer_reads_the_endpoint_state_and_cannot_write_it(two_roles: tuple[str, str], statement: str) -> None:
    _, writer_url = two_roles
    history = HistoryRepos.on(create_engine(writer_url))
    history.runs.start("kvfleet_rollout/r1", dag_id="kvfleet_rollout", run_id="r1", trigger="manual",
                      triggered_by="alice", params={})
    _step(history, "kvfleet_rollout/r1", 0, "endpoint:ns/a", "endpoint", "changed", "c1", "ns/a", "rag")
    history.drift.sync("c1", [_finding("a0") | {"endpoint": "ns/a"}], "kvfleet_rollout/r1")
    with pytest.raises(DBAPIError, match="permission denied|must be owner"), history.engine.begin() as conn:
        conn.execute(text(statement))
    (row,) = history.queries.rows("ui_fleet", cluster=None, lob=None)  # the writer's rows filled the owner's summary
    assert (row["endpoint"], row["l2_state"], row["open_drift"]) == ("ns/a", "drifted", 1)
    history.engine.dispose()
