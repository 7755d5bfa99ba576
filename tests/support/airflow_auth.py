"""Airflow's SimpleAuthManager set up as the API server does, for the kvfleet page's tests: the users and the JWT
secret go into the environment for the duration, on a migrated metadata database (token revocation is checked
there). Shared by tests/e2e/test_ui_api.py, test_ui_hostile.py and test_ui_metrics.py."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def simple_auth_manager(workdir: Path, jwt_secret: str, users: str, passwords: dict[str, str]) -> Iterator[Any]:
    """``users`` as Airflow's setting spells it (``alice:viewer,bob:admin``); ``passwords``: name -> password (a
    name with a password and no entry in ``users`` is a login without a role)."""
    password_file = workdir / "passwords.json"
    password_file.write_text(json.dumps(passwords))
    env = {"AIRFLOW__CORE__AUTH_MANAGER":
           "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users,
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(password_file),
           "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    from airflow.api_fastapi.app import init_auth_manager, purge_cached_app

    purge_cached_app()
    try:
        yield init_auth_manager()
    finally:
        purge_cached_app()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
