"""The DAG and task callbacks, and the gate's notifier, that the DAG files wire in, importable at parse time
for free.

Each callback imports :mod:`kvfleet.airflow.run_status` (and through it the history: SQLAlchemy, psycopg) only
when it is called, in the worker or the DAG processor, so that parsing a DAG file stays at ``airflow.sdk`` plus a
few light modules. The behaviour is run_status's (it never raises); an import that fails is logged, not raised,
for the same reason. Likewise :class:`GateWaitingNotifier` (a HITL operator's ``notifiers``) imports
:mod:`kvfleet.airflow.notify` (``urllib.request``, ``kvfleet.airflow.gates``: about 20 ms) only when a gate
starts waiting, not when the DAG file is parsed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from airflow.sdk import BaseNotifier

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


class GateWaitingNotifier(BaseNotifier):
    """A HITL operator's ``notifiers`` entry that sends kvfleet's "a gate is waiting" notification
    (``notify.gate_waiting_notifier()``), importing :mod:`kvfleet.airflow.notify` only when the gate starts
    waiting (``HITLOperator.execute`` calls each notifier). Like the notifier it defers to, it renders no template
    and never raises; after a call, ``last_results`` and ``last_lobs`` are those of that notification."""

    template_fields: Sequence[str] = ()

    def __init__(self) -> None:
        super().__init__()
        self.last_results: dict[str, str] = {}
        self.last_lobs: set[str] = set()

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Nothing to render (a gate's text may contain ``{{``): no Jinja environment is built."""

    def notify(self, context: Any) -> None:
        try:
            from kvfleet.airflow import notify
        except Exception:
            log.exception("kvfleet: could not import kvfleet.airflow.notify; the gate's notification is not sent")
            return
        notifier = notify.gate_waiting_notifier()
        notifier.notify(context)
        self.last_results, self.last_lobs = notifier.last_results, notifier.last_lobs


def gate_waiting_notifier() -> GateWaitingNotifier:
    """The notifier for a HITL gate's ``notifiers`` (settings read from the environment when it fires)."""
    return GateWaitingNotifier()
