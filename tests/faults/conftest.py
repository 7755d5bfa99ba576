"""The fault matrix: every marked case runs only with ``KVFLEET_FAULTS=1`` (``make faults``); the
unmarked slice (one case per fault kind and per step) runs in every ``make test``. One sandbox and one history
database per module: the expensive part is converging the clusters once."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: the full fault matrix (steps x faults); runs with KVFLEET_FAULTS=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KVFLEET_FAULTS") == "1":
        return
    skip = pytest.mark.skip(reason="the full fault matrix runs with KVFLEET_FAULTS=1 (make faults)")
    for item in items:
        if item.get_closest_marker("faults") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def fault_env(pg, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    from faultkit import FaultEnv
    from sqlalchemy import create_engine, text

    from kvfleet.history.db import dispose_engines, get_engine
    from kvfleet.history.repos import HistoryRepos
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    name = f"t_{uuid.uuid4().hex[:12]}"
    pg.ensure_database(name)
    history = HistoryRepos.on(get_engine(pg.url(name)))
    env = FaultEnv.inventory_for_matrix()
    sandbox = start_sandbox(env, tmp_path_factory.mktemp("fault-sandbox"), SandboxSettings(time_scale=0.005))
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in sandbox.exports().items():
                mp.setenv(key, value)
            mp.setenv("KVFLEET_POLL_SECONDS", "0.05")
            mp.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
            fe = FaultEnv(sandbox, history, pg.url(name))
            try:
                fe.converge()
                yield fe
            finally:
                fe.close()
    finally:
        sandbox.stop()
        dispose_engines()
        admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
