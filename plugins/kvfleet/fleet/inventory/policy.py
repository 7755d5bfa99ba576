"""The policy a line of business sets for every rollout that touches it: the weakest gate and the least human
approval a run may ask for. A run may ask for more; one that asks for less is refused when it is planned
(``kvfleet.airflow.rollout.plan_rollout``), naming the policy's key and file. The policy is part of the inventory,
so a run's pinned inventory holds the policy it was held to, and ``kvfleet plan`` shows it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Final

from pydantic import Field

from kvfleet.fleet.inventory.base import Bool, _described, _Model
from kvfleet.fleet.inventory.fields import _choice, _text

# Weakest first: a run's value must stand at or after the policy's in these orders (the rollout's Params).
GATES: Final = ("none", "verify")
APPROVALS: Final = ("none", "after_canary", "every_wave")
CURVINE_APPROVALS: Final = ("never", "auto", "always")  # the Curvine upgrade's Param: auto asks on production
SCHEDULED: Final = ("apply", "plan")  # what the daily (scheduled) rollout does on a production cluster of the LOB
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
    scheduled: Annotated[str, _choice(SCHEDULED)] = _described(
        "What the scheduled daily rollout does on the production clusters serving this LOB: apply, or plan (it "
        "leaves those clusters out and records them planned; a run a human triggers applies them, held to this "
        "policy).", default="apply")
    four_eyes: Bool = _described(
        "A human answer to a gate of a run touching this LOB counts only from someone other than the user who "
        "triggered the run (Airflow's triggering user).", default=False)
    responders: Annotated[list[Annotated[str, _text(max_len=256, numbers=False)]], Field(max_length=50)] = \
        _described("The Airflow users (their IDs, as the auth manager reports them) who may answer a gate of a run "
                   "touching this LOB (Airflow's HITL assigned_users); empty: anyone Airflow lets answer.",
                   default_factory=list)

    def shown(self) -> str:
        return (f"gate {self.gate} or stronger, approval {self.approval} or more"
                + (f", Curvine approval {self.curvine_approval} or more" if self.curvine_approval != "never" else "")
                + (", the daily run only plans its production clusters" if self.scheduled == "plan" else "")
                + (", four eyes" if self.four_eyes else "")
                + (f", answered by {', '.join(self.responders)}" if self.responders else ""))


def respondents(lobs: Iterable[tuple[str, Policy]], triggered_by: str | None) -> tuple[list[str] | None, bool]:
    """Who may answer a gate of a run touching ``lobs`` (name, policy), triggered by ``triggered_by`` (None: by the
    scheduler), and whether four eyes apply. Each LOB that names responders narrows the set to those it names (a
    gate answers for every LOB it holds back); four eyes take the triggering user out. None: anyone Airflow lets
    answer; an empty list: nobody can, which the plan refuses (:func:`unanswerable`)."""
    policies = [p for _, p in lobs]
    four_eyes = any(p.four_eyes for p in policies)
    named = [set(p.responders) for p in policies if p.responders]
    if not named:
        return None, four_eyes
    allowed = set.intersection(*named) - ({triggered_by} if four_eyes and triggered_by else set())
    return sorted(allowed), four_eyes


def unanswerable(lobs: Iterable[tuple[str, Policy]], source: str, triggered_by: str | None) -> list[str]:
    """A run whose gates nobody could answer: the responders of its LOBs share no one (but, under four eyes, the
    user who triggered it)."""
    lobs = list(lobs)
    allowed, four_eyes = respondents(lobs, triggered_by)
    if allowed is None or allowed:
        return []
    names = [f"lobs.{n}.policy.responders" for n, p in lobs if p.responders]
    but = f" but {triggered_by}, who triggered the run (four eyes)" if four_eyes and triggered_by else ""
    named = f"{names[0]} names no one" if len(names) == 1 else f"{', '.join(names)} name no one in common"
    return [f"{source}: {named}{but}, so no one could answer this run's gates: have another user trigger it, narrow "
            "its scope to LOBs that share a responder, or add one to their responders"]


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


def left_to_humans(plan: Any, production: Iterable[str], source: str, *,
                   run: dict[str, str]) -> tuple[list[str], list[str]]:
    """What a scheduled run leaves out, and why: (the cluster keys, one message per cluster). A production cluster
    (``production``: their keys) serving a LOB whose policy says ``scheduled: plan``; and every cluster serving a
    LOB whose floor the run's Params (``run``: gate, approval) do not meet, where a run a human triggers would be
    refused (``below``)."""
    production = set(production)
    keys: dict[str, str] = {}
    for lob, policy in plan.policy:
        lowered = below([(lob, policy)], source, **run)
        for c in plan.clusters:
            serves = any(e.lob == lob for w in c.waves for e in w.endpoints)
            if serves and lowered:
                keys.setdefault(c.key, "; ".join(lowered))
            elif serves and c.key in production and policy.scheduled == "plan":
                keys.setdefault(c.key, f"{source}: lobs.{lob}.policy.scheduled is plan, and {c.key} is a production "
                                       "cluster: trigger kvfleet_rollout by hand to apply it")
    return sorted(keys), [f"{k}: {why}" for k, why in sorted(keys.items())]
