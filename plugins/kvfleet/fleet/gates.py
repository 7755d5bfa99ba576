"""Wave gates of a rollout: what a wave's verification results mean for the waves after it.

Pure. Used by the rollout's wave tasks and by the gate operator between them. The rules:
- every endpoint ``pass`` -> go on (unless a human approval is asked for: ``after_canary``, ``every_wave``);
- any ``fail`` -> stop that cluster's later waves (``skipped_by_gate``); endpoints that already moved stay;
- ``degraded`` or ``unverifiable`` (inconclusive) -> pause for a human: approve, skip the endpoint, or abort.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CONTINUE, STOP, ABORT, ASK_REVIEW, ASK_APPROVAL = "continue", "stop", "abort", "ask_review", "ask_approval"
HALT = "halt"  # a freeze or an emergency stop held the cluster at a safe point (kvfleet.airflow.halt): carried on
CARRIED = (STOP, ABORT, HALT)  # decisions a gate passes on to the cluster's later slots as they are
REVIEW_OPTIONS = ("Approve", "Skip endpoint", "Abort")
APPROVAL_OPTIONS = ("Approve", "Reject")


def wave_verdict(results: Iterable[Mapping[str, Any]]) -> str:
    verdicts = [r.get("verdict") for r in results]
    if not verdicts:
        return "none"
    if "fail" in verdicts:
        return "fail"
    if any(v in ("degraded", "unverifiable") for v in verdicts):
        return "review"
    return "pass"


def gate_decision(verdict: str, *, gate: str, approval: str, slot: int, has_next: bool) -> tuple[str, str]:
    """(decision, reason) after a wave. ``slot`` 0 is the canary wave."""
    if verdict in ("stopped", "none"):
        return CONTINUE, "no wave in this slot"
    if gate == "verify" and verdict == "fail":
        return STOP, "verification failed: later waves of this cluster are skipped_by_gate"
    if gate == "verify" and verdict == "review":
        return ASK_REVIEW, "verification inconclusive (degraded or unverifiable): a human decides"
    if has_next and (approval == "every_wave" or (approval == "after_canary" and slot == 0)):
        return ASK_APPROVAL, f"approval={approval}: a human approves the next wave"
    return CONTINUE, "gate passed" if gate == "verify" else "gate=none"


def decision_from_response(kind: str, chosen: str) -> str:
    """Map a human's chosen option to a decision."""
    if kind == ASK_APPROVAL:
        return CONTINUE if chosen == "Approve" else ABORT
    return {"Approve": CONTINUE, "Skip endpoint": "skip_endpoints", "Abort": ABORT}[chosen]
