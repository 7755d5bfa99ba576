"""The policy a line of business sets for every rollout that touches it: the weakest gate and the least human
approval a run may ask for. A run may ask for more; one that asks for less is refused when it is planned
(``kvfleet.airflow.rollout.plan_rollout``), naming the policy's key and file. The policy is part of the inventory,
so a run's pinned inventory holds the policy it was held to, and ``kvfleet plan`` shows it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Final

from kvfleet.fleet.inventory.base import _described, _Model
from kvfleet.fleet.inventory.fields import _choice

# Weakest first: a run's value must stand at or after the policy's in these orders (the rollout's Params).
GATES: Final = ("none", "verify")
APPROVALS: Final = ("none", "after_canary", "every_wave")


class Policy(_Model):
    gate: Annotated[str, _choice(GATES)] = _described(
        "The weakest gate a rollout of this LOB may ask for: verify (waves go on only on verified cross-pod hits), "
        "or none.", default="none")
    approval: Annotated[str, _choice(APPROVALS)] = _described(
        "The least human approval a rollout of this LOB may ask for: none, after_canary, every_wave.",
        default="none")

    def shown(self) -> str:
        return f"gate {self.gate} or stronger, approval {self.approval} or more"


def below(lobs: Iterable[tuple[str, Policy]], source: str, *, gate: str, approval: str) -> list[str]:
    """What a rollout asking for ``gate`` and ``approval`` lowers, for the LOBs it touches (name, policy): one
    message per policy key it asks less than, naming the key, the file, the floor and what the run asked."""
    out = []
    for name, policy in lobs:
        for key, order, floor, asked in (("gate", GATES, policy.gate, gate),
                                         ("approval", APPROVALS, policy.approval, approval)):
            if order.index(asked) < order.index(floor):
                out.append(f"{source}: lobs.{name}.policy.{key} is {floor}, and the run asks for {key} {asked}: "
                           f"run with {key} {' or '.join(order[order.index(floor):])}, or leave {name} out of its "
                           "scope (the policy is the inventory's, not the run's)")
    return out
