"""The task boundary: where every exception a kvfleet task raises is classified once, into Airflow's terms.

Applied (``@task_boundary``) to every task
body in ``kvfleet.airflow``. The stages below raise kvfleet's error model (``kvfleet.errors``); the clients turn
what they know into it; whatever escapes unclassified is classified here, so no exception is retried blindly:

- ``PermanentError`` (bad input, a refused gate, a terminal cloud state): ``AirflowFailException``, no retry;
- ``TemporaryError``: re-raised, and retried no sooner than its ``delay`` (below);
- a 409, 429 or 5xx from Kubernetes or AWS, a call without an answer (``clients.transient``: a timeout, a
  connection refused or reset), a database connection lost: a ``TemporaryError`` (the stages are idempotent: the
  retry observes again);
- bad input that is not a kvfleet error (a missing file, unreadable YAML, a Param that fails validation):
  permanent, its message kept;
- anything else: permanent, as ``unexpected <type>: <message>``, with the traceback in the task log — a bug or an
  unclassified failure is better fixed than retried;
- Airflow's own control-flow exceptions (skip, defer, fail, reschedule, terminated), ``StopRequested`` (SIGTERM)
  and ``BaseException``s that are not ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) pass through unchanged.

How ``TemporaryError.delay`` reaches Airflow (apache-airflow 3.3.2, task SDK 1.3.2). A task's ``retry_policy``
is consulted in the worker on failure: ``task-sdk/src/airflow/sdk/execution_time/task_runner.py``
``_handle_current_task_failed`` calls ``_evaluate_retry_policy`` (``getattr(ti.task, "retry_policy")``), and a
``RetryDecision.retry(delay=…)`` goes to the API server as ``RetryTask(retry_delay_seconds=…)``
(``_finalize_task_failure``); the server stores it as ``retry_delay_override``
(``airflow-core/.../execution_api/routes/task_instances.py``), which ``TaskInstance.next_retry_datetime``
prefers over the static ``retry_delay`` (``airflow-core/src/airflow/models/taskinstance.py``). The policy
types are ``airflow.sdk.definitions.retry_policy`` (``RetryPolicy``, ``RetryDecision``). A retry decision never
extends the task's ``retries``; ``AirflowFailException`` bypasses the policy. DAG serialization keeps only a
``has_retry_policy`` flag (``_HAS_FLAG_FIELDS`` in ``airflow/serialization/serialized_objects.py``), so the policy
object lives in the worker and needs no serializer. The DAG files may set ``retry_policy=TemporaryDelayPolicy()``
in ``default_args`` (then the UI shows it); the boundary also installs it on the running task when the task has
none, so the delay is honoured either way.
Not used: ``AirflowRescheduleException`` (``UP_FOR_RESCHEDULE`` spends no try, so a lasting "temporary" error
would loop for ever) and deferral to a ``TimeDeltaTrigger`` (it would resume the same try mid-way, while a
reconciler's retry must start over and observe again).
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar

from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy
from airflow.sdk.exceptions import (
    AirflowFailException,
    AirflowRescheduleException,
    AirflowSensorTimeout,
    AirflowSkipException,
    DownstreamTasksSkipped,
)
from botocore.exceptions import ClientError
from kubernetes.client.exceptions import ApiException
from sqlalchemy.exc import DBAPIError, OperationalError

from kvfleet.clients.hyperpod import classify as classify_aws
from kvfleet.clients.kube import StopRequested, api_error
from kvfleet.clients.transient import is_network_error
from kvfleet.errors import PermanentError, TemporaryError

if TYPE_CHECKING:
    from airflow.sdk.definitions.context import Context

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

TRANSIENT_DELAY_S = 10.0  # a foreign transient error carries no delay of its own
# Bad input that is not (yet) a kvfleet error: retrying reads the same input again.
BAD_INPUT_ERRORS: tuple[type[BaseException], ...] = (FileNotFoundError, IsADirectoryError, PermissionError)
# Airflow's control flow: the task asks Airflow for an outcome; not an error to classify.
AIRFLOW_CONTROL_FLOW: tuple[type[BaseException], ...] = (
    AirflowFailException, AirflowSkipException, AirflowRescheduleException, AirflowSensorTimeout,
    DownstreamTasksSkipped)


class Kind(enum.StrEnum):
    PASS_THROUGH = "pass_through"
    TEMPORARY = "temporary"
    PERMANENT = "permanent"
    BAD_INPUT = "bad_input"
    UNEXPECTED = "unexpected"


@dataclass(frozen=True)
class Verdict:
    """How the boundary treats one exception: its kind, the message the task fails or retries with, the delay."""

    kind: Kind
    message: str
    delay: float | None = None


def _bad_input_types() -> tuple[type[BaseException], ...]:
    import yaml
    from airflow.sdk.exceptions import AirflowNotFoundException, ParamValidationError

    return (*BAD_INPUT_ERRORS, yaml.YAMLError, ParamValidationError, AirflowNotFoundException)


def _database_lost(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError) and bool(exc.connection_invalidated))


def classify(exc: BaseException, what: str = "task") -> Verdict:
    """The boundary's decision for ``exc`` (pure: no logging, no raising)."""
    if isinstance(exc, _bad_input_types()):
        return Verdict(Kind.BAD_INPUT, f"{what}: bad input: {type(exc).__name__}: {exc}")
    if isinstance(exc, (*AIRFLOW_CONTROL_FLOW, StopRequested)) or not isinstance(exc, Exception):
        return Verdict(Kind.PASS_THROUGH, str(exc))
    if isinstance(exc, TemporaryError):
        return Verdict(Kind.TEMPORARY, str(exc), exc.delay)
    if isinstance(exc, PermanentError):
        return Verdict(Kind.PERMANENT, str(exc))
    if isinstance(exc, ApiException | ClientError):
        typed = api_error(exc, what) if isinstance(exc, ApiException) else classify_aws(exc, what)
        if isinstance(typed, TemporaryError):
            return Verdict(Kind.TEMPORARY, str(typed), typed.delay)
        return Verdict(Kind.PERMANENT, str(typed))
    if is_network_error(exc) or _database_lost(exc):  # no answer: the outcome is unknown
        return Verdict(Kind.TEMPORARY, f"{what}: no answer ({type(exc).__name__}: {str(exc)[:300]}); the retry "
                                       "observes the live state again", TRANSIENT_DELAY_S)
    return Verdict(Kind.UNEXPECTED, f"{what}: unexpected {type(exc).__name__}: {str(exc)[:500]} (not retried: a "
                                    "kvfleet bug or an unclassified failure; the traceback is in the task log)")


