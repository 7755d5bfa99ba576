"""The policy a line of business sets for every rollout that touches it: the weakest gate and the least human
approval a run may ask for. A run may ask for more; one that asks for less is refused when it is planned
(``kvfleet.airflow.rollout.plan_rollout``), naming the policy's key and file. The policy is part of the inventory,
so a run's pinned inventory holds the policy it was held to, and ``kvfleet plan`` shows it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Final

from kvfleet.fleet.inventory.base import _described, _Model
from kvfleet.fleet.inventory.fields import _choice

# Weakest first: a run's value must stand at or after the policy's in these orders (the rollout's Params).
GATES: Final = ("none", "verify")
APPROVALS: Final = ("none", "after_canary", "every_wave")
CURVINE_APPROVALS: Final = ("never", "auto", "always")  # the Curvine upgrade's Param: auto asks on production
ORDERS: Final = {"gate": GATES, "approval": APPROVALS, "curvine_approval": CURVINE_APPROVALS}
PARAMS: Final = {"curvine_approval": "approval"}  # the DAG Param a policy key holds, where the names differ


class Policy(_Model):
    gate: Annotated[str, _choice(GATES)] = _described(
        "The weakest gate a rollout of this LOB may ask for: verify (waves go on only on verified cross-pod hits), "
        "or none.", default="none")
    approval: Annotated[str, _choice(APPROVALS)] = _described(
        "The least human approval a rollout of this LOB may ask for: none, after_canary, every_wave.",
        default="none")
    curvine_approval: Annotated[str, _choice(CURVINE_APPROVALS)] = _described(
        "The least approval a Curvine upgrade or rollback on a cluster serving this LOB may ask for: never, auto "
        "(production clusters ask), always.", default="never")

    def shown(self) -> str:
        return (f"gate {self.gate} or stronger, approval {self.approval} or more"
                + (f", Curvine approval {self.curvine_approval} or more" if self.curvine_approval != "never" else ""))


def below(lobs: Iterable[tuple[str, Policy]], source: str, **asked: str) -> list[str]:
    """What a run asking for ``asked`` (policy key -> the run's value: gate, approval, curvine_approval) lowers, for
    the LOBs it touches (name, policy): one message per policy key it asks less than, naming the key, the file, the
    floor and what the run asked."""
    out = []
    for name, policy in lobs:
        for key, wanted in asked.items():
            order, floor = ORDERS[key], getattr(policy, key)
            if order.index(wanted) < order.index(floor):
                param = PARAMS.get(key, key)
                out.append(f"{source}: lobs.{name}.policy.{key} is {floor}, and the run asks for {param} {wanted}: "
                           f"run with {param} {' or '.join(order[order.index(floor):])}, or leave {name} out of its "
                           "scope (the policy is the inventory's, not the run's)")
    return out


def unheld(plan: Any, source: str, *, canary: bool, approval: str, slots: int) -> list[str]:
    """What in a rollout's shape would let an approval floor ask no human although the run asks the right value:
    ``after_canary`` with no canary wave (one wave: nothing comes after it to approve), and ``every_wave`` on a
    cluster with more waves than the rollout gates one by one (its last of ``slots`` runs the rest back to back).
    ``plan``: a ``kvfleet.fleet.plan.Plan``."""
    out = []
    for lob, policy in plan.policy:
        if policy.approval == "after_canary" and approval == "after_canary" and not canary:
            out.append(f"{source}: lobs.{lob}.policy.approval is after_canary, and the run has no canary wave for "
                       "a human to approve after: run with canary true (or approval every_wave)")
        if policy.approval == "every_wave":
            for c in plan.clusters:
                if len(c.waves) > slots and any(e.lob == lob for w in c.waves for e in w.endpoints):
                    out.append(f"{source}: lobs.{lob}.policy.approval is every_wave, and cluster {c.key} has "
                               f"{len(c.waves)} waves, more than the {slots} a rollout approves one by one (its "
                               "last runs the rest back to back): raise wave_size, or narrow the run's scope")
    return out
