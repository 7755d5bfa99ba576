"""Benchmark: from a change made by hand to a recorded drift finding, through the watch path.

Starts a sandbox (the example fleet reduced to ml-prod-use1 and two endpoints, in ``l2_injection: patch`` with 2
Curvine workers as the tests' fleet: ``fleet_text()``; stages 1–3 and the two endpoints rolled out) and a fresh
embedded PostgreSQL for the history, then runs kvfleet's ``KubeWatchTrigger`` for ml-prod-use1 on an asyncio loop
in a thread, exactly as the triggerer runs ``run()`` (the class ``dags/kvfleet_drift_watch.py``'s
``FleetWatchTrigger`` runs per inventory cluster, with its ``quiet_s`` of 15 s). Each trial makes one change
by hand, then for every event the trigger emits runs the drift check of that cluster
(``kvfleet.stages.drift.check``, the body of ``kvfleet_drift_check``'s and ``kvfleet_drift_watch``'s
``check_cluster`` task), until the expected finding is recorded. Changes:

- ``kubectl_patch``: ``kubectl patch`` of an endpoint Deployment's container env (the real ``.tools/bin/kubectl``);
  the running operator re-renders the Deployment over it, which loses kvfleet's L2 patch: ``patch_lost_to_reconcile``;
- ``helm_upgrade``: ``helm upgrade --reuse-values --set cluster.formatMaster=true`` of Curvine by hand (the real
  ``helm``): ``format_flag_set``;
- ``operator_rerender``: the Inference Operator re-renders an endpoint (the sandbox's fault hook, what an operator
  upgrade does): ``patch_lost_to_reconcile``.

Between trials the drift check remediates (``remediate=True``) and the watch's own bursts are drained (not timed).

What is *not* the real Airflow path: no triggerer process, no scheduler and no worker. In Airflow the event
becomes an asset event, the scheduler creates a ``kvfleet_drift_watch`` run on its next loop and a worker starts
the task. ``--live`` measures that path (``bench/drift_latency_live.py``: the local service of ``make up``, the
asset event, the run and its task timed from Airflow's metadata database). The debounce (``quiet_s``) is in the
figures of both.

    python bench/drift_latency.py [--trials 3] [--quiet-s 15] [--json]
    python bench/drift_latency.py --live [--trials 3] [--quiet-s 15] [--changes ...] [--json]

``--json`` prints only the JSON result on stdout. Exit 0 when every trial recorded its finding and p50 < 60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROD = "ml-prod-use1"
ROLLED = ("retail-assistant", "payments-disputes")
TARGET_P50_S = 60.0
TRIAL_TIMEOUT_S = 180.0
EXPECTED = {"kubectl_patch": "patch_lost_to_reconcile", "helm_upgrade": "format_flag_set",
            "operator_rerender": "patch_lost_to_reconcile"}


class WatchPump:
    """The trigger's ``run()`` on its own event loop in a thread; events land in a queue with their time."""

    def __init__(self, trigger: Any) -> None:
        self.trigger = trigger
        self.events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        with contextlib.suppress(asyncio.CancelledError):
            async for event in self.trigger.run():
                self.events.put((time.monotonic(), dict(event.payload)))

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.trigger.ready():
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the watch trigger did not start")
            time.sleep(0.05)

    def drain(self, quiet_s: float) -> int:
        """Swallow events until none came for ``quiet_s`` + 2 s (the bursts of a remediation)."""
        n = 0
        while True:
            try:
                self.events.get(timeout=quiet_s + 2)
                n += 1
            except queue.Empty:
                return n

    def stop(self) -> None:
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self.thread.join(timeout=30)


def fleet_text() -> str:
    """The bench's inventory: fleet.example.yaml with ml-prod-use1 only, its two ``ROLLED`` endpoints, and the two
    departures of the tests' fleet (tests/fleets/twin.yaml): ``l2_injection: patch`` (with the example's ``auto``,
    Kyverno re-injects the L2 mount on every render, so a hand edit the operator renders over is no drift at all)
    and 2 Curvine workers (the default, one per GPU node, is 16 pods to roll on every helm upgrade)."""
    import yaml

    doc = yaml.safe_load((ROOT / "fleet.example.yaml").read_text())
    doc["clusters"] = [c for c in doc["clusters"] if c["name"] == PROD]
    doc["clusters"][0]["l2_injection"] = "patch"
    doc["clusters"][0]["curvine"].setdefault("worker", {})["replicas"] = 2
    doc["endpoints"] = [e for e in doc["endpoints"] if e["cluster"] == PROD and e["name"] in ROLLED]
    return str(yaml.safe_dump(doc, sort_keys=False))


