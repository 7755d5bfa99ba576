"""Where kvfleet's files are: the source checkout, the SQL files and the local state directory.

A leaf module (it imports nothing of kvfleet), so every layer may use it: ``clients.helm`` looks for the pinned
``helm`` under the checkout, ``history`` reads its migrations and queries from ``sql_dir()`` and keeps the embedded
PostgreSQL in ``state_dir()``, and the sandbox keeps its default state under ``state_dir() / "sandbox"``.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The source checkout (``plugins/kvfleet/paths.py`` is two levels below it)."""
    return Path(__file__).resolve().parents[2]


def sql_dir() -> Path:
    """Alembic migrations and the named audit queries: ``$KVFLEET_SQL_DIR`` or ``<checkout>/sql``."""
    return Path(os.environ.get("KVFLEET_SQL_DIR") or project_root() / "sql")


def state_dir() -> Path:
    """Local state (embedded PostgreSQL, sandbox, demo): ``$KVFLEET_STATE_DIR`` or ``./.state``; created."""
    path = Path(os.environ.get("KVFLEET_STATE_DIR") or Path.cwd() / ".state")
    path.mkdir(parents=True, exist_ok=True)
    return path
