"""Session set-up shared by every test: a real embedded PostgreSQL and an Airflow home pointing at it.

Airflow reads its configuration when first imported, so the environment is prepared in
``pytest_configure``, before any test module can import Airflow. The server listens on a Unix socket only
and is stopped in ``pytest_unconfigure``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_state: dict[str, object] = {}


def _xdist_controller(config: pytest.Config) -> bool:
    """True in pytest-xdist's controller process: it only hands out tests, each worker has its own server."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def pytest_configure(config: pytest.Config) -> None:
    if _xdist_controller(config):
        return
    tmp = Path(tempfile.mkdtemp(prefix="kvfleet-test-"))
    _state["tmp"] = tmp
    os.environ.setdefault("XDG_RUNTIME_DIR", str(tmp / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ["KVFLEET_STATE_DIR"] = str(tmp / "state")
    # The history fails closed without a URL: the suite chooses the embedded server explicitly (the one started
    # below, in this state directory); airflow_env then names its writer and owner roles for every process.
    os.environ["KVFLEET_HISTORY_URL"] = "embedded"
    # The DAG runs of the suite name the checkout's fleets and those the tests write under the temp directory.
    os.environ["KVFLEET_FLEET_PATHS"] = os.pathsep.join([str(ROOT), tempfile.gettempdir()])
    os.environ.pop("AIRFLOW_CONN_KVFLEET_HISTORY", None)
    from kvfleet.history.db import EmbeddedPostgres
    from kvfleet_local.env import airflow_env

    pg = EmbeddedPostgres(tmp / "state").start()
    _state["pg"] = pg
    env = airflow_env(tmp / "airflow", pg)
    (tmp / "airflow" / "plugins").mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    tools = ROOT / ".tools" / "bin"
    os.environ["PATH"] = f"{tools}{os.pathsep}{os.environ['PATH']}"


def pytest_unconfigure(config: pytest.Config) -> None:
    from kvfleet.history.db import dispose_engines

    dispose_engines()
    import sys

    if "airflow.settings" in sys.modules:  # close Airflow's pool before its server goes away
        sys.modules["airflow.settings"].dispose_orm(do_log=False)
    pg = _state.get("pg")
    if pg is not None:
        pg.stop()  # type: ignore[attr-defined]
    tmp = _state.get("tmp")
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_aws_clients() -> Iterator[None]:
    """No boto3 client outlives its test (``kvfleet.clients.aws`` reuses them within a process): no retry quota, pooled
    connection or sandbox endpoint carries over to the next test."""
    yield
    from kvfleet.clients import aws

    aws.forget()


@pytest.fixture(scope="session")
def pg():  # type: ignore[no-untyped-def]
    return _state["pg"]


@pytest.fixture
def fresh_db_url(pg) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A new, empty database on the embedded server, dropped afterwards."""
    from sqlalchemy import create_engine, text

    name = f"t_{uuid.uuid4().hex[:12]}"
    pg.ensure_database(name)
    yield pg.url(name)
    from kvfleet.history.db import dispose_engines

    dispose_engines()
    admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def history(fresh_db_url: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A HistoryRepos repository on a fresh, migrated database; KVFLEET_HISTORY_URL points at it."""
    from kvfleet.history.db import get_engine
    from kvfleet.history.repos import HistoryRepos

    monkeypatch.setenv("KVFLEET_HISTORY_URL", fresh_db_url)
    return HistoryRepos.on(get_engine(fresh_db_url))


@pytest.fixture
def example_fleet() -> Path:
    """The suite's fleet: fleet.example.yaml's shape with production on patch and 2 workers pinned (its header)."""
    return ROOT / "tests" / "fleets" / "twin.yaml"


DAGS = ROOT / "dags"


@pytest.fixture(scope="session")
def airflow_db():  # type: ignore[no-untyped-def]
    from airflow.utils import db

    db.initdb()
    return True


@pytest.fixture(scope="session")
def dagbag(airflow_db):  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}, bag.import_errors
    return bag
