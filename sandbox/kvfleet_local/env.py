"""Environment for running Airflow locally on kvfleet's embedded PostgreSQL (the demo, `make up`, the test suite).

Airflow reads its configuration from the environment at import time, so callers build this mapping first,
export it, and only then import Airflow. Airflow's metadata lives in the embedded server's ``airflow``
database (SQLite would forbid parallel tasks); kvfleet's history in the ``kvfleet`` database, written by the
writer role and migrated by the owner role (``kvfleet.history.db``).
"""

from __future__ import annotations

from pathlib import Path

from kvfleet.history.db import AIRFLOW_DB, HISTORY_DB, OWNER_ROLE, WRITER_ROLE, EmbeddedPostgres
from kvfleet.paths import project_root


def airflow_env(airflow_home: Path, pg: EmbeddedPostgres, dags_folder: Path | None = None) -> dict[str, str]:
    airflow_home.mkdir(parents=True, exist_ok=True)
    root = project_root()
    return {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": pg.url(AIRFLOW_DB),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder or root / "dags"),
        # Not the repo's plugins/ folder: Airflow imports every .py file under its plugins folder as a
        # top-level module by file name, so kvfleet's modules would shadow the stdlib (selectors, queue...).
        # kvfleet reaches Airflow as an installed package with an `airflow.plugins` entry point instead.
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(airflow_home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__MAX_MAP_LENGTH": "1024",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # boto3 sessions that share one botocore loader (kvfleet.clients.aws_session): a process that builds
        # clients again and again (dag.test, the triggerer) decodes each service model once.
        "AIRFLOW__AWS__SESSION_FACTORY": "kvfleet.clients.aws_session.SharedLoaderSessionFactory",
        # The history as production runs it: tasks write as the writer role (no TRUNCATE, no DDL, no trigger
        # control on the audit log); migrations run as the owner.
        "KVFLEET_HISTORY_URL": pg.url(HISTORY_DB, WRITER_ROLE),
        "KVFLEET_HISTORY_OWNER_URL": pg.url(HISTORY_DB, OWNER_ROLE),
    }