def _inventory() -> Any:
    import warnings

    from kvfleet.fleet.inventory import parse_inventory

    with warnings.catch_warnings():  # the 2 workers are deliberate (see fleet_text)
        warnings.simplefilter("ignore")
        return parse_inventory(fleet_text(), source="bench-fleet.yaml")


def _ctx(inv: Any, history: Any = None, run: str | None = None) -> Any:
    from kvfleet.history.keys import StepKey
    from kvfleet.stages.base import StageContext, Timeouts

    ctx = StageContext(inventory=inv, cluster=inv.cluster(PROD), aws_conn_id=None, history=history,
                       timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=120, pvc_s=60))
    if history is not None and run is not None:
        history.runs.start(run, dag_id="kvfleet_drift_watch", run_id=run, trigger="bench", triggered_by=None,
                          params={})
        ctx.step_key = StepKey(run, "check_cluster")
    return ctx


class Bench:
    def __init__(self, sandbox: Any, inv: Any, history: Any, quiet_s: float, say: Callable[[str], None]) -> None:
        self.sandbox, self.inv, self.history, self.quiet_s, self.say = sandbox, inv, history, quiet_s, say
        self.runs = iter(range(1, 10_000))

    def check(self, remediate: bool = False) -> Any:
        from kvfleet.stages import drift

        ctx = _ctx(self.inv, self.history, f"kvfleet_drift_watch/bench-{next(self.runs)}")
        try:
            return drift.check(ctx, remediate=remediate)
        finally:
            ctx.close()

    # ---- the changes made by hand ------------------------------------------------------------------------
    def kubectl_patch(self, n: int) -> None:
        ep = next(e for e in self.inv.endpoints if e.cluster == PROD and e.name == ROLLED[n % len(ROLLED)])
        body = {"spec": {"template": {"spec": {"containers": [
            {"name": ep.name, "env": [{"name": "HAND_EDIT", "value": f"trial-{n}"}]}]}}}}
        subprocess.run([str(ROOT / ".tools" / "bin" / "kubectl"), "--context", PROD, "-n", ep.namespace, "patch",
                        "deployment", ep.name, "--type", "strategic", "-p", json.dumps(body)],
                       check=True, capture_output=True, timeout=60,
                       env={**os.environ, "KUBECONFIG": str(self.sandbox.kubeconfig)})

    def helm_upgrade(self, n: int) -> None:
        from kvfleet.fleet import constants as C
        from kvfleet.stages import curvine

        ctx = _ctx(self.inv)  # no history: not a kvfleet action
        try:
            spec = ctx.cluster.curvine
            ctx.helm.run(*ctx.helm.upgrade_args(C.CURVINE_RELEASE, spec.chart, spec.namespace,
                                                repo=curvine.repo_url(ctx), version=spec.version,
                                                values={"cluster.formatMaster": True}),
                         what="hand-made helm upgrade")
        finally:
            ctx.close()

    def operator_rerender(self, n: int) -> None:
        ep = next(e for e in self.inv.endpoints if e.cluster == PROD and e.name == ROLLED[n % len(ROLLED)])
        self.sandbox.twin(PROD).services["operator"].rerender_now(ep.namespace, ep.name)

    # ---- one trial -----------------------------------------------------------------------------------------
    def trial(self, pump: WatchPump, kind: str, n: int) -> dict[str, Any]:
        expected = EXPECTED[kind]
        started = time.monotonic()
        getattr(self, kind)(n)
        events = checks = 0
        while time.monotonic() - started < TRIAL_TIMEOUT_S:
            try:
                _, payload = pump.events.get(timeout=max(0.1, TRIAL_TIMEOUT_S - (time.monotonic() - started)))
            except queue.Empty:
                break
            events += 1
            event_s = time.monotonic() - started
            if payload.get("cluster") != PROD:
                continue
            result = self.check()
            checks += 1
            kinds = sorted({f.kind for f in result.findings})
            if expected in kinds:
                return {"change": kind, "trial": n, "found": True, "latency_s": round(time.monotonic() - started, 2),
                        "event_s": round(event_s, 2), "events": events, "checks": checks, "kinds": kinds}
        return {"change": kind, "trial": n, "found": False, "latency_s": None, "events": events, "checks": checks}

    def restore(self, pump: WatchPump) -> None:
        """Remediate (kvfleet's own fix, with its waits) and let the watch's bursts of it pass; untimed."""
        for _ in range(3):
            result = self.check(remediate=True)
            if not result.findings:
                break
            time.sleep(1)
        pump.drain(self.quiet_s)


