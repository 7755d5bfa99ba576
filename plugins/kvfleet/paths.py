"""Where kvfleet's files are: the source checkout, the SQL files and the local state directory.

Near a leaf (it imports only ``kvfleet.settings``, which imports only the errors and the chart-URL rule), so
every layer may use it: ``clients.helm`` looks for the pinned ``helm`` under the checkout, ``history`` reads its
migrations and queries from ``sql_dir()`` and keeps the embedded PostgreSQL in ``state_dir()``, and the sandbox
keeps its default state under ``state_dir() / "sandbox"``.
"""

from __future__ import annotations

from pathlib import Path

from kvfleet.settings import load_settings


def project_root() -> Path:
    """The source checkout (``plugins/kvfleet/paths.py`` is two levels below it)."""
    return Path(__file__).resolve().parents[2]


def sql_dir() -> Path:
    """Alembic migrations and the named audit queries: ``$KVFLEET_SQL_DIR`` or ``<checkout>/sql``."""
    return Path(load_settings().sql_dir or project_root() / "sql")


def state_dir() -> Path:
    """Local state (embedded PostgreSQL, sandbox, demo): ``$KVFLEET_STATE_DIR`` or ``./.state``; created."""
    path = Path(load_settings().state_dir or Path.cwd() / ".state")
    path.mkdir(parents=True, exist_ok=True)
    return path
