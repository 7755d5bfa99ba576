"""Airflow for DAG tests: the metadata DB (embedded PostgreSQL, set up in the root conftest) is migrated
once per session, and DAGs are loaded from the repository's dags/ folder."""

from __future__ import annotations

from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


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
