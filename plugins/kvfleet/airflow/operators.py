"""kvfleet's operators: the deferrable task (``deferrable_task``, docs/reference/airflow.md#deferral) and the wave
gate.

``deferrable_task`` is ``@task`` whose body may wait in the triggerer instead of a worker slot: the body (the
task bodies in ``kvfleet.airflow.rollout``) raises Airflow's ``TaskDeferred`` naming ``resume``, with what it had
done so far as ``kvfleet_resume``; when the trigger fires, ``resume`` calls the same body again with that state
and the trigger's event (``kvfleet_resume["event"]``). The body stays a plain function: outside Airflow it never
defers unless it must wait, and its arguments are those of ``@task`` (XComArgs, mapped task group arguments).

The wave gate: a Human-in-the-loop operator (the standard provider's ``HITLOperator``) that only asks when
it must.

It sits between two wave slots of a cluster in `kvfleet_rollout`. It reads the previous wave's result and
decides with ``fleet.gates``: a clean pass goes on without a human; a failed verification stops the cluster's
later waves; an inconclusive verification (degraded/unverifiable) asks "Approve / Skip endpoint / Abort";
``approval=after_canary|every_wave`` asks "Approve / Reject" (the ApprovalOperator's options). A timeout takes
the safe default (Abort / Reject). Lives in the installed package, as Airflow requires for deferrable and
awaiting-input operators.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow.providers.standard.decorators.python import _PythonDecoratedOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator, HITLOperator
from airflow.sdk.bases.decorator import task_decorator_factory

from kvfleet.fleet import gates

ALL_OPTIONS = [*gates.REVIEW_OPTIONS, "Reject"]
RESUME_METHOD = "resume"
RESUME_KEY = "kvfleet_resume"

# Airflow pools for kvfleet's mutating tasks, one per concurrency class: name -> (slots, description). Created by
# tools/up.sh (`airflow pools set`) and documented in docs/run-for-real.md; a deployment creates them once (an
# Airflow task assigned to a pool that does not exist is never scheduled). A deferred task holds no pool slot
# (pools count deferred tasks only with include_deferred, which kvfleet leaves off), so a wait costs no slot.
CLUSTER_POOL = "kvfleet_cluster_changes"
ENDPOINT_POOL = "kvfleet_endpoint_waves"
POOLS: dict[str, tuple[int, str]] = {
    CLUSTER_POOL: (8, "kvfleet: clusters changed at once across runs (UpdateCluster, EKS add-ons, Curvine helm; "
                      "the rollout teardown runs outside it, in default_pool)"),
    ENDPOINT_POOL: (16, "kvfleet: endpoint waves rolled and verified at once across runs and clusters"),
}


class DeferrableTaskOperator(_PythonDecoratedOperator):
    """``@task`` that can be resumed after a deferral raised by its own body (module docstring)."""

    custom_operator_name = "@task"

    def resume(self, context: Any, event: Any = None, **kwargs: Any) -> Any:
        state = dict(kwargs.get(RESUME_KEY) or self._saved_state(context) or {})
        # kvfleet's triggers send a dict with a status; the standard DateTimeTrigger sends the moment it fired.
        state["event"] = dict(event) if isinstance(event, dict) else {"status": "success", "value": str(event)}
        self.op_kwargs = {**self.op_kwargs, RESUME_KEY: state}
        return self.execute(context)

    def _saved_state(self, context: Any) -> Any:
        """The state the body saved as an XCom before deferring (``kvfleet.airflow.rollout._defer``)."""
        ti = context.get("ti")
        if ti is None:
            return None
        return ti.xcom_pull(task_ids=self.task_id, key=RESUME_KEY, map_indexes=ti.map_index)


def deferrable_task(python_callable: Any = None, **kwargs: Any) -> Any:
    """``@task``, deferrable by its body: ``@deferrable_task(task_id=..., pool=...)``."""
    return task_decorator_factory(python_callable=python_callable, decorated_operator_class=DeferrableTaskOperator,
                                  **kwargs)


class WaveGateOperator(HITLOperator):
    def __init__(self, *, wave_task_id: str, slot: int, response_timeout: timedelta = timedelta(hours=2),
                 **kwargs: Any) -> None:
        super().__init__(subject="kvfleet rollout gate", options=list(ALL_OPTIONS), defaults=["Abort"],
                         response_timeout=response_timeout, **kwargs)
        self.wave_task_id = wave_task_id
        self.slot = slot

    def _wave(self, context: Any) -> dict[str, Any]:
        ti = context["ti"]
        return dict(ti.xcom_pull(task_ids=self.wave_task_id, map_indexes=ti.map_index) or {})

    def _decide(self, context: Any) -> tuple[str, str, dict[str, Any]]:
        wave = self._wave(context)
        params = context["params"]
        if wave.get("carry") in gates.CARRIED:
            return wave["carry"], wave.get("reason") or "carried from an earlier gate", wave
        decision, reason = gates.gate_decision(wave.get("verdict", "none"), gate=params.get("gate", "verify"),
                                               approval=params.get("approval", "none"), slot=self.slot,
                                               has_next=bool(wave.get("has_next")))
        return decision, reason, wave

    def execute(self, context: Any) -> Any:
        decision, reason, wave = self._decide(context)
        self.log.info("gate after slot %s on %s: %s (%s)", self.slot, wave.get("cluster"), decision, reason)
        inv = _scope(context) if decision in (gates.ASK_REVIEW, gates.ASK_APPROVAL) else None
        if inv is not None and (held := _held(context, wave, inv)) is not None:
            # a freeze or a stop since the wave: no human is asked; the later slots record their endpoints held
            decision, reason, wave = gates.HALT, held["reason"], {**wave, "held": held}
        if decision not in (gates.ASK_REVIEW, gates.ASK_APPROVAL):
            return {"decision": decision, "reason": reason, "cluster": wave.get("cluster"), "by": "kvfleet",
                    **({"held": wave["held"]} if wave.get("held") else {})}
        if decision == gates.ASK_REVIEW:
            self.options, self.defaults = list(gates.REVIEW_OPTIONS), ["Abort"]
        else:
            self.options, self.defaults = list(gates.APPROVAL_OPTIONS), ["Reject"]
        self.assigned_users = Respondents.of(context, wave.get("key"), inv).assigned()
        # The form a human reads: which run, cluster and wave, the verifications and open drift as evidence, and
        # what each option does (kvfleet.airflow.gates; the history is read, and a gate opens even without it).
        from kvfleet.airflow import gates as gate_text
        from kvfleet.airflow.context import run_info

        text = gate_text.for_wave_gate(asked=decision, run_key=run_info(dict(context)).run_key, wave=wave,
                                       reason=reason, params=context["params"], slot=self.slot,
                                       options=self.options, default=self.defaults[0],
                                       timeout=self.response_timeout)
        self.subject, self.body = text.subject, text.body
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        payload = super().execute_complete(context, event)
        decision, _, wave = self._decide(context)
        chosen = next(iter(payload["chosen_options"]))
        by = payload.get("responded_by_user") or {}
        who = by.get("name") if isinstance(by, dict) else str(by or "timeout")
        inv = _scope(context)
        refused = Respondents.of(context, wave.get("key"), inv).refusal(by)
        if refused:  # the answer does not count: the gate takes its safe default
            self.log.warning("%s", refused)
            chosen = "Abort" if decision == gates.ASK_REVIEW else "Reject"
        result = gates.decision_from_response(decision, chosen)
        held = _held(context, wave, inv)
        if held is not None:  # a stop or a freeze given while it waited: held, whatever the answer (even Approve)
            result = gates.HALT
        self.log.info("human response on %s: %s -> %s (by %s)", wave.get("cluster"), chosen, result, who)
        from kvfleet.airflow.context import run_info
        from kvfleet.history.keys import StepEvent
        from kvfleet.history.runs import Runs

        info = run_info(dict(context))
        Runs().record_step(info.step_key, StepEvent(
            step=f"gate_response:{self.task_id}", stage="gate", outcome=result,
            cluster=wave.get("key") or wave.get("cluster"),
            detail={"chosen": chosen, "asked": decision, "waves": wave.get("waves"),
                    # The HITL trigger's event: timedout (no answer, the default was taken), when and by whom.
                    "timedout": bool(event.get("timedout", not who)), "responded_at": _iso(event.get("responded_at")),
                    "responded_by": dict(by) if isinstance(by, dict) and by else None,
                    **({"refused": refused} if refused else {})}),
            actor=who or "timeout")
        reason = held["reason"] if held else f"{chosen}: {refused}" if refused else \
            f"{chosen} by {who or 'timeout default'}"
        return {"decision": result, "reason": reason, "cluster": wave.get("cluster"), "by": who,
                "skip": sorted(wave.get("review") or []) if result == "skip_endpoints" else [],
                **({"held": held} if held else {})}


class CurvineApprovalOperator(ApprovalOperator):
    """The Curvine upgrade's approval: its subject and body are the preflight's evidence per cluster (revision,
    chart, values diff, the exact helm command) and the open drift, built by ``kvfleet.airflow.gates``."""

    def execute(self, context: Any) -> Any:
        from kvfleet.airflow import gates as gate_text
        from kvfleet.airflow.context import run_info

        pre = [p for p in (context["ti"].xcom_pull(task_ids="preflight") or []) if p]
        text = gate_text.for_curvine_approval(run_key=run_info(dict(context)).run_key, params=context["params"],
                                              preflight=list(pre), timeout=self.response_timeout)
        self.subject, self.body = text.subject, text.body
        self.assigned_users = Respondents.of(context, None, _scope(context)).assigned()
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        by = event.get("responded_by_user") or {}
        refused = None if event.get("timedout") else Respondents.of(context, None, _scope(context)).refusal(by)
        if refused:  # the answer does not count: the upgrade is rejected (its safe default), and that is recorded
            self.log.warning("%s", refused)
            from kvfleet.airflow.context import run_info
            from kvfleet.history.keys import StepEvent
            from kvfleet.history.runs import Runs

            Runs().record_step(run_info(dict(context)).step_key, StepEvent(
                step=f"gate_response:{self.task_id}", stage="gate", outcome="refused",
                detail={"chosen": list(event.get("chosen_options") or []), "refused": refused}),
                actor=str(by.get("name") if isinstance(by, dict) else by))
            event = {**event, "chosen_options": ["Reject"]}
        return super().execute_complete(context, event)


def _scope(context: Any) -> Any:
    """The run's pinned inventory narrowed to its Params' scope, read once per gate answer."""
    from kvfleet.airflow.context import run_info, scoped

    params = context["params"]
    return scoped(run_info(dict(context)).run_key, lobs=params.get("lobs"), clusters=params.get("clusters"),
                  endpoints=params.get("endpoints"))


def _held(context: Any, wave: dict[str, Any], inv: Any) -> dict[str, Any] | None:
    """A gate that would ask a human is a safe point too: the freeze or stop (``kvfleet.airflow.halt``) that holds
    the wave's cluster now, or None. ``inv``: ``_scope``."""
    from kvfleet.airflow import halt
    from kvfleet.airflow.context import run_info
    from kvfleet.history.repos import HistoryRepos

    key = wave.get("key")
    if context["params"].get("dry_run") or not key:
        return None
    run_key = run_info(dict(context)).run_key
    return halt.carried(halt.hold_on(HistoryRepos.on(), run_key, [key], {e.lob for e in inv.endpoints_of(key)}))


