"""The reader role (``kvfleet_reader``, revision 0013): `kvfleet audit` and the kvfleet page read the history with
it alone (KVFLEET_HISTORY_READER_URL, no writer URL at all); it cannot INSERT, UPDATE, DELETE or TRUNCATE any table;
on a schema older than kvfleet's it migrates nothing and names the command that does. Against the embedded
PostgreSQL, the database owned and migrated by the owner role as in production."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import ProgrammingError

from kvfleet import cli
from kvfleet.history import migrate
from kvfleet.history.db import OWNER_ROLE, READER_ROLE, WRITER_ROLE, dispose_engines
from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration


@pytest.fixture
def roles(pg: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A fresh database owned by the owner role and migrated as it, with one run written as the writer; the
    environment names the reader only."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    pg.ensure_database(name)
    admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" OWNER TO {OWNER_ROLE}'))
    urls = {role: pg.url(name, role) for role in (OWNER_ROLE, WRITER_ROLE, READER_ROLE)}
    owner = create_engine(urls[OWNER_ROLE])
    migrate.upgrade(owner)
    writer = HistoryRepos.on(create_engine(urls[WRITER_ROLE]))
    writer.runs.start("kvfleet_rollout/r1", dag_id="kvfleet_rollout", run_id="r1", trigger="manual",
                      triggered_by="ann", params={})
    monkeypatch.delenv("KVFLEET_HISTORY_URL", raising=False)
    monkeypatch.delenv("KVFLEET_HISTORY_OWNER_URL", raising=False)
    monkeypatch.setenv("KVFLEET_HISTORY_READER_URL", urls[READER_ROLE])
    dispose_engines()
    try:
        yield urls
    finally:
        dispose_engines()
        writer.engine.dispose()
        owner.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_the_reader_reads_every_table_and_changes_none(roles: dict[str, str]) -> None:
    reader = create_engine(roles[READER_ROLE])
    try:
        with reader.connect() as conn:
            tables = [r[0] for r in conn.execute(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"))]
        assert {"runs", "audit_log", "step_events", "holds"} <= set(tables)
        for table in tables:
            with reader.connect() as conn:
                conn.execute(text(f'SELECT count(*) FROM "{table}"')).scalar()
                column = conn.execute(text("SELECT column_name FROM information_schema.columns WHERE table_name = :t "
                                           "ORDER BY ordinal_position LIMIT 1"), {"t": table}).scalar_one()
            for sql in (f'INSERT INTO "{table}" DEFAULT VALUES', f'UPDATE "{table}" SET "{column}" = "{column}"',
                        f'DELETE FROM "{table}" WHERE false', f'TRUNCATE "{table}"'):
                with reader.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
                    conn.execute(text(sql))
    finally:
        reader.dispose()


def test_audit_reads_with_the_reader_alone(roles: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["audit", "runs", "--json"]) == 0
    assert [r["run_key"] for r in json.loads(capsys.readouterr().out)] == ["kvfleet_rollout/r1"]


def test_the_page_reads_with_the_reader_alone(roles: dict[str, str]) -> None:
    from kvfleet.airflow.ui.app import _history

    history = _history()
    assert str(history.engine.url.username) == READER_ROLE
    assert history.runs.get("kvfleet_rollout/r1")["triggered_by"] == "ann"


def test_on_an_older_schema_the_reader_migrates_nothing_and_says_what_does(
        roles: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    owner = create_engine(roles[OWNER_ROLE])
    try:
        migrate.downgrade(owner, "0012_holds")
        assert cli.main(["audit", "runs", "--json"]) != 0
        err = capsys.readouterr().err
        assert "the history schema is at revision older than 0013_reader" in err and "kvfleet db upgrade" in err, err
        assert "Traceback" not in err
        assert migrate.current_revision(owner) == "0012_holds"  # unchanged
    finally:
        owner.dispose()


def test_the_revision_goes_down_and_up(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    try:
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == "0013_reader" == migrate.head_revision()
        migrate.downgrade(engine, "0012_holds")
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == "0013_reader"
    finally:
        engine.dispose()
