"""Typed actions against the sandbox: the dry run (`kvfleet plan --diff`) lists exactly the actions a real run then
applies, stages 1 to 4 — stage 3's helm upgrade with the digest of the values file helm gets, and the rolling and surge
update strategies keep every endpoint serving while the L2 patch rolls out, the original strategy back before the
operator."""

from __future__ import annotations

import dataclasses
import io
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from stagekit import converge_cluster, endpoint, wait_pods_ready, with_cluster, without_overlay

from kvfleet.fleet import actions as A
from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_values as cv
from kvfleet.fleet.plan import ROLLING as ROLLING_FIELDS
from kvfleet.fleet.plan import make_plan
from kvfleet.history.keys import StepKey
from kvfleet.stages import addons, curvine, dry_run, endpoints, executor, operator_pause, tiered_storage

pytestmark = pytest.mark.integration
PROD = "ml-prod-use1"  # patch mode



def test_plan_diff_lists_exactly_the_actions_a_real_run_applies(fleet_env, make_ctx, inventory, history) -> None:  # type: ignore[no-untyped-def]
    # A fresh cluster first: the dry run of stages 1-3 lists what the first converge then applies, stage 3's
    # first install included (curvine-csi, the StorageClass, curvine with the format flags true, the flip).
    fresh = make_ctx(PROD, dry_run=True)
    for stage in (tiered_storage, addons, curvine):
        stage.reconcile(fresh)
    ctx0 = converge_cluster(make_ctx, PROD)
    assert executor.journal(fresh) == executor.journal(ctx0)
    first = [(type(a).__name__, getattr(a, "release", None), getattr(a, "why", None))
             for a in executor.journal(ctx0) if isinstance(a, A.HelmInstall | A.HelmUpgrade | A.CreateStorageClass)]
    assert first == [("HelmInstall", C.CURVINE_CSI_RELEASE, None), ("CreateStorageClass", None, None),
                     ("HelmInstall", C.CURVINE_RELEASE, "format flags true"),
                     ("HelmUpgrade", C.CURVINE_RELEASE, "format flags false")]
    names = ("retail-search-rag", "payments-kyc-rag")
    without_overlay(fleet_env, ctx0, [endpoint(inventory, PROD, n) for n in names], PROD)
    # Work for stage 3 too: a hand-made upgrade left a format flag true on the deployed release.
    spec = ctx0.cluster.curvine
    ctx0.helm.upgrade(C.CURVINE_RELEASE, spec.chart, spec.namespace, repo=curvine.repo_url(ctx0), version=spec.version,
                      values={"cluster.formatMaster": True})
    # Work for stage 1 too: the inventory now asks for another memory share.
    inv = with_cluster(inventory, PROD, memory_percent=30).select(
        clusters=[PROD], endpoints=[f"{PROD}:{endpoint(inventory, PROD, n).key}" for n in names])
    plan = make_plan(inv, wave_size=2, canary=False)

    planned = dry_run.observe_cluster(inv, plan, PROD, holder="t/cmp")
    out = io.StringIO()
    dry_run.print_cluster_diff(planned, out)
    printed = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()
               if line.startswith("[") and f"] {A.EQUIVALENT_MARK} " in line]

    history.runs.start("t/cmp", dag_id="t", run_id="cmp", trigger="test", triggered_by=None, params={})
    ctx = make_ctx(PROD, inv=inv, history=history)
    ctx.step_key = StepKey("t/cmp", "stages")
    for stage in (tiered_storage, addons, curvine):
        stage.reconcile(ctx)
    for wave in plan.waves_of(PROD):
        outcomes = endpoints.reconcile_wave(ctx, list(wave.endpoints), holder="t/cmp")
        assert {o.outcome for o in outcomes} == {"changed"}
    applied = executor.journal(ctx)

    assert list(planned.actions) == applied  # the same calls, same arguments, same order
    assert printed == [A.render(a) for a in applied]  # and `plan --diff` prints exactly those
    kinds = [type(a).__name__ for a in applied]
    assert kinds[0] == "UpdateCluster" and kinds[-1] == "RestoreOperator"
    assert kinds.count("PatchDeployment") == 2 and "Scale" not in kinds  # both rolled, never scaled to 0
    # Stage 3, between stage 1 and stage 4: the hazard flipped back with --reuse-values and a values file whose
    # digest the dry run printed; the write-ahead record names it; the release's flags are false now.
    helm = [a for a in applied if isinstance(a, A.HelmUpgrade)]
    assert [(a.why, a.reuse_values, a.values_map()) for a in helm] == [
        ("fix format-flag hazard (formatMaster)", True, {**cv.safe_flags(), **cv.NO_CHART_RBAC})]
    assert kinds.index("UpdateCluster") < kinds.index("HelmUpgrade") < kinds.index("PauseOperator")
    assert sum(f"-f values-{helm[0].values_digest}.yaml" in line for line in printed) == 1
    assert not any("--set" in line for line in printed)
    assert not cv.flags_set(ctx.helm.values(C.CURVINE_RELEASE, spec.namespace))
    audit = history.queries.rows("write_ahead", cutoff=datetime.now(UTC) - timedelta(days=1), run_key="t/cmp",
                          cluster=None, endpoint=None, limit=100)
    assert [(r["target"], r["outcome"]) for r in audit if r["action"] == "helm_upgrade"] == [
        (helm[0].target(), "changed")]
    # The comparison can fail: a dry run that had listed another values file (digest) would not match.
    at = kinds.index("HelmUpgrade")
    other = [*planned.actions[:at], dataclasses.replace(helm[0], values_digest="0" * 16), *planned.actions[at + 1:]]
    assert other != applied
    assert all("update strategy rolling" in text for _, text in planned.notes)
    # Converged: a second dry run finds nothing left to do.
    assert dry_run.observe_cluster(inv, plan, PROD).actions == ()


