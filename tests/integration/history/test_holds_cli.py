"""`kvfleet freeze on|off|list` and `kvfleet stop` on a real history: a cluster named by its bare name is recorded
by its key, `freeze on` twice records one freeze, `--json` is JSON alone on stdout, --by defaults to KVFLEET_USER,
and a refused request (a lift of nothing, a run that is not in flight) exits 2 and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from kvfleet import cli
from kvfleet.history.holds import ALL, Scope
from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration
TWIN = str(Path(__file__).resolve().parents[2] / "fleets" / "twin.yaml")
PROD = "default/us-east-1/ml-prod-use1"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def counts(h: HistoryRepos) -> tuple[int, int]:
    with h.engine.connect() as conn:
        return (int(conn.execute(text("SELECT count(*) FROM holds")).scalar_one()),
                int(conn.execute(text("SELECT count(*) FROM audit_log")).scalar_one()))


def test_freeze_on_list_and_off(history: HistoryRepos, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVFLEET_USER", "alice")
    code, out, err = run(capsys, "freeze", "on", "--cluster", "ml-prod-use1", "--reason", "node repair", "--fleet",
                         TWIN, "--json")
    assert code == 0, err
    hold: dict[str, Any] = json.loads(out)
    assert (hold["kind"], hold["scope"], hold["target"], hold["by"], hold["already"]) == (
        "freeze", "cluster", PROD, "alice", False)
    assert f"kvfleet freeze off --cluster {PROD}" in hold["message"]
    code, out, _ = run(capsys, "freeze", "on", "--cluster", PROD, "--reason", "again", "--by", "bob", "--fleet", TWIN)
    assert code == 0 and out.startswith("already frozen (nothing recorded): cluster default/us-east-1/ml-prod-use1 "
                                        "is frozen by alice since ")
    assert counts(history) == (1, 1)
    assert run(capsys, "freeze", "on", "--lob", "retail", "--reason", "launch", "--fleet", TWIN)[0] == 0
    code, out, _ = run(capsys, "freeze", "list", "--json")
    listed = json.loads(out)
    assert code == 0 and [(f["scope"], f["target"], f["by"]) for f in listed] == [
        ("cluster", PROD, "alice"), ("lob", "retail", "alice")]
    code, out, _ = run(capsys, "freeze", "list")
    assert code == 0 and "node repair" in out and "kvfleet freeze off --lob retail --reason ..." in out
    code, out, err = run(capsys, "freeze", "off", "--cluster", "ml-prod-use1", "--reason", "repaired", "--by", "carol")
    assert code == 0, err
    assert out.startswith("lifted: the freeze of cluster default/us-east-1/ml-prod-use1 by alice") and "carol" in out
    assert [f.scope.name for f in history.holds.active_freezes()] == ["retail"]
    assert counts(history) == (2, 3)


def test_a_refused_request_exits_2_and_changes_nothing(history: HistoryRepos,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    history.holds.freeze(Scope(ALL), "change freeze", "alice")
    before = counts(history)
    for argv, message in [
        (("freeze", "off", "--cluster", PROD, "--reason", "x"),
         f"kvfleet freeze off: cluster {PROD} has no active freeze to lift; the freezes in force: --all"),
        (("stop", "--run", "kvfleet_rollout/nope", "--reason", "x"),
         "kvfleet stop: run 'kvfleet_rollout/nope' is not in the history"),
        (("freeze", "on", "--cluster", "nope", "--reason", "x", "--fleet", TWIN),
         "--cluster 'nope' is not a cluster of"),
        (("freeze", "on", "--all", "--reason", ""), "the reason is required"),
    ]:
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, ""), (argv, err)
        assert message in err and "Traceback" not in err, (argv, err)
    assert counts(history) == before


def test_stop_records_an_emergency_stop(history: HistoryRepos, capsys: pytest.CaptureFixture[str]) -> None:
    key = "kvfleet_rollout/manual__2026-12-01T08:00:00+00:00"
    history.runs.start(key, dag_id="kvfleet_rollout", run_id=key.split("/", 1)[1], trigger="manual",
                       triggered_by="alice", params={})
    code, out, err = run(capsys, "stop", "--run", key, "--reason", "wrong image", "--by", "bob", "--json")
    assert code == 0, err
    stop = json.loads(out)
    assert (stop["kind"], stop["scope"], stop["target"], stop["by"]) == ("stop", "run", key, "bob")
    started = (history.runs.get(key) or {})["started_at"]
    held = history.holds.holding(key, started, [PROD], ["retail"])
    assert held is not None and held.id == stop["id"]
    code, out, _ = run(capsys, "stop", "--cluster", "ml-stage-usw2", "--reason", "outage", "--by", "bob",
                       "--fleet", TWIN)
    assert code == 0 and out.startswith("recorded: emergency stop of cluster default/us-west-2/ml-stage-usw2 by bob")
    assert history.audit.verify_chain()["ok"]

