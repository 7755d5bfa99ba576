"""The fault matrix's cases: a mutating step, a fault injected through the sandbox's admin API while it
runs, then the four promises checked. Used by tests/faults/test_fault_matrix.py and bench/fault_matrix.py.

A case: make the step have work (a flipped inventory value, a deleted object, an operator re-render), count the
Curvine master's files, inject the fault, run the step (it may fail: a fault may beat its retries), clear the
fault, recover as production would (SIGKILL: the drift check with remediation, judged 6 minutes after the death),
then check the invariants. Each invariant is a bool with its evidence, so the bench can print the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kvfleet.fleet import constants as C
from kvfleet.fleet.inventory import Endpoint, Inventory, load_inventory
from kvfleet.history.keys import StepKey
from kvfleet.history.leases import Leases
from kvfleet.history.repos import HistoryRepos
from kvfleet.outcomes import RunStatus
from kvfleet.stages.base import StageContext, Timeouts

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROD = "ml-prod-use1"  # patch mode: the operator pause/scale/patch/restore sequence
STAGE = "ml-stage-usw2"  # kyverno mode: the ClusterPolicy
ROLLED = ("retail-assistant", "payments-disputes")
MUTATING_K8S = {"create", "update", "patch", "delete", "deletecollection"}
MUTATING_AWS = {"UpdateCluster", "CreateAddon", "UpdateAddon", "DeleteAddon", "CreateCluster"}
ADDON = "amazon-sagemaker-hyperpod-inference"

# fault -> the admin API body that injects it (the cluster is added per case); "sigkill" kills the step's worker.
FAULTS: dict[str, dict[str, Any] | None] = {
    "5xx_20pct": {"kind": "api_error_rate", "rate": 0.2, "target": "all"},
    "conflict_409": {"kind": "api_conflict", "count": 1, "target": "all"},
    "latency_1s": {"kind": "api_latency", "seconds": 1.0, "target": "all"},
    "network_failure": {"kind": "api_network_failure", "count": 2, "target": "all"},
    "sigkill": None,
}
STEPS = ("stage1_update_cluster", "stage2_addon", "stage3_curvine", "stage4_patch_wave", "kyverno_policy",
         "drift_remediation")
SIGKILL_STEPS = ("stage4_patch_wave",)
INVARIANTS = ("l2_files_kept", "operator_running", "replicas_ready", "no_dead_lease", "history_recorded",
              "second_run_converges", "third_run_no_mutation")

# The subprocess a SIGKILL case kills: the wave's task body as the worker runs it (lease, then the sequence). A
# lease is keyed by the cluster's key account/region/name, as the rollout takes it.
WAVE_TASK = """
import sys
sys.path.insert(0, {here!r})
from faultkit import FaultEnv, PROD
from kvfleet.history.keys import StepKey
from kvfleet.history.repos import HistoryRepos
from kvfleet.outcomes import RunStatus
from kvfleet.stages import endpoints
from kvfleet.stages.base import StageContext, Timeouts
from kvfleet.stages.locks import ClusterLock

inv = FaultEnv.inventory_for_matrix()
ctx = StageContext(inventory=inv, cluster=inv.cluster(PROD), aws_conn_id=None, history=HistoryRepos.on(),
                   step_key=StepKey({holder!r}, "wave"), timeouts=Timeouts(cluster_update_s=60, addon_s=60,
                   pods_s=120, pvc_s=30))