class ReadyWatch:
    """Ready pods per endpoint, followed from the twin's store events (every pod change, none missed)."""

    def __init__(self, store: Any, eps: list[Any]) -> None:
        self.names = {ep.name: ep for ep in eps}
        self.lock = threading.Lock()
        self.ready: dict[str, dict[str, bool]] = {n: {} for n in self.names}
        self.rv: dict[str, int] = {}
        self.active = True
        for ep in eps:
            for pod in store.list("", "pods", ep.namespace, label_selector=f"app={ep.name}"):
                self._see("ADDED", pod)
        self.lowest = {n: self.count(n) for n in self.names}
        store.subscribe(self.on_event)

    def count(self, name: str) -> int:
        return sum(self.ready[name].values())

    def _see(self, kind: str, pod: dict[str, Any]) -> None:
        name = str((pod["metadata"].get("labels") or {}).get("app"))
        if name not in self.names:
            return
        pod_name, rv = pod["metadata"]["name"], int(pod["metadata"].get("resourceVersion") or 0)
        if rv < self.rv.get(pod_name, 0):
            return  # an older event delivered late by another thread
        self.rv[pod_name] = rv
        if kind == "DELETED":
            self.ready[name].pop(pod_name, None)
        else:
            self.ready[name][pod_name] = any(c.get("type") == "Ready" and c.get("status") == "True"
                                             for c in (pod.get("status") or {}).get("conditions") or [])

    def on_event(self, kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "pods" or not self.active:
            return
        with self.lock:
            self._see(kind, obj)
            name = str((obj["metadata"].get("labels") or {}).get("app"))
            if name in self.names:
                self.lowest[name] = min(self.lowest[name], self.count(name))


def test_rolling_and_surge_keep_every_endpoint_serving(fleet_env, make_ctx, inventory) -> None:  # type: ignore[no-untyped-def]
    # support-chat keeps 2 replicas (auto -> rolling); support-summaries has 1 (auto -> surge: the twin's nodes
    # have spare GPUs).
    inv = inventory.model_copy(update={"endpoints": [
        e.model_copy(update={"replicas": 1}) if e.name == "support-summaries" and e.cluster == PROD else e
        for e in inventory.endpoints]})
    ctx = converge_cluster(make_ctx, PROD, inv=inv)
    eps = [endpoint(inv, PROD, "support-chat"), endpoint(inv, PROD, "support-summaries")]
    without_overlay(fleet_env, ctx, eps, PROD)
    twin = fleet_env.twin(PROD)
    before = {ep.key: twin.store.get("apps", "deployments", ep.name, ep.namespace)["spec"]["strategy"] for ep in eps}
    watch = ReadyWatch(twin.store, eps)
    assert watch.lowest == {"support-chat": 2, "support-summaries": 1}
    try:
        outcomes = endpoints.reconcile_wave(ctx, eps, holder="t/roll")
    finally:
        watch.active = False
    assert [o.outcome for o in outcomes] == ["changed", "changed"]
    assert [o.detail["update_strategy"]["strategy"] for o in outcomes] == ["rolling", "surge"]
    assert watch.lowest == {"support-chat": 1, "support-summaries": 1}  # N-1 and N kept serving, never 0
    for ep in eps:
        dep = twin.store.get("apps", "deployments", ep.name, ep.namespace)
        assert dep["spec"]["strategy"] == before[ep.key]  # the original strategy is back
        wait_pods_ready(twin, ep, ep.replicas, env={C.ENV_REMOTE_URL: C.L2_URL})
    state = operator_pause.pause_state(ctx)
    assert state["paused_by"] is None and state["ready"] >= 1
    applied = [a for a in executor.journal(ctx) if isinstance(a, A.SetRolloutStrategy | A.RestoreOperator
                                                               | A.WaitPods | A.Scale)]
    assert not any(isinstance(a, A.Scale) for a in applied)
    # Strategies back only after every pod is Ready with the overlay, and the operator back after that.
    assert [type(a).__name__ for a in applied] == ["SetRolloutStrategy", "SetRolloutStrategy", "WaitPods",
                                                   "SetRolloutStrategy", "SetRolloutStrategy", "RestoreOperator"]
    assert [a.restore for a in applied if isinstance(a, A.SetRolloutStrategy)] == [False, False, True, True]


def test_a_temporary_strategy_left_by_a_killed_run_is_put_back_by_the_next(fleet_env, make_ctx,  # type: ignore[no-untyped-def]
                                                                            inventory) -> None:
    ctx = converge_cluster(make_ctx, PROD)
    ep = endpoint(inventory, PROD, "retail-catalog-qa")
    endpoints.reconcile_wave(ctx, [ep], holder="t/first")
    twin = fleet_env.twin(PROD)

    def deployment() -> dict[str, Any]:
        dep: dict[str, Any] = twin.store.get("apps", "deployments", ep.name, ep.namespace)
        return dep

    original = deployment()["spec"]["strategy"]
    # The killed run: paused, put its temporary strategy on, died; the teardown restored the operator.
    operator_pause.pause(ctx, "t/killed")
    executor.run(ctx, "endpoint", [A.SetRolloutStrategy(ep.ref, ep.namespace, ep.name, A.canonical(ROLLING_FIELDS),
                                                        original=A.canonical(original))])
    wait_for_state(lambda: deployment()["status"].get("observedGeneration") == deployment()["metadata"]["generation"])
    operator_pause.restore(ctx, "t/killed")
    assert deployment()["spec"]["strategy"] == ROLLING_FIELDS
    assert deployment()["metadata"]["annotations"][A.ORIGINAL_STRATEGY_ANNOTATION] == A.canonical(original)

    again = make_ctx(PROD)
    (out,) = endpoints.reconcile_wave(again, [ep], holder="t/next")
    assert out.outcome == "unchanged"  # the overlay was there all along
    # Put back inside a pause of its own, the operator restored only once the Deployment is rolled out.
    assert [type(a).__name__ for a in executor.journal(again)] == ["PauseOperator", "SetRolloutStrategy",
                                                                   "WaitRolledOut", "RestoreOperator"]
    assert deployment()["spec"]["strategy"] == original
    assert A.ORIGINAL_STRATEGY_ANNOTATION not in deployment()["metadata"]["annotations"]


def wait_for_state(predicate: Any, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "state not reached"
        time.sleep(0.05)
