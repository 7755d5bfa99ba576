"""Benchmark: availability of every endpoint while the L2 overlay rolls out, once per update strategy.

For each strategy (``auto``, ``rolling``, ``surge``, ``scale-to-zero``) it:

1. copies the inventory (``fleet.example.yaml`` by default) with ``update_strategy: <strategy>`` on every cluster;
2. starts the sandbox on it in its own process (``python -m kvfleet_sandbox up``, as the DAG tests do), so the
   simulated fleet does not share this interpreter's GIL with the load;
3. converges stages 1–3 on every cluster (tiered storage, add-ons, Curvine) and creates every endpoint's
   InferenceEndpointConfig without the L2 overlay, then waits until the operator reports DeploymentComplete;
4. starts ``bench/loadgen.py``'s steady stream of short completions to every endpoint through the API server's
   Service proxy, then runs stage 4's waves (the canary endpoint, then ``wave_size`` at a time, clusters in
   parallel, as the rollout DAG maps them) with ``stages.endpoints.reconcile_wave``: the patch sequence on
   ``l2_injection: patch`` clusters, the Kyverno policy and an operator re-render on ``kyverno`` ones;
5. keeps the load on for a cool-down, then reports per endpoint the requests sent, failed, the longest gap
   without a successful response and the strategy stage 4 chose.

    python bench/rollout_availability.py [--json] [--strategy auto ...] [--cluster NAME ...] [--rate 4]

``--json`` prints only a JSON summary on stdout (logs go to stderr). Exit status 0 when, under ``auto``, every
endpoint with at least 2 replicas on a patch-mode cluster failed no request (the acceptance); 1 otherwise;
2 on bad arguments. The strategy only changes what happens on ``l2_injection: patch`` clusters; on ``kyverno``
clusters the operator's own re-render rolls the pods, whatever the strategy.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from loadgen import LoadGenerator, Target  # noqa: E402

STRATEGIES = ("auto", "rolling", "surge", "scale-to-zero")
HOLDER = "bench/rollout_availability"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the sandbox, in its own process -------------------------------------------------------------------------


class SandboxProcess:
    """``python -m kvfleet_sandbox up`` / ``down`` on a state directory; ``env`` holds what it exports."""

    def __init__(self, fleet: Path, state: Path, time_scale: float) -> None:
        self.fleet, self.state, self.time_scale = fleet, state, time_scale
        self.env: dict[str, str] = {}

    def up(self) -> SandboxProcess:
        subprocess.run([sys.executable, "-m", "kvfleet_sandbox", "up", "--fleet", str(self.fleet), "--state-dir",
                        str(self.state), "--time-scale", str(self.time_scale), "--timeout", "120"], check=True,
                       timeout=180, stdout=sys.stderr, stderr=sys.stderr)
        for line in (self.state / "env").read_text().splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export "):].partition("=")
                self.env[key] = shlex.split(value)[0] if value else ""
        return self

    def down(self) -> None:
        subprocess.run([sys.executable, "-m", "kvfleet_sandbox", "down", "--state-dir", str(self.state)],
                       timeout=120, stdout=sys.stderr, stderr=sys.stderr, check=False)

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"


def fleet_with_strategy(source: Path, strategy: str, dest: Path) -> Path:
    """A copy of the inventory with ``update_strategy`` on every cluster (endpoints keep none of their own)."""
    doc = yaml.safe_load(source.read_text())
    for cluster in doc.get("clusters") or []:
        cluster["update_strategy"] = strategy
    for ep in doc.get("endpoints") or []:
        ep.pop("update_strategy", None)
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


# --- stages, as the rollout DAG runs them --------------------------------------------------------------------


def _ctx(inv: Any, cluster: str) -> Any:
    from kvfleet.stages.base import StageContext, Timeouts

    return StageContext(inventory=inv, cluster=inv.cluster(cluster), aws_conn_id=None,
                        progress=lambda m: log(f"[{cluster}] {m}"),
                        timeouts=Timeouts(cluster_update_s=300, addon_s=300, pods_s=300, pvc_s=120))


def converge(inv: Any, cluster: str) -> None:
    """Stages 1–3, retried like Airflow would retry the task."""
    from kvfleet.stages import addons, curvine, tiered_storage

    for attempt in range(3):
        ctx = _ctx(inv, cluster)
        try:
            for stage in (tiered_storage, addons, curvine):
                stage.reconcile(ctx)
            return
        except Exception as exc:
            if attempt == 2:
                raise
            log(f"{cluster}: converge attempt {attempt + 1} failed ({type(exc).__name__}: {exc}); retrying")
        finally:
            ctx.close()


def serve_without_overlay(inv: Any, cluster: str) -> None:
    """Every endpoint's CR, Deployments complete, no L2 overlay yet: the fleet as it serves before the rollout."""
    from kvfleet.stages import endpoints

    ctx = _ctx(inv, cluster)
    try:
        eps = list(inv.endpoints_of(cluster))
        for ep in eps:
            endpoints.apply_iec(ctx, ep)
        endpoints.wait_complete(ctx, eps)
    finally:
        ctx.close()


