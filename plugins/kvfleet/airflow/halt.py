"""Where kvfleet's mutating runs honour a freeze or an emergency stop (``kvfleet freeze``, ``kvfleet stop``; the
holds themselves are ``kvfleet.history.holds``).

- **At a start** (:func:`refuse_start`): a mutating run (not a dry run) whose scope a freeze covers is refused
  before it changes anything, with the freeze's reason and who froze, recorded as a ``freeze`` step (refused).
- **At a safe point** (:func:`held`): between a rollout's stages 1–3 and before each wave, never inside one. A
  wave in flight finishes its own safe sequence (its endpoints rolled and ready, the operator it paused restored);
  the waves after it are not started: their endpoints are recorded ``frozen`` or ``stopped``, the teardown
  restores the operator and frees the lease as after any run, and the run ends ``frozen`` or ``stopped``.

A stop holds only the runs in flight when it was given (``Holds.holding``), a freeze every run in its scope for
as long as it is on; either way, once a run sees a hold at a safe point, its later safe points see it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kvfleet.errors import PermanentError
from kvfleet.history.holds import FREEZE, Hold
from kvfleet.history.keys import StepEvent
from kvfleet.history.repos import HistoryRepos
from kvfleet.outcomes import Status

if TYPE_CHECKING:
    from kvfleet.stages.base import StageContext

OUTCOME = {FREEZE: Status.FROZEN.value}  # a stop: Status.STOPPED


def outcome_of(hold: Hold) -> str:
    """What the endpoints a hold kept from moving are recorded as (and the run ends as): frozen or stopped."""
    return OUTCOME.get(hold.kind, Status.STOPPED.value)


def _started(history: HistoryRepos, run_key: str) -> datetime:
    run = history.runs.get(run_key) or {}
    started = run.get("started_at")
    return started if isinstance(started, datetime) else datetime.now(UTC)


def hold_on(history: HistoryRepos, run_key: str, clusters: Iterable[str], lobs: Iterable[str]) -> Hold | None:
    """The freeze or stop that holds this run back on ``clusters`` (keys) and ``lobs`` now, or None."""
    return history.holds.holding(run_key, _started(history, run_key), sorted(set(clusters)), sorted(set(lobs)))


def refuse_start(history: HistoryRepos, step_key: Any, *, run_key: str, actor: str, clusters: Iterable[str],
                 lobs: Iterable[str]) -> None:
    """A mutating run's start: refused (PermanentError, recorded as a refusal of the run: stage ``plan``) when a
    freeze or a stop covers its scope."""
    hold = hold_on(history, run_key, clusters, lobs)
    if hold is None:
        return
    history.runs.record_step(step_key, StepEvent(step=hold.kind, stage="plan", outcome="refused",
                                                 detail={"reason": hold.message, "hold": hold.as_dict()}),
                             actor=actor)
    raise PermanentError(f"the run does not start, nothing was changed: {hold.message}")


def held(ctx: StageContext) -> dict[str, Any] | None:
    """At a safe point of ``ctx``'s cluster (the LOBs with endpoints on it): what the task carries when a hold
    applies (``outcome``: frozen or stopped, and the hold's message as ``reason``), or None to go on. A dry run
    changes nothing, so nothing holds it."""
    if ctx.dry_run or ctx.step_key is None:
        return None
    lobs = {e.lob for e in ctx.inventory.endpoints_of(ctx.cluster.key)}
    return carried(hold_on(ctx.history or HistoryRepos.on(), ctx.step_key.run_key, [ctx.cluster.key], lobs))


def carried(hold: Hold | None) -> dict[str, Any] | None:
    """What a task carries on for ``hold`` (None: nothing)."""
    return None if hold is None else {"outcome": outcome_of(hold), "reason": hold.message, "hold_id": hold.id}
