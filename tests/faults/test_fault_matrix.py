"""The fault matrix: every (step, fault) case against the twin, then the promises checked: no L2 file
lost, the operator running, every endpoint at its declared ready replicas, no lease held by a dead holder, the
history showing the run with a terminal status, a second run converging and a third making no mutating call.

The full matrix is marked ``faults`` (``make faults``: KVFLEET_FAULTS=1); the unmarked slice below covers every
fault kind and every step once and runs in ``make test``. Cases share the module's sandbox; each gives its step
work of its own (see ``faultkit.FaultEnv.prepare``), so their order does not matter."""

from __future__ import annotations

import json
import os

import pytest
from faultkit import FAULTS, SIGKILL_STEPS, STEPS

pytestmark = pytest.mark.integration

# The always-run slice: each fault kind once, each step once.
SLICE = [
    ("stage1_update_cluster", "5xx_20pct"),
    ("stage2_addon", "conflict_409"),
    ("stage3_curvine", "network_failure"),
    ("kyverno_policy", "latency_1s"),
    ("stage4_patch_wave", "sigkill"),
    ("drift_remediation", "conflict_409"),
]
FULL = [(s, f) for s in STEPS for f in FAULTS if (s, f) not in SLICE and (f != "sigkill" or s in SIGKILL_STEPS)]
# Known product bugs, kept in the matrix: (step, fault) -> reason (strict xfail: fixing the bug turns it red).
KNOWN: dict[tuple[str, str], str] = {}


def _cases(pairs: list[tuple[str, str]], *marks: pytest.MarkDecorator) -> list[object]:
    out: list[object] = []
    for step, fault in pairs:
        extra = [pytest.mark.xfail(strict=True, reason=KNOWN[(step, fault)])] if (step, fault) in KNOWN else []
        out.append(pytest.param(step, fault, marks=[*marks, *extra], id=f"{step}-{fault}"))
    return out


def _check(fault_env, step: str, fault: str) -> None:  # type: ignore[no-untyped-def]
    result = fault_env.run_case(step, fault)
    out = os.environ.get("KVFLEET_FAULT_MATRIX_OUT")
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(result.as_dict(), default=str) + "\n")
    broken = {k: v for k, v in result.invariants.items() if not v}
    assert not broken, json.dumps(result.as_dict(), default=str, indent=1)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("step", "fault"), _cases(SLICE))
def test_fault_slice(fault_env, step: str, fault: str) -> None:  # type: ignore[no-untyped-def]
    _check(fault_env, step, fault)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("step", "fault"), _cases(FULL, pytest.mark.faults))
def test_fault_matrix(fault_env, step: str, fault: str) -> None:  # type: ignore[no-untyped-def]
    _check(fault_env, step, fault)
