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
        if wave.get("carry") in (gates.STOP, gates.ABORT):
            return wave["carry"], "carried from an earlier gate", wave
        decision, reason = gates.gate_decision(wave.get("verdict", "none"), gate=params.get("gate", "verify"),
                                               approval=params.get("approval", "none"), slot=self.slot,
                                               has_next=bool(wave.get("has_next")))
        return decision, reason, wave

    def execute(self, context: Any) -> Any:
        decision, reason, wave = self._decide(context)
        self.log.info("gate after slot %s on %s: %s (%s)", self.slot, wave.get("cluster"), decision, reason)
        if decision not in (gates.ASK_REVIEW, gates.ASK_APPROVAL):
            return {"decision": decision, "reason": reason, "cluster": wave.get("cluster"), "by": "kvfleet"}
        if decision == gates.ASK_REVIEW:
            self.options, self.defaults = list(gates.REVIEW_OPTIONS), ["Abort"]
        else:
            self.options, self.defaults = list(gates.APPROVAL_OPTIONS), ["Reject"]
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
        result = gates.decision_from_response(decision, chosen)
        by = payload.get("responded_by_user") or {}
        who = by.get("name") if isinstance(by, dict) else str(by or "timeout")
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
                    "responded_by": dict(by) if isinstance(by, dict) and by else None}),
            actor=who or "timeout")
        return {"decision": result, "reason": f"{chosen} by {who or 'timeout default'}", "cluster": wave.get("cluster"),
                "by": who, "skip": sorted(wave.get("review") or []) if result == "skip_endpoints" else []}


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
        return super().execute(context)


def _iso(value: Any) -> str | None:
    """The trigger's ``responded_at`` (a datetime, or its string form after serialization) as ISO 8601."""
    if value is None:
        return None
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
