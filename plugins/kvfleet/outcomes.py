"""The one vocabulary of outcomes: what a recorded step came to, what became of a write-ahead intent, and what a
run ended as. A leaf module (no kvfleet imports) so that the stages, the history repositories, the DAG tasks and
the CLI all name the same values; each value is exactly what the history database stores.

``derive_status`` turns a run's recorded steps and Airflow's end state into the run's terminal ``RunStatus``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any


class Status(enum.StrEnum):
    """What a recorded step, or a write-ahead intent's outcome, came to. A reconciler's ``Outcome`` is one of the
    first six; the others are steps the workflows record around them (gates, markers, drift remediation) and the
    result an intent is closed with. The value is what the history stores."""

    CHANGED = "changed"
    UNCHANGED = "unchanged"
    PLANNED = "planned"
    REFUSED = "refused"
    FAILED = "failed"
    REPORTED = "reported"
    PASSED = "passed"  # a wave gate that passed
    FAIL = "fail"  # a wave gate's verdict
    REVIEW = "review"
    NONE = "none"
    ADVISED = "advised"
    UNREACHABLE = "unreachable"
    DEFERRED = "deferred"
    WATCH_FAILED = "watch_failed"  # the drift watch could not watch a cluster
    CONTINUE = "continue"  # a gate decision (``kvfleet.fleet.gates``): go on with the next wave
    STOP = "stop"
    SKIP_ENDPOINTS = "skip_endpoints"
    HALT = "halt"  # a gate held by a freeze or an emergency stop (``kvfleet.airflow.halt``)
    SKIPPED = "skipped"
    SKIPPED_BY_GATE = "skipped_by_gate"
    ABORT = "abort"  # a human's (or a carried) gate decision to abort the run
    ABORTED = "aborted"
    PAUSED_FOR_REVIEW = "paused_for_review"
    OBSERVED = "observed"  # an open intent closed by a later look at the live state
    FROZEN = "frozen"  # an endpoint a freeze kept from moving (kvfleet freeze), and the run that ended so
    STOPPED = "stopped"  # the same for an emergency stop (kvfleet stop)


def status_of(value: str) -> Status:
    """``value`` as a ``Status``; a ValueError naming it and the vocabulary for anything else."""
    try:
        return Status(value)
    except ValueError:
        raise ValueError(f"outcome: {value!r} is not one of kvfleet's outcomes ({', '.join(Status)})") from None


class RunStatus(enum.StrEnum):
    """A run's terminal status (``runs.status``)."""

    SUCCESS = "success"
    COMPLETED_WITH_FAILURES = "completed_with_failures"
    FAILED = "failed"
    ABORTED = "aborted"
    REFUSED = "refused"
    FROZEN = "frozen"  # a freeze held the run at a safe point (``kvfleet.airflow.halt``)
    STOPPED = "stopped"  # an emergency stop did


# Steps that changed nothing worth an audit line of their own.
QUIET = frozenset({Status.UNCHANGED, Status.PLANNED, Status.PASSED})
FAILURES = frozenset({Status.FAILED, Status.FAIL, Status.REFUSED})
SKIPS = frozenset({Status.SKIPPED, Status.SKIPPED_BY_GATE, Status.PAUSED_FOR_REVIEW})
# A refusal of the whole run (not of one endpoint): the plan (unknown LOB, missing fleet file, bad scope) or a
# Curvine upgrade / scale-out refused by its safety gates.
REFUSAL_STAGES = frozenset({"plan", "curvine-upgrade", "curvine-scale-out"})
# What `kvfleet audit` shows for an intent nobody closed: the change may or may not have happened.
UNKNOWN = "unknown — check live state"


def _is_abort(step: Mapping[str, Any]) -> bool:
    return bool(step["outcome"] == Status.ABORTED or (step["stage"] == "gate" and step["outcome"] == Status.ABORT))


def _is_refusal(step: Mapping[str, Any]) -> bool:
    return bool(step["outcome"] == Status.REFUSED and step.get("endpoint") is None
                and step["stage"] in REFUSAL_STAGES)


def _step_reason(step: Mapping[str, Any]) -> str | None:
    detail = step.get("detail") or {}
    for k in ("error", "reason"):
        if detail.get(k):
            return str(detail[k])
    return None


def derive_status(airflow_state: str, steps: Iterable[Mapping[str, Any]],
                  open_intents: int = 0) -> tuple[RunStatus, dict[str, Any]]:
    """The terminal status of a run from Airflow's final state and the steps it recorded, with the counts
    behind it. A run held by a stop or a freeze ends ``stopped`` or ``frozen`` (a stop first). Otherwise, Airflow
    ``success``: aborted > refused > completed_with_failures > success. Airflow ``failed``:
    aborted > refused > failed (never ``success``). A write-ahead intent left without an outcome counts as a
    failure: nobody knows whether that change happened."""
    if airflow_state not in ("success", "failed"):
        raise ValueError(f"airflow_state: {airflow_state!r} is not success or failed (a DAG run's end state)")
    steps = list(steps)
    counts: dict[str, int] = {}
    for st in steps:
        counts[st["outcome"]] = counts.get(st["outcome"], 0) + 1
    held = [st for st in steps if st["outcome"] in (Status.STOPPED, Status.FROZEN)]
    aborts = [st for st in steps if _is_abort(st)]
    refusals = [st for st in steps if _is_refusal(st)]
    failures = sum(n for o, n in counts.items() if o in FAILURES)
    skipped = sum(n for o, n in counts.items() if o in SKIPS)
    facts: dict[str, Any] = {"outcomes": dict(sorted(counts.items())), "failures": failures, "skipped": skipped,
                             "open_intents": open_intents, "airflow_state": airflow_state}
    if held:  # a human held the run on purpose: that is what it ended as, before any gate's abort
        stopped = [st for st in held if st["outcome"] == Status.STOPPED]
        status = RunStatus.STOPPED if stopped else RunStatus.FROZEN
        facts["reason"] = next((r for r in map(_step_reason, stopped or held) if r), status.value)
    elif aborts:
        status = RunStatus.ABORTED
        facts["reason"] = next((r for r in map(_step_reason, aborts) if r), "aborted at a gate")
    elif refusals:
        status = RunStatus.REFUSED
        facts["reason"] = next((r for r in map(_step_reason, refusals) if r), "refused")
    elif airflow_state == "failed":
        status = RunStatus.FAILED
        errors = [st for st in steps if st["outcome"] in FAILURES and _step_reason(st)]
        if errors:
            facts["reason"] = _step_reason(errors[-1])
    elif failures or skipped or open_intents:
        status = RunStatus.COMPLETED_WITH_FAILURES
    else:
        status = RunStatus.SUCCESS
    return status, facts
