"""Session set-up shared by every test: a real embedded PostgreSQL and an Airflow home pointing at it.

Airflow reads its configuration when first imported, so the environment is prepared in
``pytest_configure``, before any test module can import Airflow. The server listens on a Unix socket only
and is stopped in ``pytest_unconfigure``.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
_state: dict[str, object] = {}


def _xdist_controller(config: pytest.Config) -> bool:
    """True in pytest-xdist's controller process: it only hands out tests, each worker has its own server."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


# The suite's order and how pytest-xdist shares it out (make test: --dist loadfile --no-loadscope-reorder). Test
# files come in a seeded random order and the tests of each file are shuffled (a test that needs another to run
# first fails in some order; the tests of a file that share a module-wide fixture keep their order, since they
# build on one state on purpose), except that the heaviest files come first (measured: bench/README.md, "The suite's
# time"), so that no long test starts last while the other workers idle. A file goes to one worker whole, except
# the files of SPREAD, whose tests are handed out one by one (each is a DAG run or a stage sequence of 20-90 s on a
# twin of its own): a file of SPREAD whose tests share a fixture wider than a test is refused at collection.
# TEST_ORDER_SEED=<n> repeats an order.
SPREAD = (
    "tests/integration/dags/test_rollout_sandbox.py",
    "tests/integration/dags/test_rollout_leases.py",
    "tests/integration/dags/test_deferral.py",
    "tests/integration/dags/test_terminal_status.py",
    "tests/integration/stages/test_endpoint_stages.py",
    "tests/integration/stages/test_update_strategies.py",
    "tests/integration/stages/test_cluster_stages.py",
    "tests/dags/test_curvine_dags.py",
    "tests/integration/stages/test_kyverno_install.py",
    "tests/integration/curvine_ops/test_curvine_upgrade.py",
)
HEAVY_FIRST = (
    *SPREAD,
    "tests/integration/dags/test_deferral_after_change.py",
    "tests/integration/dags/test_hit_verification_dag.py",
    "tests/integration/dags/test_gate_rest.py",
    "tests/integration/test_rbac_iam_coverage.py",
    "tests/integration/dags/test_run_status_dags.py",
    "tests/integration/test_triggers.py",
    "tests/faults/test_fault_matrix.py",
    "tests/integration/drift/test_dead_pauser.py",
    "tests/integration/drift/test_advise.py",
    "tests/integration/sandbox/test_runtime.py",
)
# A session fixture is not one of them: every worker builds its own (its PostgreSQL, Airflow's database).
WIDE_SCOPES = ("package", "module", "class")
SEED_ENV = "TEST_ORDER_SEED"  # not KVFLEET_*: kvfleet warns about an unknown KVFLEET_ variable


def _seed() -> int:
    """The order's seed: TEST_ORDER_SEED, else a new one, set in the environment so that pytest-xdist's workers
    (started after this, with this environment) shuffle the same way."""
    raw = os.environ.get(SEED_ENV, "")
    if not raw.isdigit():
        raw = str(random.SystemRandom().randrange(10**6))
        os.environ[SEED_ENV] = raw
    return int(raw)


def pytest_report_header(config: pytest.Config) -> str:
    return (f"kvfleet test order: {SEED_ENV}={_seed()} (heaviest files first, then the rest; each file shuffled "
            "unless its tests share a module fixture)")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"test order: {SEED_ENV}={_seed()} repeats it")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With --dist loadfile: pytest-xdist's file scheduling, but the tests of SPREAD go out one by one."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    if not callable(getattr(LoadScopeScheduling, "_split_scope", None)):  # pytest-xdist's own hook for the unit
        raise pytest.UsageError("pytest-xdist's LoadScopeScheduling has no _split_scope any more: tests/conftest.py "
                                "cannot hand out SPREAD test by test; adapt pytest_xdist_make_scheduler")

    class SpreadHeavyFiles(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path in SPREAD else path

    return SpreadHeavyFiles(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rng = random.Random(_seed())
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    wide = sorted({f"{name} ({fixture})" for name in SPREAD for t in by_file.get(name, ())
                   for fixture in _wide_fixtures(t)})
    if wide:
        raise pytest.UsageError(f"tests/conftest.py SPREAD hands these files out test by test, but their tests share "
                                f"a fixture wider than a test: {', '.join(wide)}; take the file out of SPREAD")
    files = sorted(by_file)
    rng.shuffle(files)
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    files.sort(key=lambda f: rank.get(f, len(rank)))  # stable: the rest keep their shuffled order
    ordered: list[pytest.Item] = []
    for name in files:
        tests = by_file[name]
        if not any(_wide_fixtures(t) for t in tests):  # tests sharing a module's fixture keep the file's order
            rng.shuffle(tests)
        ordered.extend(tests)
    items[:] = ordered


def _wide_fixtures(item: pytest.Item) -> list[str]:
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the fixtures a test requests
    defs = info.name2fixturedefs.items() if info is not None else ()
    return [name for name, d in defs if d and d[-1].scope in WIDE_SCOPES]


def pytest_configure(config: pytest.Config) -> None:
    _seed()
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
