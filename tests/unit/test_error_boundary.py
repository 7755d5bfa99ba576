"""The task boundary (kvfleet.airflow.boundary): every exception a task raises is classified once — permanent
fails fast, temporary is retried after its own delay, anything else fails as "unexpected" with its traceback."""

from __future__ import annotations

import logging
import subprocess
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from botocore.exceptions import ClientError, EndpointConnectionError
from kubernetes.client.exceptions import ApiException

from kvfleet.airflow import boundary
from kvfleet.airflow.boundary import Kind, TemporaryDelayPolicy, classify, task_boundary
from kvfleet.clients.kube import StopRequested
from kvfleet.errors import (
    ConvergenceTimeout,
    GateRefused,
    InventoryError,
    LeaseWaitTimeout,
    PermanentError,
    TemporaryError,
)


def _raising(exc: BaseException) -> Any:
    @task_boundary
    def body() -> None:
        raise exc

    return body


def _api(status: int) -> ApiException:
    return ApiException(status=status, reason=f"status {status}")


def _aws(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "UpdateCluster")


# ---- permanent fails fast --------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [PermanentError("bad"), GateRefused("format flag true"),
                                 InventoryError(["clusters.x: unknown"]), LeaseWaitTimeout("locked by r1")])
def test_permanent_fails_fast_without_retry(exc: PermanentError) -> None:
    with pytest.raises(AirflowFailException) as caught:
        _raising(exc)()
    assert str(caught.value) == str(exc) and caught.value.__cause__ is exc


def test_the_boundary_keeps_the_return_value() -> None:
    @task_boundary
    def body(x: int) -> int:
        return x + 1

    assert body(1) == 2 and body.__name__ == "body"


@pytest.mark.parametrize("status", [400, 403, 404, 422])
def test_a_kubernetes_4xx_that_escaped_is_permanent(status: int) -> None:
    with pytest.raises(AirflowFailException, match=f"Kubernetes {status}"):
        _raising(_api(status))()


def test_an_aws_validation_error_that_escaped_is_permanent() -> None:
    with pytest.raises(AirflowFailException, match="ValidationException"):
        _raising(_aws("ValidationException", 400))()


# ---- bad input and the unexpected ------------------------------------------------------------------------------


def test_a_missing_file_is_bad_input_and_fails_fast() -> None:
    exc = FileNotFoundError(2, "No such file or directory", "/fleet.yaml")
    with pytest.raises(AirflowFailException, match="bad input: FileNotFoundError.*fleet.yaml") as caught:
        _raising(exc)()
    assert caught.value.__cause__ is exc  # the history's failure callback finds the root


@pytest.mark.parametrize("exc", [ValueError("wave_size must be positive"), KeyError("c-9"),
                                 RuntimeError("injected failure after scale-to-0 (fault drill)"), ZeroDivisionError()])
def test_anything_unclassified_is_permanent_unexpected_with_the_traceback_logged(
        exc: Exception, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="kvfleet.airflow.boundary"), \
            pytest.raises(AirflowFailException) as caught:
        _raising(exc)()
    message = str(caught.value)
    assert message.startswith(f"body: unexpected {type(exc).__name__}") and "traceback is in the task log" in message
    record = next(r for r in caplog.records if "unexpected" in r.getMessage())
    assert record.exc_info is not None and record.exc_info[1] is exc


# ---- temporary is retried after its own delay ------------------------------------------------------------------


def test_a_temporary_error_is_re_raised_unchanged() -> None:
    exc = TemporaryError("pod not ready", delay=42)
    with pytest.raises(TemporaryError) as caught:
        _raising(exc)()
    assert caught.value is exc and caught.value.delay == 42


@pytest.mark.parametrize("exc", [_api(409), _api(429), _api(500), _api(503), _aws("ThrottlingException", 400),
                                 _aws("InternalFailure", 500), ConnectionResetError(104, "Connection reset by peer"),
                                 ConnectionRefusedError(111, "refused"), TimeoutError("read timed out"),
                                 subprocess.TimeoutExpired(["helm"], 300),
                                 EndpointConnectionError(endpoint_url="https://sagemaker.us-east-1.amazonaws.com")])
def test_conflicts_throttling_5xx_timeouts_and_resets_are_temporary(exc: Exception) -> None:
    with pytest.raises(TemporaryError) as caught:
        _raising(exc)()
    assert caught.value.__cause__ is exc and caught.value.delay > 0
    assert not isinstance(caught.value, AirflowFailException)


def test_a_lost_database_connection_is_temporary() -> None:
    from sqlalchemy.exc import OperationalError

    assert classify(OperationalError("SELECT 1", {}, Exception("server closed the connection"))).kind == Kind.TEMPORARY


def test_airflow_control_flow_and_sigterm_pass_through() -> None:
    for exc in (AirflowSkipException("nothing to do"), StopRequested("stopped waiting (SIGTERM)"),
                AirflowFailException("already decided")):
        with pytest.raises(type(exc)) as caught:
            _raising(exc)()
        assert caught.value is exc


def test_one_meaning_per_kind_of_wait() -> None:
    assert classify(ConvergenceTimeout("pods not ready after 1800s")).kind == Kind.TEMPORARY
    assert classify(LeaseWaitTimeout("cluster c-1 is locked by r1")).kind == Kind.PERMANENT


# ---- the delay reaches Airflow ---------------------------------------------------------------------------------


def test_the_policy_retries_a_temporary_error_after_its_delay() -> None:
    decision = TemporaryDelayPolicy().evaluate(TemporaryError("409 conflict", delay=37), try_number=1, max_tries=3)
    assert decision.action == RetryAction.RETRY and decision.retry_delay == timedelta(seconds=37)
    wrapped = TemporaryError("wrapped", delay=3)
    try:
        raise RuntimeError("outer") from wrapped
    except RuntimeError as outer:
        assert TemporaryDelayPolicy().evaluate(outer, 1, 3).retry_delay == timedelta(seconds=3)
    assert TemporaryDelayPolicy().evaluate(RuntimeError("x"), 1, 3).action == RetryAction.DEFAULT


def test_airflow_task_runner_sends_the_temporary_delay_as_the_retry_delay() -> None:
    """Airflow 3.3.2's own failure path (task_runner._handle_current_task_failed) with the policy installed by
    the boundary: the retry message carries retry_delay_seconds = TemporaryError.delay."""
    import structlog
    from airflow.sdk.execution_time import task_runner

    task = SimpleNamespace(retry_policy=None)
    assert boundary.install_retry_policy(task) and isinstance(task.retry_policy, TemporaryDelayPolicy)
    assert not boundary.install_retry_policy(task)  # a task's own policy is kept
    ti = SimpleNamespace(task=task, try_number=1, end_date=None, rendered_map_index=None,
                         _failure_metrics_emitted=True,
                         _ti_context_from_server=SimpleNamespace(should_retry=True, max_tries=3))
    msg, state = task_runner._handle_current_task_failed(ti, TemporaryError("conflict", delay=42),  # type: ignore[arg-type]
                                                         structlog.get_logger("t"))
    assert str(state).lower().endswith("up_for_retry")
    assert msg.retry_delay_seconds == 42  # type: ignore[union-attr]


def test_the_boundary_installs_the_policy_on_the_running_task(monkeypatch: pytest.MonkeyPatch) -> None:
    task = SimpleNamespace(retry_policy=None)
    monkeypatch.setattr(boundary, "_running_task", lambda: task)
    with pytest.raises(TemporaryError):
        _raising(_api(409))()
    assert isinstance(task.retry_policy, TemporaryDelayPolicy)