def waves(inv: Any, cluster: str) -> list[list[Any]]:
    """The canary endpoint, then ``wave_size`` at a time (the DAG's plan)."""
    eps = list(inv.endpoints_of(cluster))
    size = max(1, int(inv.settings.wave_size))
    return [eps[:1]] + [eps[i:i + size] for i in range(1, len(eps), size)] if eps else []


def roll_out(inv: Any, cluster: str, strategy: str) -> dict[str, dict[str, Any]]:
    """Stage 4's waves on one cluster; per endpoint key: outcome and the strategy chosen."""
    from kvfleet.stages import endpoints

    chosen: dict[str, dict[str, Any]] = {}
    for i, wave in enumerate(waves(inv, cluster)):
        ctx = _ctx(inv, cluster)
        try:
            for outcome in endpoints.reconcile_wave(ctx, wave, holder=f"{HOLDER}/{strategy}/{cluster}/wave-{i}"):
                detail = dict(outcome.detail or {})
                chosen[str(outcome.endpoint)] = {"outcome": str(outcome.outcome),
                                                 "update_strategy": detail.get("update_strategy"),
                                                 "overlay": detail.get("overlay")}
        finally:
            ctx.close()
    return chosen


# --- one strategy ------------------------------------------------------------------------------------------


def run_strategy(source: Path, strategy: str, clusters: list[str] | None, *, rate: float, time_scale: float,
                 cooldown_s: float, work: Path) -> dict[str, Any]:
    from kvfleet.fleet.inventory import load_inventory

    fleet = fleet_with_strategy(source, strategy, work / f"fleet-{strategy}.yaml")
    inv = load_inventory(fleet)
    names = clusters or [c.name for c in inv.clusters]
    sandbox = SandboxProcess(fleet, work / f"sandbox-{strategy}", time_scale)
    log(f"=== {strategy}: sandbox up ({', '.join(names)})")
    sandbox.up()
    saved = dict(os.environ)
    try:
        os.environ.update(sandbox.env)
        os.environ.pop("AIRFLOW_CONN_AWS_DEFAULT", None)
        os.environ.setdefault("KVFLEET_POLL_SECONDS", "0.1")
        os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}{os.pathsep}{os.environ['PATH']}"
        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(lambda c: converge(inv, c), names))
            list(pool.map(lambda c: serve_without_overlay(inv, c), names))
        targets = [Target(ep.cluster, ep.namespace, ep.name) for ep in inv.endpoints if ep.cluster in names]
        gen = LoadGenerator(sandbox.kubeconfig, targets, rate=rate)
        log(f"=== {strategy}: load on {len(targets)} endpoints at {rate:g} req/s each; rolling out")
        gen.start()
        time.sleep(cooldown_s)  # a baseline before the first change
        started = time.monotonic()
        chosen: dict[str, dict[str, Any]] = {}
        errors: dict[str, str] = {}
        lock = threading.Lock()

        def one(cluster: str) -> None:
            try:
                result = roll_out(inv, cluster, strategy)
                with lock:
                    chosen.update({f"{cluster}:{k}": v for k, v in result.items()})
            except Exception as exc:  # reported, and the load keeps measuring the other clusters
                with lock:
                    errors[cluster] = f"{type(exc).__name__}: {exc}"[:500]
                log(f"[{cluster}] rollout failed: {errors[cluster]}")

        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(one, names))
        rollout_s = time.monotonic() - started
        time.sleep(cooldown_s)
        stats = gen.stop()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        sandbox.down()
    rows = []
    for ep in inv.endpoints:
        if ep.cluster not in names:
            continue
        target = Target(ep.cluster, ep.namespace, ep.name)
        row = stats[target.ref].summary()
        info = chosen.get(f"{ep.cluster}:{ep.key}", {})
        row.update(replicas=ep.replicas, l2_injection=inv.cluster(ep.cluster).l2_injection,
                   update_strategy=info.get("update_strategy"), outcome=info.get("outcome"))
        rows.append(row)
    return {"strategy": strategy, "rollout_s": round(rollout_s, 2), "rollout_errors": errors, "endpoints": rows}


