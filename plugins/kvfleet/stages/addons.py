"""Stage 2: the HyperPod Inference Operator and its dependencies, as EKS add-ons, in order.

``aws-mountpoint-s3-csi-driver``, ``aws-fsx-csi-driver``, ``metrics-server``, ``cert-manager``, then
``amazon-sagemaker-hyperpod-inference`` with its configuration values from the inventory. Create what is
missing, update what differs (version or configuration), leave what matches. Each one must be ACTIVE before
the next starts (the operator add-on fails without cert-manager); CREATE_FAILED, DEGRADED and UPDATE_FAILED
fail at once with the add-on's health issues.

resolveConflicts policy:
- on **create**, ``OVERWRITE``: a cluster that had the operator installed by Helm before has objects the add-on
  must take over (docs/reference/hyperpod.md#inference-operator-controller);
- on **update**, ``PRESERVE``: a platform team's own changes to add-on resources survive a version or config
  change kvfleet makes.
Then verify that the operator's controller Deployment is Ready and that the InferenceEndpointConfig CRD is served.
On a kyverno-mode cluster, last, Kyverno itself (``stages.kyverno``): installed with helm at a
pinned chart version when missing (or refused with the exact command), and its admission webhook verified ready,
before stage 4 applies the ClusterPolicy.

Each create or update is a typed action (``fleet.actions.CreateAddon``/``UpdateAddon``) that ``stages.executor``
applies with its write-ahead record, or renders in a dry run. The stage is split (``base.Pending``): ``act`` makes
the next add-on's change and hands the wait for ACTIVE to its caller, then the wait for the operator's controller
when it is not ready yet (the rollout defers them to Airflow's triggerer); ``finish`` reconciles
Kyverno and records. ``reconcile`` runs both, waiting
in the worker.
"""

from __future__ import annotations

import json
from typing import Any

from kvfleet.clients.kube import wait_for
from kvfleet.fleet import constants as C
from kvfleet.fleet.actions import CreateAddon, UpdateAddon, canonical
from kvfleet.stages import executor, kyverno, readiness
from kvfleet.stages.base import Outcome, Pending, StageContext
from kvfleet.stages.converge import converge

STAGE = "operator_addons"
RESOLVE_ON_CREATE = "OVERWRITE"
RESOLVE_ON_UPDATE = "PRESERVE"


def _config_of(addon: dict[str, Any]) -> dict[str, Any] | None:
    raw = addon.get("configurationValues")
    if not raw:
        return None
    try:
        return dict(json.loads(raw))
    except ValueError:
        return {"unparseable": raw}


def addon_diff(live: dict[str, Any] | None, version: str | None, config: dict[str, Any] | None) -> list[str]:
    """What differs between a live add-on and the inventory (empty: leave it alone)."""
    if live is None:
        return ["missing"]
    diffs = []
    if version and live.get("addonVersion") != version:
        diffs.append(f"version {live.get('addonVersion')} -> {version}")
    if config is not None and _config_of(live) != config:
        diffs.append("configurationValues differ")
    if live.get("status") in ("CREATE_FAILED", "UPDATE_FAILED", "DEGRADED"):
        diffs.append(f"status {live.get('status')}")
    return diffs


def _ensure_one(ctx: StageContext, eks: str, name: str) -> tuple[str, Pending | None]:
    """One add-on: (its result, the wait it needs). Unchanged but not ACTIVE (a change in flight) waits too."""
    spec = ctx.cluster.addon(name)
    config = dict(spec.configuration) if spec.configuration is not None else None
    live = ctx.hyperpod.describe_addon(eks, name)
    diffs = addon_diff(live, spec.version, config)
    if not diffs:
        if live and live.get("status") != "ACTIVE" and not ctx.dry_run:
            return "unchanged", Pending(f"before:{name}", f"EKS add-on {name} on {eks} is {live.get('status')}",
                                        ctx.timeouts.addon_s, addon=name, eks=eks)
        return "unchanged", None
    action = addon_action(eks, name, live, spec.version or None, config, "; ".join(diffs))  # "": installed one
    if not ctx.dry_run:
        ctx.say(f"stage 2: {action.equivalent()} ({'; '.join(diffs)})")
    executor.run(ctx, STAGE, [action])
    if ctx.dry_run:
        return "planned", None
    return "changed", Pending(f"after:{name}", f"{action.equivalent()}", ctx.timeouts.addon_s, addon=name, eks=eks)