@dataclass(frozen=True)
class Respondents:
    """Who may answer a gate of this run (``lobs[].policy.responders``, less the triggering user under
    ``four_eyes``), from the run's pinned inventory: ``key`` narrows it to one cluster's LOBs (a wave gate), None
    takes every LOB in the run's scope (the Curvine upgrade's one approval).

    Airflow refuses (403) an answer through its REST API or UI from a user who is not in a gate's
    ``assigned_users``; where the LOBs name no responders, anyone may answer, and four eyes are kept here, when
    the answer arrives: one from the triggering user does not count."""

    allowed: list[str] | None
    four_eyes: bool
    triggered_by: str | None

    @classmethod
    def of(cls, context: Any, key: str | None, inv: Any) -> Respondents:
        """``inv``: the run's scope (``_scope``); ``key``: the gate's cluster, None for every LOB in it."""
        from kvfleet.airflow.context import run_info
        from kvfleet.fleet.inventory.policy import respondents
        from kvfleet.fleet.plan import policy_in_scope

        info = run_info(dict(context))
        allowed, four_eyes = respondents(policy_in_scope(inv.select(clusters=[key]) if key else inv),
                                         info.triggered_by)
        return cls(allowed, four_eyes, info.triggered_by)

    def assigned(self) -> list[Any] | None:
        """Airflow's HITL ``assigned_users`` (HITLUser: id and name; the name is the ID, which is what kvfleet
        knows)."""
        return None if self.allowed is None else [{"id": u, "name": u} for u in self.allowed]

    def refusal(self, by: Any) -> str | None:
        """Why an answer by ``by`` (the HITL event's ``responded_by_user``) does not count, or None."""
        if not isinstance(by, dict) or not by:
            return None  # a timeout: the default, which no one chose
        who = {str(by.get("id") or ""), str(by.get("name") or "")} - {""}
        if self.four_eyes and self.triggered_by and self.triggered_by in who:
            return (f"{self.triggered_by} triggered this run and answered its gate, and four eyes apply "
                    "(lobs[].policy.four_eyes): the answer does not count; the gate takes its safe default")
        if self.allowed is not None and not who & set(self.allowed):
            return (f"{'/'.join(sorted(who))} is not among the responders of this run's LOBs "
                    f"({', '.join(self.allowed) or 'none'}; lobs[].policy.responders): the answer does not count")
        return None


def _iso(value: Any) -> str | None:
    """The trigger's ``responded_at`` (a datetime, or its string form after serialization) as ISO 8601."""
    if value is None:
        return None
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
