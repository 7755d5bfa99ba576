"""Task bodies of the `kvfleet_rollout` DAG. The DAG file only wires these together.

Task structure (one run): ``plan`` -> a mapped task group per cluster -> ``finish``. Inside a cluster's group:
``cluster_stages`` (takes the cluster lease and a parallelism slot, then stages 1–3) -> ``wave_0`` (the canary)
-> ``gate_0`` -> ``wave_1`` -> ``gate_1`` -> ... -> ``wave_{WAVE_SLOTS-1}`` -> ``release`` (teardown: restore the
operator if this run paused it, release lease and slot).

What each exit path does with the lease and the slot:
- a task that ends normally with more of its run to come **parks** the lease (``ClusterLock.park``: no
  heartbeat, the gate's ttl; free at once when Airflow says the run is no longer running);
- a task that fails (any exception, a permanent error, SIGTERM) **releases** the lease, and ``cluster_stages``
  its slot too; a retry takes them again;
- ``release`` is a teardown with no setup task, so it runs once everything upstream is done whatever their
  states (success, failed, upstream_failed, skipped by a gate, aborted) and releases both;
- a task killed with SIGKILL stops heartbeating: its lease is free 60 s later (``ACTIVE_TTL_S``), and the drift
  check restores an operator that the dead task left paused.

Why wave *slots*: Airflow cannot loop, and a human gate must be a task of its own. So a cluster's plan waves
are laid onto ``WAVE_SLOTS`` slots (``kvfleet.airflow.params``: the DAG file lays out the same ones): slot k runs
plan wave k, and the last slot runs every remaining wave in order (its inner gates stop on a failure and pause —
stop, recorded as ``paused_for_review`` — on an inconclusive verification; a later run resumes). Mapping is per
cluster only, so 1,000 endpoints on 10 clusters is 10 instances per task, far below ``max_map_length`` (1024).

Waits give their worker slot back (docs/reference/airflow.md#deferral): a task that must wait **defers**
(``TaskDeferred``, resumed in ``kvfleet.airflow.operators.DeferrableTaskOperator.resume``) instead of sleeping:
- the cluster lease held by another run, and every parallelism slot taken: ``LeaseFreeTrigger`` (the patience
  ``lock_wait_minutes`` counts from the first try, across deferrals; running out is ``LeaseWaitTimeout``,
  permanent, naming the holder);
- a HyperPod cluster not ``InService`` when stage 1 looks (an update in flight from a previous try or by hand)
  and an add-on ``CREATING``/``UPDATING`` before stage 2: ``ClusterReadyTrigger`` (a terminal state fails permanently, a
  timeout is ``ConvergenceTimeout``, temporary, as ``wait_cluster``/``wait_addon`` do);
- the bake between a wave and its verification: the standard provider's ``DateTimeTrigger``; the lease is parked
  for the bake (its ttl stretched to cover it) and taken again, re-entrantly, on resume.
- the waits after a change *kvfleet itself just made* (``UpdateCluster`` to ``InService``, an add-on create or
  update to ``ACTIVE``: ``ClusterReadyTrigger``; then, when they are not met yet, the ai-toolkit daemon on every
  node, the operator's controller Ready, Curvine's StatefulSets rolled out, its PVCs Bound and its master
  reporting the capacity: ``KubeReadyTrigger``): stages 1–3 are split into ``act``/``finish``
  (``stages.base.Pending``).
What a task had done before it deferred travels in the deferral's kwargs (``kvfleet_resume``: the stages done,
the current stage's ``progress``), so a resumed task does not redo or re-record it. Still inside the worker, by
design: Curvine's first-install window (installed with the format flags true, flipped to false as soon as every
pod runs: the flip is in a ``finally`` and must never wait on a deferral), Kyverno's install (``helm``), and the
endpoint waves' pod rollouts (a wave holds the operator paused on a patch-mode cluster, and the restore stays in
the same task's ``finally``).

Each task parses the run's Params once into a frozen ``RolloutRequest`` (``kvfleet.airflow.request``: defaults
from ``kvfleet.airflow.params``) and reads only that; each task body sits behind the task boundary
(``kvfleet.airflow.boundary``), which classifies whatever it raises.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from kvfleet.airflow import halt
from kvfleet.airflow.boundary import task_boundary
from kvfleet.airflow.context import cluster_context, narrowed, pin_inventory, run_info
from kvfleet.airflow.params import WAVE_SLOTS
from kvfleet.airflow.request import RolloutRequest
from kvfleet.errors import ConvergenceTimeout, LeaseWaitTimeout, PermanentError
from kvfleet.fleet import gates
from kvfleet.fleet.inventory import Endpoint
from kvfleet.fleet.inventory.policy import below, left_to_humans, unanswerable, unheld
from kvfleet.fleet.pinning import inventory_of
from kvfleet.fleet.plan import make_plan, render_plan_text
from kvfleet.history.keys import StepEvent
from kvfleet.history.leases import ACTIVE_TTL_S, PARKED_TTL_S, SUFFIX, Leases
from kvfleet.history.repos import HistoryRepos
from kvfleet.history.runs import Runs
from kvfleet.outcomes import Status
from kvfleet.stages import addons, curvine, endpoints, operator_pause, tiered_storage, verify
from kvfleet.stages.base import Pending, StageContext
from kvfleet.stages.locks import ClusterLock

log = logging.getLogger(__name__)


def rollout_context(cluster: str, req: RolloutRequest) -> StageContext:
    """A cluster's stage context for this run's request (scope, dry run, AWS connection)."""
    return cluster_context(cluster, lobs=req.lobs, clusters=req.clusters, endpoints=req.endpoints,
                           dry_run=req.dry_run, aws_conn_id=req.aws_conn_id)


def _lease(ctx: StageContext, req: RolloutRequest) -> ClusterLock:
    info = run_info()
    return ClusterLock(ctx.history or HistoryRepos.on(), ctx.cluster.key, info.run_key, "rollout", ttl_s=ACTIVE_TTL_S,
                       wait_s=req.lock_wait_s, poll_s=min(ctx.poll_s * 5, 10),
                       progress=ctx.say, holder_alive=ctx.holder_alive, park_ttl_s=PARKED_TTL_S)


def _slot_prefix(run_key: str) -> str:
    return f"slot:{run_key}:"


def _slot_holder(run_key: str, cluster: str) -> str:
    return f"{run_key}{SUFFIX}{cluster}"


def _slot(history: HistoryRepos, run_key: str, cluster: str, limit: int) -> str | None:
    """Take one of ``limit`` parallelism slots of this run (``max_parallel_clusters``), as leases in the same
    table, parked for the whole run (released by the teardown, or at once when ``cluster_stages`` fails); None
    when all are taken (the caller defers)."""
    leases = Leases(history.engine)
    holder = _slot_holder(run_key, cluster)
    names = [f"{_slot_prefix(run_key)}{i}" for i in range(limit)]
    held = [n for n in names if (leases.get(n) or {}).get("holder") == holder]  # resumed after a deferral
    for name in held[:1] + [n for n in names if n not in held]:
        row = leases.try_take(name, holder, "rollout parallelism", PARKED_TTL_S)
        if row.get("holder") == holder:
            leases.park(name, holder, PARKED_TTL_S)
            return name
    return None


# ---- deferral --------------------------------------------------------------------------------------------------
def _defer(trigger: Any, state: dict[str, Any]) -> NoReturn:
    """Give the worker slot back until ``trigger`` fires; the operator's ``resume`` calls the task body again
    with ``state`` (and the trigger's event) as ``kvfleet_resume``."""
    from airflow.sdk import get_current_context
    from airflow.sdk.exceptions import TaskDeferred

    from kvfleet.airflow.operators import RESUME_KEY, RESUME_METHOD

    # Also an XCom of this task instance (kept across a deferral, cleared by a new try): ``dag.test()`` resumes
    # with the trigger's event alone, where the triggerer merges the event into the deferral's kwargs.
    get_current_context()["ti"].xcom_push(key=RESUME_KEY, value=state)
    raise TaskDeferred(trigger=trigger, method_name=RESUME_METHOD, kwargs={RESUME_KEY: state})


def _check_event(resume: dict[str, Any]) -> None:
    """A trigger's ``error`` event in the error model: a lease wait out of patience is ``LeaseWaitTimeout``
    (permanent); a cluster or add-on that did not converge in time ``ConvergenceTimeout`` (temporary: the retry
    observes again); anything else (a terminal state, an unreadable lease table) permanent."""
    event = resume.get("event") or {}
    if not isinstance(event, dict) or event.get("status") != "error":
        return
    message = str(event.get("message") or event)
    if resume.get("wait") in ("lease", "slot"):
        if event.get("reason") == "timeout":
            raise LeaseWaitTimeout(message)
        raise PermanentError(message)
    if event.get("reason") == "timeout":
        raise ConvergenceTimeout(message)
    raise PermanentError(message)


def _waited(resume: dict[str, Any], wait: str) -> float:
    """When this wait began (wall clock), kept across deferrals of the same wait."""
    return float(resume["since"]) if resume.get("wait") == wait and resume.get("since") else time.time()


LEASE_RECHECK_S = 300.0  # a deferred lease wait resumes this often to ask Airflow whether the holder's run lives


def _lease_trigger(ctx: StageContext, req: RolloutRequest, holder: str, since: float, *,
                   names: list[str] | None = None) -> Any:
    from kvfleet.airflow.triggers.lease import LeaseFreeTrigger

    return LeaseFreeTrigger(ctx.cluster.key, holder, poll_s=min(ctx.poll_s * 5, 10), timeout_s=req.lock_wait_s,
                            started_at=since, names=names, exact_holder=names is not None,
                            recheck_s=LEASE_RECHECK_S)


def _take_slot_or_defer(ctx: StageContext, req: RolloutRequest, history: HistoryRepos, resume: dict[str, Any],
                        state: dict[str, Any]) -> str:
    """One of the run's parallelism slots, or a deferral until one is free (or the patience is spent)."""
    # The slot's holder names the cluster by its key, as the teardown (``_release_all``) frees it.
    info, cluster, limit = run_info(), ctx.cluster.key, req.max_parallel_clusters
    taken = _slot(history, info.run_key, cluster, limit)
    if taken is not None:
        return taken
    since = _waited(resume, "slot")
    if time.time() - since >= req.lock_wait_s:
        raise LeaseWaitTimeout(f"no parallelism slot free for {cluster} after {time.time() - since:.0f}s "
                               f"(max_parallel_clusters={limit})")
    ctx.say(f"waiting for one of {limit} parallel cluster slots: deferring")
    names = [f"{_slot_prefix(info.run_key)}{i}" for i in range(limit)]
    _defer(_lease_trigger(ctx, req, _slot_holder(info.run_key, cluster), since, names=names),
           {**state, "wait": "slot", "since": since})


def _take_lease_or_defer(ctx: StageContext, req: RolloutRequest, resume: dict[str, Any],
                         state: dict[str, Any]) -> ClusterLock:
    """The cluster lease (re-entrant for this run), or a deferral until it is free (or the patience is spent)."""
    info = run_info()
    lock = _lease(ctx, req)
    lock.wait_s = 0  # one try: waiting is the triggerer's
    try:
        return lock.acquire()
    except LeaseWaitTimeout as exc:
        since = _waited(resume, "lease")
        if time.time() - since >= req.lock_wait_s:
            raise LeaseWaitTimeout(f"{exc}".replace("waited 0s", f"waited {time.time() - since:.0f}s")) from None
        ctx.say(f"[{ctx.cluster.name}] lease held by another run: deferring (waiting since "
                f"{datetime.fromtimestamp(since, UTC).isoformat(timespec='seconds')})")
        _defer(_lease_trigger(ctx, req, info.run_key, since), {**state, "wait": "lease", "since": since})


def _release_all(history: HistoryRepos, run_key: str, cluster: str, key: str | None) -> dict[str, int]:
    """Free this run's lease on the cluster (by its ``key``; without one, any of the run's on a cluster named
    ``cluster``, the task's mapped argument) and its parallelism slot: held under the key, or under the mapped
    argument by a run whose tasks were mapped over bare names (planned before revision 0011)."""
    leases = Leases(history.engine)
    lease = int(leases.release(key, run_key)) if key is not None else leases.release_named(cluster, run_key)
    holders = dict.fromkeys(_slot_holder(run_key, c) for c in (key or cluster, cluster))
    return {"lease": lease, "slots": sum(leases.release_all(_slot_prefix(run_key), h) for h in holders)}


@task_boundary
def plan_rollout(params: dict[str, Any]) -> list[str]:
    """Validate the inventory and the scope, compute the plan, and open the run in the history store, with the
    plan and the inventory pinned (``kvfleet.fleet.pinning``: every later task applies that snapshot, not the file
    as it is then). Returns the keys (account/region/name) of the plan's clusters, what the per-cluster tasks are
    mapped over. The plan itself goes to no XCom, since every task that needs it reads its part from ``runs.plan``
    (``Runs.cluster_plan``), so the run's XCom does not grow with the fleet's endpoints."""
    info = run_info()
    req = RolloutRequest.from_params(params)
    pinned = pin_inventory(req.fleet)
    log.info("inventory %s: %s", pinned.source, pinned.revision)
    history = HistoryRepos.on()
    # pinned before the scope and the plan are judged: a refusal's notification routes by this inventory too
    history.runs.start(info.run_key, dag_id=info.dag_id, run_id=info.run_id, trigger=info.trigger,
                      triggered_by=info.triggered_by, params=params, inventory=pinned)
    inv = narrowed(inventory_of(pinned), lobs=req.lobs, clusters=req.clusters, endpoints=req.endpoints)
    verify.check_prompt_length(req.prompt_tokens, inv.settings.chunk_size)
    plan = make_plan(inv, wave_size=req.wave_size, canary=req.canary)
    if info.trigger == "schedule" and not req.dry_run:  # the daily run: its own policy (lobs[].policy.scheduled)
        inv, plan = _leave_to_humans(history, info, req, inv, plan)
    lowered = [] if req.dry_run else [
        *below(plan.policy, inv.source, gate=req.gate, approval=req.approval),
        *unheld(plan, inv.source, canary=req.canary, approval=req.approval, slots=WAVE_SLOTS),
        # a gate may ask a human (an approval, or a review of an inconclusive verification): someone must be able to
        *(unanswerable(plan.policy, inv.source, info.triggered_by)
          if req.approval != "none" or req.gate == "verify" else [])]
    if lowered:  # a dry run changes nothing, so no policy holds it back
        refused = {"refused": lowered, "policy": plan.as_dict()["policy"]}
        history.runs.record_step(info.step_key, StepEvent(step="policy", stage="plan", outcome="refused",
                                                          detail=refused), actor=info.actor)
        raise PermanentError("the run does not meet its LOBs' policy; nothing was changed: " + "; ".join(lowered))
    if not req.dry_run:  # a freeze (or a stop) of its scope: the run does not start
        halt.refuse_start(history, info.step_key, run_key=info.run_key, actor=info.actor,
                          clusters=[c.key for c in plan.clusters], lobs={e.lob for e in inv.endpoints})
    log.info("%s", render_plan_text(plan))
    history.runs.start(info.run_key, dag_id=info.dag_id, run_id=info.run_id, trigger=info.trigger,
                      triggered_by=info.triggered_by, params=params, plan=plan.as_dict())
    history.runs.record_step(info.step_key, StepEvent(step="plan", stage="plan", outcome="planned",
                                                 detail={"clusters": len(plan.clusters),
                                                         "endpoints": len(inv.endpoints),
                                                         "dry_run": req.dry_run,
                                                         "inventory": pinned.revision}),
                        actor=info.actor)
    return [c.key for c in plan.clusters]


def _leave_to_humans(history: HistoryRepos, info: Any, req: RolloutRequest, inv: Any, plan: Any) -> tuple[Any, Any]:
    """A scheduled run applies nothing a LOB's policy keeps for a human: it leaves out the production clusters of
    a LOB with ``scheduled: plan`` and the clusters of a LOB whose floor its Params do not meet (a run by hand
    would be refused), recorded as a ``policy`` step (planned: what was left out and why); the rest goes on."""
    keys, why = left_to_humans(plan, [c.key for c in inv.clusters if c.production], inv.source,
                               run={"gate": req.gate, "approval": req.approval})
    if not keys:
        return inv, plan
    log.warning("the daily run leaves to a human: %s", "; ".join(why))
    history.runs.record_step(info.step_key, StepEvent(step="policy", stage="plan", outcome="planned", detail={
        "left_out": keys, "why": why, "planned": {c.key: c.as_dict() for c in plan.clusters if c.key in keys}}),
        actor=info.actor)
    kept = inv.model_copy(update={"clusters": [c for c in inv.clusters if c.key not in keys],
                                  "endpoints": [e for e in inv.endpoints if not any(e.on(c) for c in inv.clusters
                                                                                    if c.key in keys)]})
    return kept, make_plan(kept, wave_size=req.wave_size, canary=req.canary)


@task_boundary
def run_preflight(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    """The cluster's first task: its prerequisites (``stages.preflight``, read-only), recorded; a cluster with
    anything missing is refused (permanent) with every missing item and its fix, before anything changes."""
    from kvfleet.stages import preflight

    ctx = rollout_context(cluster, RolloutRequest.from_params(params))
    try:
        warnings = preflight.refuse_if_missing(ctx)
    finally:
        ctx.close()
    return {"cluster": cluster, "warnings": [p.as_dict() for p in warnings]}


@task_boundary
def run_cluster_stages(cluster: str, params: dict[str, Any],
                       kvfleet_resume: dict[str, Any] | None = None) -> dict[str, Any]:
    """Take a parallelism slot and the cluster lease, then stages 1–3 (and the drift remediation). Every wait
    defers (module docstring); ``kvfleet_resume`` is what the task had done before its last deferral."""
    from airflow.sdk.exceptions import TaskDeferred

    resume = dict(kvfleet_resume or {})
    req = RolloutRequest.from_params(params)
    ctx = rollout_context(cluster, req)
    info = run_info()
    lease: ClusterLock | None = None
    history = ctx.history or HistoryRepos.on()
    done: list[dict[str, Any]] = list(resume.get("done") or [])
    try:
        _check_event(resume)  # a trigger's error (terminal state, timeout) frees the slot and lease like any failure
        held = halt.held(ctx)  # a freeze or a stop before the cluster is touched: no slot, no lease
        lease = _slot_and_lease(ctx, req, history, resume, done, held)
        held = held or _stages_1_to_3(ctx, resume, done)
        drift_report = _remediate_drift(ctx, req, held)
    except TaskDeferred:
        # Waiting in the triggerer: the slot stays parked (the run still counts this cluster), the lease too when
        # this task holds it (waiting for the cluster itself); the resumed task takes them again.
        if lease is not None:
            lease.park()
        raise
    except BaseException:
        # Every failure path frees what this task took: a retry takes it again; the teardown has nothing left.
        if lease is not None:
            lease.release()
        released = _release_all(history, info.run_key, cluster, ctx.cluster.key) if not ctx.dry_run else {}
        ctx.say(f"cluster stages failed: lease and slot released ({released})")
        raise
    else:
        if lease is not None:
            lease.park()
    finally:
        ctx.close()
    for o in done:
        log.info("[%s] %s: %s", cluster, o.get("stage"), o.get("outcome"))
    if held:  # the first wave slot carries it: no wave of this cluster starts
        log.warning("[%s] held before stage %d: %s", cluster, len(done) + 1, held["reason"])
        return {"cluster": cluster, "stages": done, "drift": None, "decision": gates.HALT, "held": held,
                "reason": held["reason"]}
    return {"cluster": cluster, "stages": done, "drift": drift_report}


def _slot_and_lease(ctx: StageContext, req: RolloutRequest, history: HistoryRepos, resume: dict[str, Any],
                    done: list[dict[str, Any]], held: dict[str, Any] | None) -> ClusterLock | None:
    """The run's parallelism slot, then the cluster's lease (each wait deferred); none for a dry run or a held
    cluster."""
    if ctx.dry_run or held:
        return None
    # What a stage had decided before a deferral travels across a new wait for the slot or the lease too.
    kept = {"done": done, "progress": dict(resume.get("progress") or {})}
    _take_slot_or_defer(ctx, req, history, resume, kept)
    return _take_lease_or_defer(ctx, req, resume, kept)


def _stages_1_to_3(ctx: StageContext, resume: dict[str, Any], done: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Stages 1–3 in order, skipping those done before a deferral (their outcomes are in ``done``). Each stage is
    split (``stages.base.Pending``): each wait their own change needs (UpdateCluster to InService, an add-on to
    ACTIVE, the ai-toolkit daemon, the operator's controller, Curvine's StatefulSets, PVCs and master) defers,
    with the stage's ``progress`` in the deferral's state, and the resumed task calls the stage's ``act`` again
    with it. Stage 3's install window (install with the format flags true, flip to false as soon as the pods
    run) stays in this process: its flip must never wait on a deferral."""
    progress: dict[str, Any] = dict(resume.get("progress") or {})
    for stage in (tiered_storage, addons, curvine)[len(done):]:
        # a safe point before a stage starts (one resumed after a deferral finishes what it began)
        if not progress and (held := halt.held(ctx)) is not None:
            return held
        if stage is addons and not ctx.dry_run and not progress:
            _defer_while_addons_move(ctx, resume, {"done": done})
        while (pending := stage.act(ctx, progress)) is not None:
            _defer_for(ctx, pending, resume, {"done": done, "progress": progress})
        done.append(stage.finish(ctx, progress).as_dict())
        progress = {}
    return None


def _defer_for(ctx: StageContext, pending: Pending, resume: dict[str, Any], state: dict[str, Any]) -> NoReturn:
    """Defer for a wait a stage handed back (``stages.base.Pending``): ``ClusterReadyTrigger`` for the cluster or
    an add-on, ``KubeReadyTrigger`` for a readiness check."""
    from kvfleet.airflow.triggers.readiness import ClusterReadyTrigger, KubeReadyTrigger

    cl = ctx.cluster
    wait = f"stage:{pending.wait}"
    since = _waited(resume, wait)
    trigger: Any
    if pending.check is not None:
        ctx.say(f"{pending.what}: waiting in the triggerer")
        trigger = KubeReadyTrigger(cl.name, cl.region, identity=_identity(ctx), check=pending.check,
                                   args=dict(pending.args or {}), poll_s=ctx.poll_s, timeout_s=pending.timeout_s,
                                   started_at=since)
    else:
        ctx.say(f"{pending.what}: waiting for {'ACTIVE' if pending.addon else 'InService'} in the triggerer")
        trigger = ClusterReadyTrigger(cl.name, cl.region, identity=_identity(ctx), addon=pending.addon,
                                      poll_s=ctx.poll_s, timeout_s=pending.timeout_s, started_at=since)
    _defer(trigger, {**state, "wait": wait, "since": since})


def _identity(ctx: StageContext) -> dict[str, Any]:
    """The identity a trigger reaches the cluster as: the task's own (its JSON, in the trigger's kwargs)."""
    assert ctx.identity is not None  # set by StageContext
    return ctx.identity.as_dict()


ADDON_MOVING = frozenset({"CREATING", "UPDATING"})
WAVE_GATE_PARALLEL = 8  # a wave's endpoints probed at once by its gate (node-disjoint ones only)


def _defer_while_addons_move(ctx: StageContext, resume: dict[str, Any], state: dict[str, Any]) -> None:
    """Before stage 2, an add-on that is being created or updated (a change in flight from an earlier try or made
    by hand): defer on ``ClusterReadyTrigger`` until it settles, before stage 2 changes any add-on (an update sent
    to a moving add-on is refused). Read-only calls; a terminal state is left to the stage (it fails at once with
    the service's message). Stage 1 needs no such look: its ``act`` hands back a ``before:cluster`` wait itself
    when the cluster is not InService."""
    from kvfleet.airflow.triggers.readiness import ClusterReadyTrigger
    from kvfleet.fleet import constants as C

    cl = ctx.cluster
    eks = ctx.hyperpod.require_cluster(cl.name).eks_cluster_name
    moving = [(n, (ctx.hyperpod.describe_addon(eks, n) or {}).get("status")) for n in C.ADDON_ORDER]
    first = next(((n, st) for n, st in moving if st in ADDON_MOVING), None)
    if first is None:
        return
    addon = first[0]
    wait = f"ready:{addon}"
    since = _waited(resume, wait)
    ctx.say(f"stage 2: EKS add-on {addon} on {eks} is {first[1]}: deferring until it is ready")
    _defer(ClusterReadyTrigger(cl.name, cl.region, identity=_identity(ctx), addon=addon, poll_s=ctx.poll_s,
                               timeout_s=ctx.timeouts.addon_s, started_at=since),
           {**state, "wait": wait, "since": since})


def _remediate_drift(ctx: StageContext, req: RolloutRequest, held: dict[str, Any] | None) -> dict[str, Any] | None:
    """``remediate_drift``: the drift check with remediation, under this run's lease, before the waves move
    (a format flag left true, an operator left paused, patches lost to a re-render). None when not asked for, in
    a dry run, or when a freeze or a stop ``held`` the cluster."""
    from kvfleet.stages import drift

    if not req.remediate_drift or ctx.dry_run or held:
        return None
    result = drift.check(ctx, remediate=True)
    return {"findings": len(result.findings), "remediations": len(result.remediations or [])}


def _cluster_plan(cluster: str) -> dict[str, Any]:
    """This run's plan cut to ``cluster`` (what the ``plan`` task stored with the run), or a permanent error."""
    run_key = run_info().run_key
    plan = Runs().cluster_plan(run_key, cluster)
    if plan is None:
        raise PermanentError(f"run {run_key}: the history store has no plan for cluster {cluster}; the plan task "
                             "stores it when the run starts: clear the run's plan task to plan it again")
    return plan


def _slot_waves(plan: dict[str, Any], cluster: str, slot: int) -> list[dict[str, Any]]:
    waves: list[dict[str, Any]] = next(c["waves"] for c in plan["clusters"] if cluster in (c.get("key"), c["cluster"]))
    return waves[slot:] if slot == WAVE_SLOTS - 1 else waves[slot:slot + 1]


def _mark(ctx: StageContext, eps: list[Endpoint], outcome: str, reason: str) -> None:
    for ep in eps:
        ctx.record(f"endpoint:{ep.key}", "endpoint", outcome, endpoint=ep.key, lob=ep.lob, reason=reason)
        ctx.say(f"{outcome}: {ep.key} ({reason})")


def _verify_and_record(ctx: StageContext, ep: Endpoint, req: RolloutRequest, step: str) -> dict[str, Any]:
    result = verify.verify_endpoint(ctx, ep, req.prompt_tokens, tolerance=req.speedup_tolerance).as_dict()
    if ctx.history is not None and ctx.step_key is not None:
        ctx.history.verifications.record(ctx.step_key, step, result)
    ctx.say(f"stage 5: {ep.key}: {result['verdict']} hit {result['hit_ratio']} cold {result['ttft_cold_ms']} ms "
            f"warm {result['ttft_warm_ms']} ms speedup {result['speedup']}x (expected {result['expected_speedup']}x)"
            + (f" — {result['diagnosis']}" if result.get("diagnosis") else ""))
    return result


def _apply_wave(ctx: StageContext, wave: dict[str, Any], eps: list[Endpoint], holder: str) -> dict[str, str]:
    """Reconcile one wave's endpoints; the endpoints that failed or were refused, with why."""
    ctx.say(f"wave {wave['wave']} ({wave['kind']}): {', '.join(e.key for e in eps)}")
    outcomes = endpoints.reconcile_wave(ctx, eps, holder=holder)
    return {str(o.endpoint): "fail — " + "; ".join(o.detail.get("violations") or [o.detail.get("reason", "")])[:300]
            for o in outcomes if o.outcome in ("failed", "refused")}


def _verify_wave(ctx: StageContext, wave: dict[str, Any], eps: list[Endpoint], req: RolloutRequest,
                 broken: dict[str, str]) -> tuple[str, dict[str, str]]:
    """After the bake: verify the wave's endpoints and record its gate. Endpoints whose pods share no node are
    probed at the same time (``verify.in_node_batches``, at most ``WAVE_GATE_PARALLEL``), as the hourly
    verification does; the verdicts are kept in the wave's order."""
    todo = [ep for ep in eps if ep.key not in broken]
    verified = verify.in_node_batches(
        ctx, todo, lambda ep: _verify_and_record(ctx, ep, req, f"verify:{wave['wave']}:{ep.key}"),
        max_parallel=WAVE_GATE_PARALLEL)
    results = {ep.key: verified[ep.key] for ep in todo}
    verdict = gates.wave_verdict([*results.values(), *({"verdict": "fail"} for _ in broken)])
    ctx.record(f"gate:{wave['wave']}", "gate", "passed" if verdict == "pass" else verdict,
               verdicts={k: v["verdict"] for k, v in results.items()})
    return verdict, {**broken, **{k: v["verdict"] + (f" — {v['diagnosis']}" if v.get("diagnosis") else "")
                                  for k, v in results.items()}}


def _carried(ctx: StageContext, waves: list[dict[str, Any]], by_ref: dict[str, Endpoint],
             previous: dict[str, Any] | None, out: dict[str, Any], resume: dict[str, Any]) -> dict[str, Any] | None:
    """The slot's result when it has nothing to run (no waves), an earlier gate stopped or aborted the cluster, or
    a freeze or a stop holds it at this slot's start (its endpoints marked so); None when the slot runs."""
    decision = (previous or {}).get("decision", gates.CONTINUE)
    held = (previous or {}).get("held") if decision == gates.HALT else None
    if not waves:
        return {**out, "carry": decision if decision in gates.CARRIED else None,
                "reason": (previous or {}).get("reason"), **({"held": held} if held else {})}
    if decision in gates.CARRIED:
        outcome = held["outcome"] if held else "skipped_by_gate" if decision == gates.STOP else "aborted"
        _mark(ctx, [by_ref[e["ref"]] for w in waves for e in w["endpoints"]], outcome,
              (previous or {}).get("reason", ""))
        return {**out, "verdict": "stopped", "carry": decision, "reason": (previous or {}).get("reason"),
                **({"held": held} if held else {})}
    if resume.get("baked") is not None:  # its first wave was applied before a bake: no safe point until it is done
        return None
    start = int(resume.get("wave_index") or 0)
    stopped = _held_here(ctx, [by_ref[e["ref"]] for w in waves[start:] for e in w["endpoints"]])
    return None if stopped is None else {**out, **stopped}


def _held_here(ctx: StageContext, eps: list[Endpoint]) -> dict[str, Any] | None:
    """A safe point before a wave (``eps``: its endpoints and the slot's later waves', none started): when a hold
    applies, they are recorded frozen or stopped and the slot carries the hold on; None to go on."""
    held = halt.held(ctx)
    if held is None:
        return None
    _mark(ctx, eps, held["outcome"], held["reason"])
    return {"verdict": "stopped", "carry": gates.HALT, "held": held, "reason": held["reason"]}


def _wave_step(ctx: StageContext, req: RolloutRequest, lease: ClusterLock | None, wave: dict[str, Any],
               eps: list[Endpoint], baked: dict[str, str] | None, state: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """One wave: applied, baked (deferred), verified. ``baked``: the wave was applied before a bake that has now
    passed (the endpoints that had failed, from before the deferral): only its verification is left."""
    if baked is not None:
        return _verify_wave(ctx, wave, eps, req, dict(baked))
    broken = _apply_wave(ctx, wave, eps, run_info().run_key)
    if ctx.dry_run:
        return "none", {}
    if not req.gated:
        return ("fail" if broken else "pass"), broken
    if req.bake_s:
        until = datetime.now(UTC) + timedelta(seconds=req.bake_s)
        ctx.say(f"baking {req.bake_s:.0f}s before the gate: deferring until {until.isoformat(timespec='seconds')}")
        _defer_bake(lease, until, {**state, "baked": broken})
    return _verify_wave(ctx, wave, eps, req, broken)


def _stop_after(ctx: StageContext, wave: dict[str, Any], verdict: str, rest: list[Endpoint],
                req: RolloutRequest) -> dict[str, Any] | None:
    """A gated wave that failed stops the slot's later waves; an inconclusive one pauses them for review; a freeze
    or a stop holds them (a safe point between two waves)."""
    if rest and (held := _held_here(ctx, rest)) is not None:
        return held
    if rest and verdict == "fail" and req.gated:
        _mark(ctx, rest, "skipped_by_gate", f"wave {wave['wave']} failed its gate")
        return {"verdict": "fail", "carry": gates.STOP}
    if rest and verdict == "review" and req.gated:
        _mark(ctx, rest, "paused_for_review", f"wave {wave['wave']} inconclusive; re-run after review")
        return {"carry": gates.STOP}
    return None


BAKE_LEASE_MARGIN_S = 15 * 60  # the lease parked over a bake outlives it by this much


@task_boundary
def run_wave_slot(cluster: str, slot: int, previous: dict[str, Any] | None,
                  params: dict[str, Any], kvfleet_resume: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run this slot's wave(s) unless an earlier gate stopped or aborted the cluster. A wave's bake (and a lease
    held by another run) defers; ``kvfleet_resume`` says where the slot stood: which wave, applied or not. The
    waves are this cluster's part of the run's plan, read from the history store (``Runs.cluster_plan``)."""
    from airflow.sdk.exceptions import TaskDeferred

    resume = dict(kvfleet_resume or {})
    _check_event(resume)
    req = RolloutRequest.from_params(params)
    plan = _cluster_plan(cluster)
    ctx = rollout_context(cluster, req)
    waves = _slot_waves(plan, cluster, slot)
    by_ref = {e.ref: e for e in ctx.inventory.endpoints_of(cluster)}
    out: dict[str, Any] = resume.get("out") or {
        "cluster": cluster, "key": ctx.cluster.key, "slot": slot, "waves": [w["wave"] for w in waves],
        "endpoints": {}, "review": [], "verdict": "none", "has_next": False}
    lease: ClusterLock | None = None
    try:
        carried = _carried(ctx, waves, by_ref, previous, out, resume)
        if carried is not None:
            return carried
        skip = set((previous or {}).get("skip") or [])
        start, baked = int(resume.get("wave_index") or 0), resume.get("baked")
        if not ctx.dry_run:  # re-entrant for this run; another holder: deferred until free
            lease = _take_lease_or_defer(ctx, req, resume, {"out": out, "wave_index": start, "baked": baked})
        for i in range(start, len(waves)):
            wave = waves[i]
            eps = [by_ref[e["ref"]] for e in wave["endpoints"] if by_ref[e["ref"]].key not in skip]
            verdict, detail = _wave_step(ctx, req, lease, wave, eps, baked if i == start else None,
                                         {"out": out, "wave_index": i})
            out["endpoints"].update(detail)
            out["verdict"] = verdict
            out["review"] = [k for k, v in detail.items() if v.startswith(("degraded", "unverifiable"))]
            rest = [by_ref[e["ref"]] for w in waves[i + 1:] for e in w["endpoints"]]
            stop = _stop_after(ctx, wave, verdict, rest, req)  # a safe point before the next wave too
            if stop is not None:
                return {**out, **stop}
        out["has_next"] = slot < WAVE_SLOTS - 1 and bool(_slot_waves(plan, cluster, slot + 1))
        return out
    except TaskDeferred:
        if lease is not None:  # parked over the wait (a bake parks it itself, with a ttl that outlives the bake)
            lease.park()
            lease = None
        raise
    except BaseException:
        if lease is not None:  # a failed wave frees the cluster; its retry (or the teardown) takes over
            lease.release()
            lease = None
        raise
    finally:
        if lease is not None:
            lease.park()
        ctx.close()


def _defer_bake(lease: ClusterLock | None, until: datetime, state: dict[str, Any]) -> NoReturn:
    """The bake in the triggerer (the standard provider's ``DateTimeTrigger``), the lease parked for longer than
    the bake so that no other run takes the cluster between the wave and its verification."""
    from airflow.providers.standard.triggers.temporal import DateTimeTrigger

    if lease is not None:
        bake_s = (until - datetime.now(UTC)).total_seconds()
        lease.park_ttl_s = max(lease.park_ttl_s, bake_s + BAKE_LEASE_MARGIN_S)
    _defer(DateTimeTrigger(moment=until), state)


@task_boundary
def release_cluster(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    """Teardown: restore the operator if THIS run paused it, then release the lease and the slot. Runs even
    when ``cluster_stages`` or a wave failed, was skipped or aborted, or its worker died between pause and
    restore (a teardown without a setup task: trigger rule all-done)."""
    info = run_info()
    try:
        ctx = rollout_context(cluster, RolloutRequest.from_params(params))
    except BaseException:
        # No context (no pinned inventory, an unreadable one): nothing to restore from here (the drift check
        # restores a dead pauser's operator), but what this run holds is freed at once, not at its ttl.
        _release_all(HistoryRepos.on(), info.run_key, cluster, None)
        raise
    history = ctx.history or HistoryRepos.on()
    result: dict[str, Any] = {"restored": False}
    try:
        if not ctx.dry_run:
            result = operator_pause.restore(ctx, holder=info.run_key)
            if result.get("restored"):
                ctx.record(f"teardown_restore:{cluster}", "operator", "changed", action="restored by teardown",
                           **result)
        return result
    finally:
        # Released even when the restore fails (the task still fails, and fails the run): a pause left behind by
        # a run that holds no lease is a dead pauser's, which the drift check restores.
        result["released"] = _release_all(history, info.run_key, cluster, ctx.cluster.key)
        ctx.close()


@task_boundary
def finish_rollout(clusters: list[str], last_slots: list[Any] | None, params: dict[str, Any]) -> dict[str, Any]:
    info = run_info()
    req = RolloutRequest.from_params(params)
    history = HistoryRepos.on()
    if req.dry_run:
        _print_dry_run(history, info.run_key)
    rows = history.queries.rows("rollout_by_lob", run_key=info.run_key, lob=None)
    lines = [f"{'LOB':<12}{'moved':>7}{'same':>7}{'skipped':>9}{'failed':>8}{'pass':>6}{'other':>7}"
             f"{'hit':>7}{'speedup':>9}{'expected':>10}"]
    for r in rows:
        lines.append(f"{r['lob'] or '-':<12}{r['moved']:>7}{r['unchanged']:>7}{r['skipped']:>9}{r['failed']:>8}"
                     f"{r['verified_pass']:>6}{r['verified_other']:>7}{_f(r['avg_hit_ratio']):>7}"
                     f"{_f(r['avg_speedup']):>9}{_f(r['avg_expected']):>10}")
    log.info("rollout summary per line of business\n%s", "\n".join(lines))
    steps = history.runs.steps(info.run_key)
    aborted = [{"cluster": s["cluster"], "reason": (s["detail"] or {}).get("reason")} for s in steps
               if s["outcome"] == "aborted"]
    held = sorted({s["outcome"] for s in steps if s["outcome"] in (Status.STOPPED, Status.FROZEN)}, reverse=True)
    summary = {"steps": len(steps), "dry_run": req.dry_run,
               "clusters": list(clusters), "lobs": rows, "aborted": aborted}
    # held on purpose (a stop first): what the run ended as, not a failure; the DAG callback derives the same
    history.runs.end(info.run_key, held[0] if held else "aborted" if aborted else "success", summary)
    if held:
        return {"lobs": len(rows), "held": held[0]}
    if aborted:
        raise PermanentError("rollout aborted at a gate: " + "; ".join(sorted({f"{g['cluster']}: {g['reason']}"
                                                                              for g in aborted})))
    return {"lobs": len(rows)}


def _print_dry_run(history: HistoryRepos, run_key: str) -> None:
    actions = history.queries.rows("planned_actions", run_key=run_key)
    lines = [f"DRY RUN: {len(actions)} change(s) would be made"]
    for a in actions:
        where = a["cluster"] + (f" {a['endpoint']}" if a["endpoint"] else "")
        lines.append(f"[{where}] {a['action']}")
        if a["diff"]:
            lines.extend("    " + line for line in a["diff"].splitlines())
    log.info("%s", "\n".join(lines))


def _f(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}"