def _converge(inv: Any) -> None:
    from kvfleet.stages import addons, curvine, endpoints, tiered_storage

    ctx = _ctx(inv)
    try:
        for stage in (tiered_storage, addons, curvine):
            stage.reconcile(ctx)
        endpoints.reconcile_wave(ctx, list(inv.endpoints_of(PROD)), holder="bench/rollout")
    finally:
        ctx.close()


def _rbac_with_watch(target: Path) -> Path:
    """k8s/rbac plus the drift watch's ``watch`` grants (``kvfleet.fleet.watch_rules.RBAC_*_RULES``), until
    k8s/rbac carries them: kvfleet's identity is held to exactly that."""
    import yaml

    from kvfleet.fleet import watch_rules

    extra = {"kvfleet:cluster": watch_rules.RBAC_CLUSTER_RULES,
             "kvfleet:curvine-namespace": watch_rules.RBAC_CURVINE_NAMESPACE_RULES}
    target.mkdir(parents=True, exist_ok=True)
    for path in (ROOT / "k8s" / "rbac").iterdir():
        if path.suffix != ".yaml":
            shutil.copy(path, target / path.name)
            continue
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            if doc.get("kind") == "ClusterRole" and doc["metadata"]["name"] in extra:
                doc["rules"] += [dict(r) for r in extra[doc["metadata"]["name"]]]
        (target / path.name).write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return target


@contextlib.contextmanager
def _environment(state: Path) -> Iterator[Any]:
    from kvfleet_sandbox import runtime
    from kvfleet_sandbox.twin import SandboxSettings

    os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}{os.pathsep}{os.environ['PATH']}"
    os.environ.setdefault("KVFLEET_POLL_SECONDS", "0.05")
    os.environ["KVFLEET_STATE_DIR"] = str(state / "kvfleet")  # a fresh embedded PostgreSQL for the history
    for key in ("KVFLEET_HISTORY_OWNER_URL", "AIRFLOW_CONN_KVFLEET_HISTORY"):
        os.environ.pop(key, None)
    os.environ["KVFLEET_HISTORY_URL"] = "embedded"  # chosen explicitly: without a URL the history refuses
    runtime.RBAC_DIR = _rbac_with_watch(state / "rbac")
    sandbox = runtime.start_sandbox(_inventory(), state / "sandbox", SandboxSettings(time_scale=0.005))
    try:
        os.environ.update(sandbox.exports())
        os.environ.pop("AIRFLOW_CONN_AWS_DEFAULT", None)  # boto3 reads AWS_ENDPOINT_URL natively
        yield sandbox
    finally:
        sandbox.stop()


