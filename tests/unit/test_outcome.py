"""kvfleet.outcomes: one str-valued vocabulary for stages.base.Outcome and the history, ``as_dict`` exactly as the
history stores it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvfleet.outcomes import Status
from kvfleet.stages.base import Outcome


def test_an_outcome_cannot_be_changed() -> None:
    out = Outcome("curvine", "c-1", Status.CHANGED, {"csi": "unchanged"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.outcome = Status.FAILED  # type: ignore[misc]
    with pytest.raises(TypeError):
        out.detail["csi"] = "changed"  # type: ignore[index]
    assert dataclasses.replace(out, outcome=Status.FAILED).outcome is Status.FAILED and out.outcome is Status.CHANGED


def test_the_detail_is_a_copy_of_what_the_reconciler_passed() -> None:
    detail: dict[str, object] = {"pvcs": {"a": "changed"}}
    out = Outcome("curvine", "c-1", Status.CHANGED, detail)
    detail["later"] = 1
    assert "later" not in out.detail


def test_as_dict_is_the_stored_shape() -> None:
    out = Outcome("endpoint", "c-1", "refused", {"reason": "no L2"}, endpoint="c-1:ns/a")  # type: ignore[arg-type]
    assert out.outcome is Status.REFUSED and out.outcome.value == "refused"
    as_dict = out.as_dict()
    assert as_dict == {"stage": "endpoint", "cluster": "c-1", "endpoint": "c-1:ns/a", "outcome": "refused",
                       "detail": {"reason": "no L2"}}
    assert type(as_dict["outcome"]) is str and type(as_dict["detail"]) is dict
    assert json.loads(json.dumps(as_dict)) == as_dict


def test_an_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="'chnaged'"):
        Outcome("curvine", "c-1", "chnaged")  # type: ignore[arg-type]


def test_a_history_step_takes_only_the_one_vocabulary() -> None:
    """The history's StepEvent and the stages' Outcome share kvfleet.outcomes.Status: a raw string of it is taken
    as the member, any other is refused naming it, before anything is written."""
    from kvfleet.history.keys import StepEvent

    assert StepEvent("plan", "plan", "planned").outcome is Status.PLANNED
    assert StepEvent("gate_response:g", "gate", "skip_endpoints").outcome is Status.SKIP_ENDPOINTS
    with pytest.raises(ValueError, match=r"outcome: 'chnaged' is not one of kvfleet's outcomes \(changed, "):
        StepEvent("s", "curvine", "chnaged")


def test_derive_status_reads_the_stored_strings_as_the_vocabulary() -> None:
    from kvfleet.outcomes import RunStatus, derive_status

    steps = [{"stage": "endpoint", "outcome": "changed"}, {"stage": "gate", "outcome": "abort",
                                                           "detail": {"reason": "Abort by dana"}}]
    assert derive_status("success", steps) == (RunStatus.ABORTED, {
        "outcomes": {"abort": 1, "changed": 1}, "failures": 0, "skipped": 0, "open_intents": 0,
        "airflow_state": "success", "reason": "Abort by dana"})
    assert derive_status("success", [{"stage": "x", "outcome": "skipped_by_gate"}])[0] is RunStatus.COMPLETED_WITH_FAILURES
