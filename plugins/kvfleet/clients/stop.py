"""The stop flag: after SIGTERM kvfleet stops waiting and starts no new change.

Airflow 3.3 ends a task with SIGTERM (the supervisor's ``kill(SIGTERM, force=True)``: on a heartbeat answered 404,
409 or 410, "the task shouldn't be running anymore", on too many failed heartbeats, on a task success overtime;
SIGKILL follows about 5 s later). The task runner's own handler only calls the operator's ``on_kill`` and returns,
so the task's code would go on where it was. ``install_sigterm_handler`` sets this module's flag first
(``request_stop`` sets it without a signal, ``reset_stop`` clears it), and then:

- every kvfleet wait (``kube.wait_for``, ``kube.sleep_or_stop``, the lease waits) ends with ``StopRequested``;
- **no new mutating call starts**, whichever stage makes it, refused where the call leaves the process:
  - AWS: a botocore ``before-call`` hook on every boto3 client ``clients.aws.client`` builds refuses any operation
    that is not a read (``is_read_only``: Describe*, List*, Get*, ...; STS AssumeRole, which only hands out
    credentials for the reads);
  - Kubernetes: the ``ApiClient`` that ``kube.ClusterAccess`` builds (``kube.StopGuardedApiClient``) refuses POST,
    PUT, PATCH and DELETE, a server dry run (``dryRun=All``: it persists nothing) excepted, and POSTs through the
    pod proxy too (they reach a pod's own API, which kvfleet cannot tell from a change);
  - helm: ``Helm.run`` refuses install, upgrade, rollback and uninstall before the process starts (an upgrade
    rendered with ``--dry-run`` is a read);
  - and ``StageContext.write_ahead`` opens no new intent row (belt and braces: the refusal names the action).
  Each refusal raises ``StopRequested`` naming the call; reads stay allowed, and so does the history (recording
  outcomes, releasing leases: the database is not the fleet).
- What was changed before the stop stays recorded: a write-ahead intent whose call was refused, or was cut short,
  gets its outcome row from ``AuditLog.write_ahead`` like any failure.

**What is still done after a stop** (``allow_after_stop``): the undo steps of a sequence already under way, so a
stop never leaves the fleet less available than it found it. ``StageContext.write_ahead`` runs exactly these
kinds of action inside ``allow_after_stop`` (``stages.base.AFTER_STOP``): the operator restore, an endpoint's scale
back from 0 to its recorded replicas, an endpoint's original rollout strategy put back, and the flip of the Curvine
format flags to false after a first install. Nothing else is; each still has its write-ahead rows.

Why a scope per action rather than "the restore path is exempt": the exemption is bound to the one recorded call
inside one ``write_ahead`` of a named kind, in the thread that runs it (a context variable: another thread, or the
next call of the same teardown, is not exempted). A rule that matched the restore on the wire (a PATCH of the
operator's Deployment to N replicas) would also let a forward change of that object through; a process-wide
switch, once flipped, would let everything through.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator
from typing import Any

from kvfleet.errors import KvfleetError

log = logging.getLogger(__name__)


class StopRequested(KvfleetError):
    """SIGTERM (or ``request_stop``) arrived: stop now, start no new change, run the ``finally`` blocks (the
    operator restore, the lease release) and let the task end."""


_STOP = threading.Event()
# Why the current thread (or task) may still change the fleet after a stop (``allow_after_stop``); None: it may not.
_ALLOWED: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvfleet_allowed_after_stop", default=None)
_handler_installed = False

# AWS operations that change nothing although their names do not say so: AssumeRole hands out the credentials the
# reads are signed with (an assumed role's clients call it again before their credentials expire).
_AWS_READ_ALSO = frozenset({"AssumeRole", "AssumeRoleWithWebIdentity", "GetCallerIdentity"})
_AWS_READ_PREFIXES = ("Describe", "List", "Get", "Head", "Search", "Query", "Scan", "BatchGet", "BatchDescribe",
                      "Lookup", "Select", "Simulate")


def request_stop() -> None:
    _STOP.set()


def stop_requested() -> bool:
    return _STOP.is_set()


def reset_stop() -> None:
    _STOP.clear()


@contextlib.contextmanager
def allow_after_stop(why: str) -> Iterator[None]:
    """Within it, this thread's (or task's) mutating calls go through after a stop: only for the undo steps named in
    the module docstring, one call at a time (``StageContext.write_ahead`` is the one user)."""
    token = _ALLOWED.set(why)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def refuse_if_stopped(what: str) -> None:
    """Raise ``StopRequested`` naming ``what`` when a stop was requested and this call is not an allowed undo."""
    if _STOP.is_set() and _ALLOWED.get() is None:
        log.warning("stop requested: %s not started", what)
        raise StopRequested(f"{what}: not started: a stop was requested (SIGTERM); kvfleet starts no new change "
                            "after it")


def is_read_only(operation: str) -> bool:
    """An AWS operation (its API name, e.g. ``DescribeCluster``) that changes nothing."""
    return operation in _AWS_READ_ALSO or operation.startswith(_AWS_READ_PREFIXES)


_AWS_HOOK_ID = "kvfleet-refuse-after-stop"


def _refuse_aws_change(model: Any = None, **_: Any) -> None:
    name = str(getattr(model, "name", "") or "")
    if not is_read_only(name):
        service = getattr(getattr(model, "service_model", None), "service_name", "aws")
        refuse_if_stopped(f"AWS {service} {name}")


def refusing_changes_after_stop(boto_client: Any) -> Any:
    """``boto_client`` with the hook that refuses a mutating operation once a stop is requested (before botocore
    builds the request). Registered once per client (a unique id: registering again changes nothing)."""
    boto_client.meta.events.register_first("before-call", _refuse_aws_change, unique_id=_AWS_HOOK_ID)
    return boto_client


def install_sigterm_handler() -> None:
    """On SIGTERM, set the stop flag (every wait ends, no new change starts), then call the handler that was there
    before (Airflow's task runner calls the operator's ``on_kill`` from it). Idempotent; only possible in the main
    thread (elsewhere the flag can still be set with ``request_stop``)."""
    global _handler_installed
    import signal

    if _handler_installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        _STOP.set()
        log.warning("SIGTERM: kvfleet stops waiting and starts no new change (undo steps still run)")
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise StopRequested("SIGTERM received")

    signal.signal(signal.SIGTERM, on_sigterm)
    _handler_installed = True
