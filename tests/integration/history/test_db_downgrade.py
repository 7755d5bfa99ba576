"""`kvfleet db downgrade` is never a slip: it needs the revision and --yes, and going down to base (which drops the
audit log and the runs) needs --drop-history too and exports every table first. Refused, it exits 2 having changed
nothing. Against a fresh history database (PostgreSQL)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from sqlalchemy import text

from kvfleet import cli
from kvfleet.history import migrate
from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration


def _tables(history: HistoryRepos) -> set[str]:
    with history.engine.connect() as conn:
        return {r[0] for r in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))}


@pytest.mark.parametrize("argv,said", [
    (["db", "downgrade"], "name the revision to go down to"),
    (["db", "downgrade", "0011"], "add --yes to mean it"),
    (["db", "downgrade", "base", "--yes"], "add --drop-history to mean it"),
    (["db", "downgrade", "base", "--drop-history"], "add --yes to mean it"),
])
def test_a_downgrade_not_meant_exits_2_and_changes_nothing(history: HistoryRepos, capsys: pytest.CaptureFixture[str],
                                                          argv: list[str], said: str) -> None:
    before = (migrate.current_revision(history.engine), _tables(history))
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert said in captured.err and "Traceback" not in captured.err and captured.out == ""
    assert (migrate.current_revision(history.engine), _tables(history)) == before


def test_down_to_base_exports_every_table_first(history: HistoryRepos, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVFLEET_STATE_DIR", str(tmp_path))
    history.runs.start("kvfleet_rollout/kept", dag_id="kvfleet_rollout", run_id="kept", trigger="manual",
                       triggered_by="ann", params={})
    tables = _tables(history)
    try:
        assert cli.main(["db", "downgrade", "base", "--drop-history", "--yes"]) == 0
        said = capsys.readouterr().out
        [export] = list(tmp_path.glob("history-export-*"))
        assert str(export) in said
        assert {p.stem for p in export.glob("*.csv")} == tables  # every table, the audit log and the runs included
        with (export / "runs.csv").open(encoding="utf-8") as fh:
            assert [r["run_key"] for r in csv.DictReader(fh)] == ["kvfleet_rollout/kept"]
        assert not _tables(history) & {"runs", "audit_log"}
    finally:
        migrate.upgrade(history.engine)