# --- report ---------------------------------------------------------------------------------------------------


def acceptance(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Under auto, 0 failed requests for every endpoint with >= 2 replicas (patch-mode clusters)."""
    auto = next((r for r in results if r["strategy"] == "auto"), None)
    if auto is None:
        return {"auto_zero_failures": None}
    offenders = [r["endpoint"] for r in auto["endpoints"]
                 if r["replicas"] >= 2 and r["l2_injection"] == "patch" and r["failed"]]
    return {"auto_zero_failures": not offenders and not auto["rollout_errors"], "auto_offenders": offenders}


def print_table(results: list[dict[str, Any]]) -> None:
    for res in results:
        print(f"\n{res['strategy']}: rollout {res['rollout_s']:.1f}s"
              + (f", errors: {res['rollout_errors']}" if res["rollout_errors"] else ""))
        print(f"  {'endpoint':46} {'mode':8} {'chosen':14} {'sent':>6} {'failed':>6} {'longest gap s':>14} "
              f"{'max latency s':>14}")
        for r in res["endpoints"]:
            chosen = (r["update_strategy"] or {}).get("strategy", "-") if isinstance(r["update_strategy"], dict) \
                else (r["update_strategy"] or "-")
            print(f"  {r['endpoint']:46} {r['l2_injection']:8} {chosen:14} "
                  f"{r['sent']:6d} {r['failed']:6d} {r['longest_gap_s']:14.2f} {r['latency_max_s'] or 0:14.2f}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print only a JSON summary on stdout")
    ap.add_argument("--fleet", default=str(ROOT / "fleet.example.yaml"))
    ap.add_argument("--strategy", action="append", choices=STRATEGIES, help="repeatable; default: all four")
    ap.add_argument("--cluster", action="append", help="only these clusters (repeatable; default: all)")
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second per endpoint (default 4)")
    ap.add_argument("--time-scale", type=float, default=0.05,
                    help="sandbox real seconds per model second (default 0.05: a pod starts in 1.5 s)")
    ap.add_argument("--cooldown", type=float, default=3.0, help="seconds of load before and after the rollout")
    args = ap.parse_args(argv)
    for name in ("rate", "time_scale", "cooldown"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if not Path(args.fleet).is_file():
        ap.error(f"--fleet {args.fleet}: no such file")
    return args


def _stdout_for_json_only() -> Any:
    """Everything written to fd 1 from here on (Airflow's and boto's loggers included, whatever stream they
    captured) goes to stderr; the returned file is the real stdout, for the JSON summary alone."""
    sys.stdout.flush()
    real = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return real


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    out = _stdout_for_json_only() if args.json else sys.stdout
    work = Path(tempfile.mkdtemp(prefix="kvfleet-bench-availability-"))
    results = []
    try:
        for strategy in args.strategy or STRATEGIES:
            results.append(run_strategy(Path(args.fleet), strategy, args.cluster, rate=args.rate,
                                        time_scale=args.time_scale, cooldown_s=args.cooldown, work=work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    verdict = acceptance(results)
    from kvfleet_sandbox.twin import SandboxSettings

    pod_start_s = SandboxSettings().pod_startup_s * args.time_scale  # what a scale-to-zero gap is compared with
    if args.json:
        print(json.dumps({"rate_per_endpoint": args.rate, "time_scale": args.time_scale,
                          "pod_start_s": pod_start_s, "results": results, "acceptance": verdict}),
              file=out, flush=True)
    else:
        print_table(results)
        print(f"\npod start time (scheduled to Ready) in this sandbox: {pod_start_s:.2f}s")
        print(f"\nacceptance (auto: 0 failed requests on every >=2-replica endpoint of a patch cluster): {verdict}")
    return 0 if verdict.get("auto_zero_failures") in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
