"""The DAG and task callbacks that the DAG files wire in, importable at parse time for free.

Each one imports :mod:`kvfleet.airflow.run_status` (and through it the history: SQLAlchemy, psycopg) only when
it is called, in the worker or the DAG processor, so that parsing a DAG file stays at ``airflow.sdk`` plus a few
light modules. The behaviour is run_status's (it never raises); an import that fails is logged, not raised,
for the same reason.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)


def _run_status() -> ModuleType | None:
    try:
        from kvfleet.airflow import run_status
    except Exception:
        log.exception("kvfleet: could not import kvfleet.airflow.run_status; the run's status is not recorded")
        return None
    return run_status


def on_task_failure(context: Any) -> None:
    """Task-level ``on_failure_callback`` (``run_status.on_task_failure``)."""
    module = _run_status()
    if module is not None:
        module.on_task_failure(context)


def on_dag_success(context: Any) -> None:
    """DAG-level ``on_success_callback`` (``run_status.on_dag_success``; Airflow ignores the status it returns)."""
    module = _run_status()
    if module is not None:
        module.on_dag_success(context)
    _notify_run_end(context)


def on_dag_failure(context: Any) -> None:
    """DAG-level ``on_failure_callback`` (``run_status.on_dag_failure``)."""
    module = _run_status()
    if module is not None:
        module.on_dag_failure(context)
    _notify_run_end(context)


def _notify_run_end(context: Any) -> None:
    """After the run's status is written: notify (SNS, webhook) when it ended failed or completed_with_failures.
    A notification never fails a run, and nothing is sent when no destination is configured."""
    try:
        from kvfleet.airflow import notify

        notify.run_end_notifier()(context)
    except Exception:
        log.exception("kvfleet: run-end notification")
