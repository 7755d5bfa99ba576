"""Alembic migrations of the history schema, run from code (``kvfleet db upgrade`` and on first use).

The revisions under ``sql/migrations/versions`` execute plain ``.sql`` files that sit beside them, so the
schema is readable as SQL. An advisory lock serialises concurrent upgraders (parallel tasks on first use).
"""

from __future__ import annotations

import logging

from alembic import command, op
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from kvfleet.paths import sql_dir

logging.getLogger("alembic").setLevel(logging.WARNING)
VERSION_TABLE = "kvfleet_alembic_version"
_MIGRATION_LOCK = 74_657_001  # pg_advisory_lock key reserved for kvfleet migrations


def run_sql_file(name: str) -> None:
    """Execute one migration's SQL file inside Alembic's transaction (called by the revision scripts)."""
    sql = (sql_dir() / "migrations" / name).read_text()
    # The raw DB-API cursor: the file holds several statements and PL/pgSQL bodies, which neither
    # SQLAlchemy's text() (binds on ':') nor a parameter dict should touch.
    cursor = op.get_bind().connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql)
    finally:
        cursor.close()


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(sql_dir() / "migrations"))
    return cfg


def head_revision() -> str:
    return str(ScriptDirectory.from_config(_config()).get_current_head())


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()


def _run(engine: Engine, action: str, target: str) -> None:
    cfg = _config()
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, target)


def upgrade(engine: Engine, target: str = "head") -> None:
    _run(engine, "upgrade", target)


def downgrade(engine: Engine, target: str = "base") -> None:
    _run(engine, "downgrade", target)


def ensure_schema(engine: Engine) -> None:
    if current_revision(engine) != head_revision():
        upgrade(engine)