ClusterLock(ctx.history, ctx.cluster.key, {holder!r}, "rollout", wait_s=30, poll_s=0.2).acquire()
print("lease taken", flush=True)
endpoints.reconcile_wave(ctx, list(inv.endpoints_of(PROD)), holder={holder!r})
print("wave finished before the kill", flush=True)
"""


def wait(predicate: Callable[[], bool], timeout: float = 60.0, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return True
        except Exception:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)


@dataclass
class CaseResult:
    step: str
    fault: str
    step_error: str | None = None
    invariants: dict[str, bool] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        return bool(self.invariants) and all(self.invariants.values())

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "fault": self.fault, "held": self.held, "step_error": self.step_error,
                "invariants": self.invariants, "evidence": self.evidence}


class FaultEnv:
    """One sandbox (two clusters), one history database, the inventory the steps reconcile to."""

    def __init__(self, sandbox: Any, history: HistoryRepos, history_url: str) -> None:
        self.sandbox = sandbox
        self.history = history
        self.history_url = history_url
        self.inv = self.inventory_for_matrix()
        self.flips = 0
        self._ctxs: list[StageContext] = []

    @staticmethod
    def inventory_for_matrix() -> Inventory:
        inv = load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")
        eps = tuple(e for e in inv.endpoints if e.cluster == PROD and e.name in ROLLED)
        return inv.model_copy(update={"endpoints": eps})

    # --- contexts, admin, counters --------------------------------------------------------------------------

    def ctx(self, cluster: str = PROD, run_key: str | None = None, task: str = "step") -> StageContext:
        ctx = StageContext(inventory=self.inv, cluster=self.inv.cluster(cluster), aws_conn_id=None,
                           history=self.history, step_key=StepKey(run_key, task) if run_key else None,
                           timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=60, pvc_s=30))
        self._ctxs.append(ctx)
        return ctx

    def close(self) -> None:
        for ctx in self._ctxs:
            ctx.close()
        self._ctxs.clear()

    def admin(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.sandbox.admin.url + path, data=data,
                                     method="POST" if data is not None else "GET")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def reset_counters(self) -> None:
        self.admin("/reset-requests", {})

    def mutating_calls(self, cluster: str) -> dict[str, Any]:
        answer = self.admin(f"/requests?cluster={cluster}")
        k8s = {k: n for k, n in answer["clusters"][cluster]["counts"].items() if k.split(" ", 1)[0] in MUTATING_K8S}
        aws = [op for op in answer["aws"]["operations"] if op.split(":", 1)[-1] in MUTATING_AWS]
        return {"k8s": k8s, "aws": aws}

    def endpoints(self, cluster: str) -> list[Endpoint]:
        return list(self.inv.endpoints_of(cluster))

    # --- set-up -------------------------------------------------------------------------------------------

    def converge(self) -> None:
        from kvfleet.stages import addons, curvine, endpoints, tiered_storage

        for cluster in (PROD, STAGE):
            ctx = self.ctx(cluster)
            for stage in (tiered_storage, addons, curvine):
                stage.reconcile(ctx)
        ctx = self.ctx(PROD)
        endpoints.reconcile_wave(ctx, self.endpoints(PROD), holder="faults/converge")
        self.write_l2_files(12)

    def write_l2_files(self, n: int) -> None:
        twin = self.sandbox.twin(PROD)
        for i in range(n):
            twin.l2.write(f"/l2cache/faults/vllm@qwen2/chunk-{i:03d}.pt", 1_000_000 + i)
        sim = twin.services["curvine"]
        wait(lambda: len(sim.placement()) >= n, 15)

    # --- the invariants' observations ---------------------------------------------------------------------

    def files_total(self) -> int:
        from kvfleet.clients.curvine import CurvineMaster

        ctx = self.ctx(PROD)
        return int(CurvineMaster(ctx.kube, ctx.cluster.curvine.namespace).overview().snapshot()["files_total"])

    def ready(self, cluster: str, ep: Endpoint) -> int:
        pods = self.sandbox.twin(cluster).store.list("", "pods", ep.namespace, label_selector=f"app={ep.name}")
        return sum(1 for p in pods if not p["metadata"].get("deletionTimestamp") and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (p.get("status") or {}).get("conditions") or []))

    def operator_state(self, cluster: str) -> dict[str, Any]:
        from kvfleet.stages import operator_pause

        return operator_pause.pause_state(self.ctx(cluster))

    # --- steps: make work, run ----------------------------------------------------------------------------

    def _flip_cluster(self, cluster: str, **changes: Any) -> None:
        clusters = [c.model_copy(update=changes) if c.name == cluster else c for c in self.inv.clusters]
        self.inv = self.inv.model_copy(update={"clusters": clusters})

    def prepare(self, step: str) -> str:
        """Give the step something to do; return the cluster it acts on."""
        self.flips += 1
        if step == "stage1_update_cluster":
            tiered = self.inv.cluster(PROD).tiered_storage
            self._flip_cluster(PROD, tiered_storage=tiered.model_copy(
                update={"memory_percent": 25 if tiered.memory_percent != 25 else 30}))
            return PROD
        if step == "stage2_addon":
            spec = self.inv.cluster(PROD).addon(ADDON)
            conf = dict(spec.configuration or {})
            conf["keda"] = {"enabled": not bool((conf.get("keda") or {}).get("enabled"))}
            addons = [a.model_copy(update={"configuration": conf}) if a.name == ADDON else a
                      for a in self.inv.cluster(PROD).addons]
            self._flip_cluster(PROD, addons=addons)
            return PROD
        if step == "stage3_curvine":
            from kvfleet.stages import curvine

            name = curvine.storage_class_manifest(self.ctx(PROD))["metadata"]["name"]
            store = self.sandbox.twin(PROD).store
            if store.get("storage.k8s.io", "storageclasses", name) is not None:
                store.delete("storage.k8s.io", "storageclasses", name)
            return PROD
        if step == "kyverno_policy":
            from kvfleet.fleet.endpoint_spec import kyverno_policy

            name = kyverno_policy(self.inv.settings)["metadata"]["name"]
            store = self.sandbox.twin(STAGE).store

            def hand_edit(policy: dict[str, Any]) -> dict[str, Any]:  # stage 4 patches it back (by name)
                policy["spec"]["background"] = not policy["spec"].get("background", False)
                return policy

            store.mutate("kyverno.io", "clusterpolicies", name, None, hand_edit)
            return STAGE
        if step in ("stage4_patch_wave", "drift_remediation"):
            twin = self.sandbox.twin(PROD)
            ep = self.endpoints(PROD)[self.flips % len(ROLLED)]
            generation = twin.store.get("apps", "deployments", ep.name, ep.namespace)["metadata"]["generation"]
            twin.services["operator"].rerender_now(ep.namespace, ep.name)
            assert wait(lambda: twin.store.get("apps", "deployments", ep.name, ep.namespace)["metadata"][
                "generation"] != generation, 30), "the operator did not re-render"
            return PROD
        raise ValueError(f"unknown step {step!r}")

    def run_step(self, step: str, run_key: str) -> None:
        from kvfleet.stages import addons, curvine, drift, endpoints, tiered_storage
        from kvfleet.stages.locks import ClusterLock

        self.history.runs.start(run_key, dag_id=run_key.split("/")[0], run_id=run_key.split("/", 1)[1],
                               trigger="test", triggered_by=None, params={})
        status = "failed"
        try:
            if step == "stage1_update_cluster":
                tiered_storage.reconcile(self.ctx(PROD, run_key, "update_cluster"))
            elif step == "stage2_addon":
                addons.reconcile(self.ctx(PROD, run_key, "addons"))
            elif step == "stage3_curvine":
                curvine.reconcile(self.ctx(PROD, run_key, "curvine"))
            elif step == "kyverno_policy":
                ctx = self.ctx(STAGE, run_key, "kyverno")
                outcome = endpoints.ensure_kyverno_policy(ctx)
                ctx.record("kyverno_policy", "endpoints", outcome)
            elif step == "stage4_patch_wave":
                ctx = self.ctx(PROD, run_key, "wave")
                lock = ClusterLock(self.history, ctx.cluster.key, run_key, "rollout", wait_s=30,
                                   poll_s=0.2).acquire()
                try:
                    endpoints.reconcile_wave(ctx, self.endpoints(PROD), holder=run_key)
                finally:
                    lock.release()
            elif step == "drift_remediation":
                drift.check(self.ctx(PROD, run_key, "check_cluster"), remediate=True)
            else:
                raise ValueError(f"unknown step {step!r}")
            status = "success"
        finally:
            self.history.runs.close(run_key, status)

    def run_killed_wave(self, run_key: str) -> datetime:
        """The wave in a worker subprocess, SIGKILLed once the operator's pause names it; the time of death."""
        twin = self.sandbox.twin(PROD)
        server = self.sandbox.servers[PROD]
        env = {**os.environ, "KVFLEET_HISTORY_URL": self.history_url}
        self.history.runs.start(run_key, dag_id="kvfleet_rollout", run_id=run_key.split("/", 1)[1], trigger="test",
                               triggered_by=None, params={})
        server.latency_s = 0.2  # slow enough to be killed between the pause and the restore
        proc = subprocess.Popen([sys.executable, "-c", WAVE_TASK.format(here=str(HERE), holder=run_key)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            def paused() -> bool:
                dep = twin.store.get("apps", "deployments", C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE)
                return proc.poll() is not None or (dep["metadata"].get("annotations") or {}).get(
                    C.PAUSED_BY_ANNOTATION) == run_key
            wait(paused, 120, 0.05)
            if proc.poll() is not None:
                raise AssertionError(f"the wave ended before the kill: {proc.stdout.read() if proc.stdout else ''}")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return datetime.now(UTC)
        finally:
            server.latency_s = 0.0
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            if proc.stdout:
                proc.stdout.close()
            # Airflow marks the run failed once its task is gone (zombie detection); the test plays that part.
            self.history.runs.close(run_key, "failed")

    # --- a case -------------------------------------------------------------------------------------------

    def _intents(self, run_key: str) -> int:
        from sqlalchemy import text

        with self.history.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM audit_log WHERE run_key = :k AND kind = 'intent'"),
                                    {"k": run_key}).scalar_one())

    def run_case(self, step: str, fault: str) -> CaseResult:
        result = CaseResult(step, fault)
        cluster = self.prepare(step)
        files_before = self.files_total()
        stamp = f"{step}.{fault}.{self.flips}"
        run_key = f"kvfleet_faults/{stamp}"
        self.reset_counters()
        if fault == "sigkill":
            died = self.run_killed_wave(run_key)
            result.step_error = "SIGKILL"
            # Recovery: the next drift check (every 10 min), judged 6 minutes after the death.
            check_key = f"kvfleet_drift_check/after.{stamp}"
            self.history.runs.start(check_key, dag_id="kvfleet_drift_check", run_id=f"after.{stamp}",
                                   trigger="test", triggered_by=None, params={})
            from kvfleet.stages import drift

            check = drift.check(self.ctx(cluster, check_key, "check_cluster"), remediate=True,
                                now=died + timedelta(minutes=6))
            self.history.runs.close(check_key, "success")
            result.evidence["recovery"] = [{k: r[k] for k in ("action", "outcome")} for r in check.remediations]
            restores = [s for s in self.history.runs.steps(check_key) if s["step"].startswith(
                "drift_remediate:restore_operator")]
            result.evidence["restored_from"] = [(s["detail"].get("detail") or {}).get("restored_from")
                                                for s in restores]
        else:
            body = dict(FAULTS[fault] or {}, cluster=cluster)
            self.admin("/fault", body)
            try:
                self.run_step(step, run_key)
            except Exception as exc:
                result.step_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            finally:
                self.admin("/fault", {"kind": "clear", "cluster": "*"})
        result.evidence["mutating_during_fault"] = self.mutating_calls(cluster)
        self._check(result, cluster, run_key, files_before, stamp)
        return result

    def _check(self, result: CaseResult, cluster: str, run_key: str, files_before: int, stamp: str) -> None:
        inv = result.invariants
        files_after = self.files_total()
        result.evidence["files"] = [files_before, files_after]
        inv["l2_files_kept"] = files_after >= files_before

        def operator_up() -> bool:
            state = self.operator_state(cluster)
            result.evidence["operator"] = {k: state.get(k) for k in ("paused_by", "ready", "replicas")}
            return state["paused_by"] is None and (state.get("ready") or 0) >= 1
        inv["operator_running"] = wait(operator_up, 60)

        def replicas_ok() -> bool:
            short = {ep.key: self.ready(cluster, ep) for ep in self.endpoints(cluster)
                     if self.ready(cluster, ep) < ep.replicas}
            result.evidence["short_replicas"] = short
            return not short
        inv["replicas_ready"] = wait(replicas_ok, 90)

        lease = Leases(self.history.engine).get(self.inv.cluster(cluster).key)  # leases are keyed by the key
        result.evidence["lease"] = lease and {k: lease.get(k) for k in ("holder", "state")}
        inv["no_dead_lease"] = lease is None

        run = self.history.runs.get(run_key) or {}
        steps = self.history.runs.steps(run_key)
        result.evidence["history"] = {"status": run.get("status"), "steps": len(steps)}
        result.evidence["history"]["intents"] = self._intents(run_key)
        if result.fault == "sigkill":
            # The killed run is closed failed, and the drift check's restore names it (who paused, who restored).
            inv["history_recorded"] = run.get("status") == "failed" and result.evidence.get(
                "restored_from") == [run_key]
        else:
            inv["history_recorded"] = bool(run) and run.get("status") in set(RunStatus) and (
                bool(steps) or result.step_error is not None)

        second = f"kvfleet_faults/{stamp}.second"
        try:
            self.run_step(result.step, second)
            inv["second_run_converges"] = True
        except Exception as exc:
            result.evidence["second_run_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            inv["second_run_converges"] = False
        inv["replicas_ready"] = inv["replicas_ready"] and wait(replicas_ok, 90)
        self.reset_counters()
        try:
            self.run_step(result.step, f"kvfleet_faults/{stamp}.third")
            calls = self.mutating_calls(cluster)
        except Exception as exc:
            calls = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        result.evidence["third_run_mutations"] = calls
        inv["third_run_no_mutation"] = calls == {"k8s": {}, "aws": []}


def table(results: list[dict[str, Any]]) -> str:
    """steps x faults -> "held" or the invariants that did not hold."""
    faults = [f for f in FAULTS if any(r["fault"] == f for r in results)]
    steps = [s for s in STEPS if any(r["step"] == s for r in results)]
    by = {(r["step"], r["fault"]): r for r in results}
    cells = [["step", *faults]]
    for s in steps:
        row = [s]
        for f in faults:
            r = by.get((s, f))
            if r is None:
                row.append("-")
            elif r["held"]:
                row.append(f"held ({len(r['invariants'])}/{len(r['invariants'])})")
            else:
                row.append("BROKEN: " + ",".join(k for k, v in r["invariants"].items() if not v))
        cells.append(row)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells)