def temporary_of(exc: BaseException | None) -> TemporaryError | None:
    """The ``TemporaryError`` that ``exc`` is or was raised from, if any."""
    seen = exc
    while seen is not None:
        if isinstance(seen, TemporaryError):
            return seen
        seen = seen.__cause__
    return None


class TemporaryDelayPolicy(RetryPolicy):
    """Airflow 3.3 retry policy: a ``TemporaryError`` is retried after its own ``delay``; everything else keeps the
    task's standard behaviour (the boundary already turned permanent errors into ``AirflowFailException``)."""

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int,
                 context: Context | None = None) -> RetryDecision:
        temporary = temporary_of(exception)
        if temporary is None:
            return RetryDecision.default()
        return RetryDecision.retry(delay=timedelta(seconds=max(float(temporary.delay), 0.0)),
                                   reason=f"temporary, retry in {temporary.delay:g}s: {str(temporary)[:300]}")

    def serialize(self) -> dict[str, Any]:
        return {"__type": f"{type(self).__module__}.{type(self).__qualname__}"}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> TemporaryDelayPolicy:
        return cls()


def install_retry_policy(task: Any) -> bool:
    """Give ``task`` (the running operator) the delay-honouring policy unless it has a policy of its own."""
    if task is None or getattr(task, "retry_policy", None) is not None:
        return False
    task.retry_policy = TemporaryDelayPolicy()
    return True


def _running_task() -> Any:
    try:
        from airflow.sdk import get_current_context

        return get_current_context()["ti"].task
    except Exception:  # called outside a running task (tests, the CLI): Airflow's defaults do not apply
        return None


def _raise_for(exc: Exception, verdict: Verdict) -> NoReturn:
    if verdict.kind == Kind.TEMPORARY:
        install_retry_policy(_running_task())
        if isinstance(exc, TemporaryError):
            raise exc
        raise TemporaryError(verdict.message, delay=verdict.delay or TRANSIENT_DELAY_S) from exc
    if verdict.kind == Kind.UNEXPECTED:
        log.error("%s", verdict.message, exc_info=exc)
    else:
        log.error("%s", verdict.message)
    raise AirflowFailException(verdict.message) from exc


def task_boundary(fn: Callable[P, R]) -> Callable[P, R]:
    """Classify every exception ``fn`` raises (module docstring) and raise it in Airflow's terms."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            verdict = classify(exc, fn.__name__)
            if verdict.kind == Kind.PASS_THROUGH:
                raise
            _raise_for(exc, verdict)

    return wrapper


