"""Every state a task instance of one DAG takes, as Airflow's metadata database records it: a PostgreSQL trigger
on ``task_instance`` writes a row per INSERT or state UPDATE (the database clock, the deferral's trigger and its
``next_method``) into a table of its own, dropped again on exit.

Shared by ``tests/integration/dags/test_deferral.py`` and ``bench/fleet_scale.py``; both put this directory on
``sys.path`` (bench/ and tests/ are not packages) and ``from ti_state_log import TiStateLog``. Test and bench
support only: nothing under plugins/ imports it.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

DROP_LOCK_TIMEOUT = "20s"


class TiStateLog:
    """``with TiStateLog(url, dag_id) as log:`` — ``url`` is Airflow's metadata database
    (``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``); ``prefix`` names the log's table (a random suffix is added)."""

    def __init__(self, url: str, dag_id: str, *, prefix: str = "kvfleet_ti_states") -> None:
        self.engine = create_engine(url, isolation_level="AUTOCOMMIT")
        self.dag_id = dag_id
        self.table = f"{prefix}_{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> TiStateLog:
        t = self.table
        with self.engine.connect() as conn:
            conn.execute(text(f"CREATE TABLE {t} (seq bigserial PRIMARY KEY, run_id text, task_id text, "
                              "map_index int, state text, trigger_id int, next_method text, "
                              "at timestamptz DEFAULT clock_timestamp())"))
            conn.execute(text(f"""CREATE FUNCTION {t}_fn() RETURNS trigger AS $$ BEGIN
                IF NEW.dag_id = {_literal(self.dag_id)} AND (TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state)
                THEN
                  INSERT INTO {t} (run_id, task_id, map_index, state, trigger_id, next_method)
                  VALUES (NEW.run_id, NEW.task_id, NEW.map_index, NEW.state, NEW.trigger_id, NEW.next_method);
                END IF; RETURN NEW; END $$ LANGUAGE plpgsql"""))
            conn.execute(text(f"CREATE TRIGGER {t}_tr AFTER INSERT OR UPDATE ON task_instance "
                              f"FOR EACH ROW EXECUTE FUNCTION {t}_fn()"))
        return self

    def __exit__(self, *exc: object) -> None:
        t = self.table
        # dag.test() leaves this process's Airflow session in a transaction that read task_instance, which would
        # block the DROP TRIGGER for ever: end it first and wait a bounded time; should another session still
        # hold the table (idle in a transaction), end that session and drop again.
        _remove_airflow_session()
        with self.engine.connect() as conn:
            conn.execute(text(f"SET lock_timeout = '{DROP_LOCK_TIMEOUT}'"))
            try:
                conn.execute(text(f"DROP TRIGGER IF EXISTS {t}_tr ON task_instance"))
            except OperationalError:
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                                  "current_database() AND state = 'idle in transaction' AND pid <> pg_backend_pid()"))
                conn.execute(text(f"DROP TRIGGER IF EXISTS {t}_tr ON task_instance"))
            conn.execute(text(f"DROP FUNCTION IF EXISTS {t}_fn()"))
            conn.execute(text(f"DROP TABLE IF EXISTS {t}"))
        self.engine.dispose()

    def rows(self, task_id: str | None = None, *, run_id: str | None = None) -> list[dict[str, Any]]:
        """The log in order, with each deferral's trigger ``classpath``; of one task and/or one run when given."""
        where = [w for w, v in (("s.task_id = :t", task_id), ("s.run_id = :r", run_id)) if v is not None]
        sql = (f"SELECT s.*, tr.classpath FROM {self.table} s LEFT JOIN trigger tr ON tr.id = s.trigger_id "
               + (f"WHERE {' AND '.join(where)} " if where else "") + "ORDER BY seq")
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(text(sql), {"t": task_id, "r": run_id}).mappings()]

    def states(self, task_id: str) -> list[str]:
        return [r["state"] for r in self.rows(task_id)]


def _literal(value: str) -> str:
    """``value`` as an SQL string literal (the trigger function's body cannot take a bound parameter)."""
    return "'" + value.replace("'", "''") + "'"


def _remove_airflow_session() -> None:
    """End this process's Airflow ORM session (its open transaction), if Airflow's settings are loaded."""
    import sys

    settings = sys.modules.get("airflow.settings")
    session = getattr(settings, "Session", None)
    if session is not None:
        session.remove()
