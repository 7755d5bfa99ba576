"""stages.base.Outcome: frozen, with a str-valued status enum, and ``as_dict`` exactly as the history stores it."""

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