def _summary(trials: list[dict[str, Any]], quiet_s: float, wall_s: float) -> dict[str, Any]:
    found = [t["latency_s"] for t in trials if t["found"]]
    by_change = {}
    for kind in EXPECTED:
        xs = [t["latency_s"] for t in trials if t["change"] == kind and t["found"]]
        by_change[kind] = {"trials": sum(t["change"] == kind for t in trials), "found": len(xs),
                           "p50_s": round(statistics.median(xs), 2) if xs else None,
                           "max_s": max(xs) if xs else None}
    p50 = round(statistics.median(found), 2) if found else None
    return {"bench": "drift_latency", "cluster": PROD, "quiet_s": quiet_s, "target_p50_s": TARGET_P50_S,
            "p50_s": p50, "max_s": max(found) if found else None, "found": len(found), "trials": len(trials),
            "by_change": by_change, "runs": trials, "wall_s": round(wall_s, 1),
            "path": "KubeWatchTrigger.run() in-process + kvfleet.stages.drift.check; no triggerer, scheduler or "
                    "worker (--live adds them: the scheduler's asset-event-to-run delay and the tasks' start-up)",
            "ok": bool(found) and len(found) == len(trials) and p50 is not None and p50 < TARGET_P50_S}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments both measures take (this file's and ``drift_latency_live.py``'s)."""
    parser.add_argument("--trials", type=int, default=3, help="trials per kind of change (default 3)")
    parser.add_argument("--quiet-s", type=float, default=15.0, help="the watch's debounce window (default 15)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result on stdout")


def common_arguments_valid(args: argparse.Namespace) -> bool:
    """False, with the reason on stderr, when ``--trials`` or ``--quiet-s`` is out of range."""
    if args.trials < 1:
        print(f"--trials: {args.trials} is below 1; give 1 or more", file=sys.stderr)
        return False
    if args.quiet_s <= 0:
        print(f"--quiet-s: {args.quiet_s} must be above 0 (seconds of quiet before an event); e.g. 15",
              file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--live" in argv:  # the whole Airflow path: bench/drift_latency_live.py, with the other arguments
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import drift_latency_live

        return drift_latency_live.main([a for a in argv if a != "--live"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", action="store_true",
                        help="through the real local Airflow service (tools/up.sh): bench/drift_latency_live.py")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if not common_arguments_valid(args):
        return 2
    out = sys.stderr if args.json else sys.stdout
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    def say(msg: str) -> None:
        print(msg, file=out, flush=True)

    started = time.monotonic()
    state = Path(tempfile.mkdtemp(prefix="kvfleet-bench-latency-"))
    try:
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            summary = _run(state, args.trials, args.quiet_s, say, started)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _print(summary, say)
    return 0 if summary["ok"] else 1


def _run(state: Path, trials: int, quiet_s: float, say: Callable[[str], None], started: float) -> dict[str, Any]:
    from kvfleet.airflow.triggers.kube_watch import KubeWatchTrigger
    from kvfleet.history.repos import HistoryRepos

    with _environment(state) as sandbox:
        inv = _inventory()
        say("converging ml-prod-use1 (stages 1-3, two endpoints) ...")
        _converge(inv)
        bench = Bench(sandbox, inv, HistoryRepos.on(), quiet_s, say)
        bench.check()  # the baseline (a Curvine snapshot the loss check compares with)
        pump = WatchPump(KubeWatchTrigger(PROD, inv.cluster(PROD).region, aws_conn_id=None, quiet_s=quiet_s))
        pump.start()
        pump.drain(quiet_s)
        runs: list[dict[str, Any]] = []
        try:
            for n in range(trials):
                for kind in EXPECTED:
                    run = bench.trial(pump, kind, n)
                    say(f"  {kind} #{n}: " + (f"finding after {run['latency_s']:.1f}s (event {run['event_s']:.1f}s, "
                                              f"{run['checks']} check(s))" if run["found"] else "NO finding"))
                    runs.append(run)
                    bench.restore(pump)
        finally:
            pump.stop()
    return _summary(runs, quiet_s, time.monotonic() - started)


def _print(summary: dict[str, Any], say: Callable[[str], None]) -> None:
    say(f"\ndrift latency through the watch (quiet window {summary['quiet_s']:.0f}s), {summary['found']}/"
        f"{summary['trials']} findings recorded")
    say(f"{'change':<20}{'found':>8}{'p50 s':>10}{'max s':>10}")
    for kind, row in summary["by_change"].items():
        say(f"{kind:<20}{row['found']:>4}/{row['trials']:<3}{row['p50_s'] or '-':>10}{row['max_s'] or '-':>10}")
    say(f"{'all':<20}{summary['found']:>4}/{summary['trials']:<3}{summary['p50_s'] or '-':>10}"
        f"{summary['max_s'] or '-':>10}   target p50 < {summary['target_p50_s']:.0f}s; the 10-minute schedule: "
        "up to 600s")
    say(f"path: {summary['path']}")


if __name__ == "__main__":
    sys.exit(main())