def addon_action(eks: str, name: str, live: dict[str, Any] | None, version: str | None,
                 config: dict[str, Any] | None, diff: str) -> CreateAddon | UpdateAddon:
    """Create what is missing (OVERWRITE), update what differs (PRESERVE)."""
    conf = canonical(config) if config is not None else None
    if live is None:
        return CreateAddon(eks, name, version, conf, RESOLVE_ON_CREATE, diff=diff)
    return UpdateAddon(eks, name, version, conf, RESOLVE_ON_UPDATE, diff=diff)


def verify_operator(ctx: StageContext) -> str:
    """The operator's controller is Ready (found wherever it is installed: ``operator_pause.find_controller``,
    the add-on's name, the Helm chart's name or its labels) and the InferenceEndpointConfig CRD is served
    (``stages.readiness.operator``)."""
    return wait_for(lambda: readiness.operator(ctx.kube), timeout_s=ctx.timeouts.pods_s, poll_s=ctx.poll_s,
                    what=f"[{ctx.cluster.name}] {readiness.WHAT['operator']}", progress=ctx.progress)


def reconcile(ctx: StageContext) -> Outcome:
    """Stage 2 to its end in this process (``act``, waiting in the worker, ``finish``)."""
    return converge(ctx, act, finish)


def act(ctx: StageContext, progress: dict[str, Any]) -> Pending | None:
    """The next add-on, in order, that needs a change (made here) or a wait: returns that wait
    (``base.Pending``); the caller waits for ACTIVE, in the worker or deferred, then calls ``act`` again, which
    goes on with the next add-on (``progress["results"]`` keeps each one's result). None: all five are done."""
    eks = progress.get("eks") or ctx.hyperpod.require_cluster(ctx.cluster.name).eks_cluster_name
    progress["eks"] = eks
    results: dict[str, str] = progress.setdefault("results", {})
    for name in C.ADDON_ORDER:
        if name in results:
            continue
        result, pending = _ensure_one(ctx, eks, name)
        results[name] = result
        if pending is not None:
            return pending
    if ctx.dry_run or progress.get("operator"):
        return None
    ready, state = readiness.operator(ctx.kube)  # one look (again after a wait); not ready: a wait for the caller
    progress["operator"] = state if ready else None
    if ready:
        return None
    return Pending("after:operator", f"stage 2: {state}", ctx.timeouts.pods_s, check="operator")


def finish(ctx: StageContext, progress: dict[str, Any]) -> Outcome:
    """Every add-on done: verify the operator, then Kyverno on a kyverno-mode cluster, and record."""
    results: dict[str, str] = dict(progress["results"])
    changed = [n for n, r in results.items() if r == "changed"]
    planned = [n for n, r in results.items() if r == "planned"]
    if ctx.dry_run:
        policy_engine = kyverno.reconcile(ctx).outcome.value
        outcome = "planned" if planned or policy_engine == "planned" else "unchanged"
        return ctx.record("addons", STAGE, outcome, addons=results, kyverno=policy_engine)
    state = progress.get("operator") or verify_operator(ctx)  # ready already when the caller waited: one read
    policy_engine = kyverno.reconcile(ctx).outcome.value
    outcome = "changed" if changed or policy_engine == "changed" else "unchanged"
    if not changed:
        ctx.say("stage 2: all five add-ons ACTIVE with the inventory's version and configuration")
    return ctx.record("addons", STAGE, outcome, addons=results, operator=state, kyverno=policy_engine)
