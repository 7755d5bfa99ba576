"""Format-flag rules and the rollout's gate rules."""

from __future__ import annotations

import copy

from kvfleet.fleet import curvine_values as cv
from kvfleet.fleet import gates
from kvfleet.fleet.economics import expected_speedup


def test_flags_are_read_from_strings_and_booleans() -> None:
    assert cv.flags_set({"cluster": {"formatMaster": "true", "formatWorker": False}}) == ["formatMaster"]
    assert cv.flags_of({}) == {"formatMaster": None, "formatWorker": None, "formatJournal": None}


def test_rollback_target_is_the_newest_safe_revision_never_the_install() -> None:
    install = {"cluster": {"formatMaster": True, "formatWorker": True, "formatJournal": True}}
    safe = {"cluster": {"formatMaster": False, "formatWorker": False, "formatJournal": False}}
    history = [(1, install), (2, safe), (3, safe), (4, {"cluster": {"formatMaster": True}})]
    assert cv.newest_safe_revision(history, before=5) == 3
    assert cv.newest_safe_revision(history, before=3) == 2
    assert cv.newest_safe_revision([(1, install)], before=2) is None


def test_merged_values_layer_defaults_current_overrides_without_mutating_inputs() -> None:
    current = {"cluster": {"formatMaster": False}, "worker": {"replicas": 2}}
    before = copy.deepcopy(current)
    merged = cv.merged_values(current, {"cluster.formatWorker": True}, {"cluster": {"formatJournal": True}, "x": 1})
    assert merged["cluster"] == {"formatMaster": False, "formatWorker": True, "formatJournal": True}
    assert merged["x"] == 1 and current == before
    assert cv.overrides_setting_flags({"cluster.formatMaster": "true", "worker.replicas": 4}) == ["cluster.formatMaster"]


def test_gate_rules() -> None:
    assert gates.wave_verdict([{"verdict": "pass"}, {"verdict": "pass"}]) == "pass"
    assert gates.wave_verdict([{"verdict": "pass"}, {"verdict": "unverifiable"}]) == "review"
    assert gates.wave_verdict([{"verdict": "degraded"}, {"verdict": "fail"}]) == "fail"
    kw = {"gate": "verify", "approval": "none", "slot": 0, "has_next": True}
    assert gates.gate_decision("fail", **kw)[0] == gates.STOP
    assert gates.gate_decision("review", **kw)[0] == gates.ASK_REVIEW
    assert gates.gate_decision("pass", **kw)[0] == gates.CONTINUE
    assert gates.gate_decision("pass", **{**kw, "approval": "after_canary"})[0] == gates.ASK_APPROVAL
    assert gates.gate_decision("pass", **{**kw, "approval": "after_canary", "slot": 1})[0] == gates.CONTINUE
    assert gates.gate_decision("pass", **{**kw, "approval": "every_wave", "has_next": False})[0] == gates.CONTINUE
    assert gates.decision_from_response(gates.ASK_APPROVAL, "Reject") == gates.ABORT
    assert gates.decision_from_response(gates.ASK_REVIEW, "Skip endpoint") == "skip_endpoints"


def test_expected_speedup_follows_the_published_curve() -> None:
    assert expected_speedup(500, "ml.g5.4xlarge") == 0.99
    assert expected_speedup(1000, "ml.g5.4xlarge") == 1.7
    assert expected_speedup(2500, "ml.g5.4xlarge") == 2.7
    assert 1.7 < expected_speedup(1750, "ml.g5.4xlarge") < 2.7
    assert expected_speedup(5000, "ml.g5.4xlarge") == 2.7  # flat after ~2,500
