"""Benchmark: worker slots held while a rollout waits, and what the waits cost the triggerer, as the fleet grows.

Part 1 — a gated, baked rollout with contended leases, at N twin clusters (``--sizes``, default 1 2):

1. an embedded PostgreSQL (Airflow metadata + kvfleet history) and the sandbox fleet in its own process
   (``python -m kvfleet_sandbox up``), N clusters × 2 endpoints, each cluster with the operator configuration that
   preflight checks (the twin seeds the execution role and the TLS bucket);
2. before the run, another run (``kvfleet_curvine_upgrade/bench-contender``) holds every cluster's lease;
3. ``kvfleet_rollout`` runs through ``dag.test()`` with ``gate=verify`` and a bake (``--bake-s``) after every wave;
   a watcher frees a cluster's lease ``--hold-s`` after that cluster's ``cluster.stages`` started waiting;
4. every state a task instance takes is logged by a PostgreSQL trigger on Airflow's ``task_instance`` table
   (database clock), and from it:
   - ``running_s``: task-instance seconds in ``running`` (a worker slot in use);
   - ``waits``: each deferral — its trigger class, and the window the wait lasted, as the outside world defines
     it: a lease wait from the moment the task found the cluster held until the bench freed it; a bake from the
     moment the wave finished until the bake's end;
   - ``slot_seconds_held_while_waiting``: the running seconds of the waiting task instances inside those windows
     (target 0: no worker slot is held while waiting);
   - ``slot_seconds_blocking_waits_would_hold``: the windows' total — what the former in-worker sleeps held.
   ``dag.test()`` runs tasks one at a time and a trigger in line (the task instance shows ``queued`` while its
   trigger runs); the windows and the running time are the same as under a scheduler and a triggerer.

Part 2 — the triggerer's cost per waiting cluster: K ``LeaseFreeTrigger``s (leases held by a live holder) and K
``DateTimeTrigger``s run together on one asyncio loop, as the triggerer runs them, for ``--trigger-seconds``;
reported: CPU seconds per trigger-hour and history-database polls per second.

Part 3 — scaling curves (``--curves CxE ...``: C twin clusters × E endpoints per cluster, fleets generated from
``tests/fleets/twin.yaml``'s shape): a rollout (``gate=verify``, no bake, ``--wave-size``) and the hourly
verification DAG, each reported with its wall time, Kubernetes and AWS calls per endpoint, history rows per
endpoint, XCom bytes per task and slot-seconds held while waiting (bench/fleet_curves.py says how).

    python bench/fleet_scale.py [--json] [--sizes 1 2 4] [--bake-s 2] [--hold-s 5] [--triggers 10 100 1000]
                                [--curves 1x10 2x10] [--wave-size 10]

``--sizes``, ``--triggers`` or ``--curves`` given with no value skips that part (``--sizes --triggers --curves
1x10``: part 3 only). ``--json`` prints only the JSON summary on stdout (logs on stderr). Exit 0 when every run
succeeded and held 0 slot-seconds while waiting, 1 otherwise, 2 on bad arguments. What is extrapolated from these
figures is in bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The task instances' state log (a PostgreSQL trigger on task_instance), shared with tests/integration/dags/
# test_deferral.py.
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_curves  # noqa: E402
from ti_state_log import TiStateLog  # noqa: E402

CONTENDER = "kvfleet_curvine_upgrade/bench-contender"
DAG_ID = "kvfleet_rollout"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fleet_yaml(n: int) -> str:
    """N clusters, one LOB, 2 endpoints each (a canary wave and a second wave: two bakes per cluster)."""
    lines = ["settings: {wave_size: 1}", "lobs: [{name: alpha}]", "clusters:"]
    for i in range(n):
        name = f"c{i}"
        lines += [f"  - name: {name}", "    region: us-east-1",
                  "    gpu_nodes: {count: 4, instance_type: ml.g5.4xlarge}", "    l2_injection: patch",
                  "    curvine: {worker: {replicas: 2, size: 100Gi}}", "    addons:",
                  "      amazon-sagemaker-hyperpod-inference:", "        configuration:",
                  "          executionRoleArn: arn:aws:iam::123456789012:role/hyperpod-inference-exec",
                  f"          tlsCertificateS3Bucket: hyperpod-tls-{name}"]
    lines.append("endpoints:")
    for i in range(n):
        for ep in ("chat", "docs"):
            lines.append(f"  - {{name: alpha-{ep}, namespace: alpha, lob: alpha, cluster: c{i}, model: qwen2-7b, "
                         "instance_type: ml.g5.4xlarge}")
    return "\n".join(lines) + "\n"


def _ts(value: datetime) -> float:
    return value.timestamp()


def analyse(rows: list[dict[str, Any]], released: dict[str, float], cluster_of: dict[int, str],
            bake_s: float) -> dict[str, Any]:
    """Running intervals, deferrals and the outside-defined wait windows, per task instance (module docstring)."""
    by_ti: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        by_ti.setdefault((r["task_id"], r["map_index"]), []).append(r)
    running_s = held_s = would_hold_s = deferred_s = 0.0
    waits: list[dict[str, Any]] = []
    for (task_id, map_index), seq in by_ti.items():
        running: list[tuple[float, float]] = []
        for a, b in itertools.pairwise(seq):
            if a["state"] == "running":
                running.append((_ts(a["at"]), _ts(b["at"])))
        running_s += sum(e - s for s, e in running)
        for i, r in enumerate(seq):
            if r["state"] != "deferred":
                continue
            start = _ts(r["at"])
            resumed = next((_ts(x["at"]) for x in seq[i + 1:] if x["state"] == "running"), start)
            deferred_s += resumed - start
            kind = str(r.get("classpath") or "").rsplit(".", 1)[-1]
            if kind == "LeaseFreeTrigger":
                end = released.get(cluster_of.get(map_index, ""), resumed)
            elif kind == "DateTimeTrigger":
                end = start + bake_s
            else:
                end = resumed
            held = sum(max(0.0, min(e, end) - max(s, start)) for s, e in running)
            held_s += held
            would_hold_s += max(0.0, end - start)
            waits.append({"task": task_id, "map_index": map_index, "trigger": kind,
                          "window_s": round(end - start, 3), "held_s": round(held, 3)})
    return {"task_instances": len(by_ti), "running_s": round(running_s, 3), "deferred_s": round(deferred_s, 3),
            "deferrals": len(waits), "waits": waits, "slot_seconds_held_while_waiting": round(held_s, 3),
            "slot_seconds_blocking_waits_would_hold": round(would_hold_s, 3)}


# ---- part 1: a rollout at N clusters ----------------------------------------------------------------------------
def sandbox(fleet: Path, state: Path, timeout: float = 180) -> tuple[dict[str, str], Any]:
    subprocess.run([sys.executable, "-m", "kvfleet_sandbox", "up", "--fleet", str(fleet), "--state-dir", str(state),
                    "--time-scale", "0.005", "--timeout", f"{timeout:g}"], check=True, timeout=timeout + 60,
                   stdout=sys.stderr, stderr=sys.stderr)
    env: dict[str, str] = {}
    for line in (state / "env").read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = shlex.split(value)[0] if value else ""

    def down() -> None:
        subprocess.run([sys.executable, "-m", "kvfleet_sandbox", "down", "--state-dir", str(state)], timeout=120,
                       stdout=sys.stderr, stderr=sys.stderr, check=False)

    return env, down


def rollout_at(n: int, work: Path, dagbag: Any, states: TiStateLog, bake_s: float,
               hold_s: float) -> dict[str, Any]:
    from kvfleet.fleet.inventory import load_inventory
    from kvfleet.fleet.plan import make_plan
    from kvfleet.history.db import get_engine
    from kvfleet.history.leases import Leases

    fleet = work / f"fleet-{n}.yaml"
    fleet.write_text(fleet_yaml(n))
    env, down = sandbox(fleet, work / f"sandbox-{n}")
    try:
        os.environ.update(env)
        os.environ["KVFLEET_POLL_SECONDS"] = "0.1"
        clusters = [c["cluster"] for c in make_plan(load_inventory(str(fleet)), wave_size=1).as_dict()["clusters"]]
        leases = Leases(get_engine())
        for c in clusters:
            leases.try_take(c, CONTENDER, "curvine upgrade", 3600)
        released: dict[str, float] = {}
        stop = threading.Event()
        run_ids: list[str] = []

        waiting_since: dict[str, float] = {}

        def free_each_lease_once_its_cluster_waits() -> None:
            while not stop.wait(0.1):
                for r in states.rows():
                    if r["task_id"] == "cluster.stages" and r["state"] == "deferred":
                        c = clusters[r["map_index"]]
                        waiting_since.setdefault(c, time.time())
                        if c not in released and time.time() - waiting_since[c] >= hold_s:
                            leases.release(c, CONTENDER)
                            released[c] = time.time()
                if len(released) == len(clusters):
                    return

        watcher = threading.Thread(target=free_each_lease_once_its_cluster_waits, daemon=True)
        watcher.start()
        conf = {"fleet": str(fleet), "lobs": [], "clusters": [], "endpoints": [], "dry_run": False, "wave_size": 1,
                "max_parallel_clusters": 4, "canary": True, "bake_minutes": bake_s / 60, "gate": "verify",
                "approval": "none", "lock_wait_minutes": 60}
        started = time.monotonic()
        try:
            dr = dagbag.get_dag(DAG_ID).test(run_conf=conf)
        finally:
            stop.set()
            watcher.join(timeout=10)
        wall = time.monotonic() - started
        run_ids.append(dr.run_id)
        result = analyse(states.rows(run_id=dr.run_id), released, dict(enumerate(clusters)), bake_s)
        for c in clusters:  # a cluster whose stages never waited still has the contender's lease
            leases.release(c, CONTENDER)
        return {"clusters": n, "endpoints": 2 * n, "state": str(dr.state), "wall_s": round(wall, 1),
                "leases_contended": len(clusters), "leases_freed_after_wait": len(released), **result}
    finally:
        down()


# ---- part 2: the triggerer's cost per waiting trigger -----------------------------------------------------------
async def _triggers_together(triggers: list[Any], seconds: float) -> int:
    async def first(trigger: Any) -> Any:
        return await anext(trigger.run())

    tasks = [asyncio.create_task(first(t)) for t in triggers]
    done, pending = await asyncio.wait(tasks, timeout=seconds)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return len(done)


def triggerer_cost(k: int, seconds: float, poll_s: float) -> dict[str, Any]:
    from airflow.providers.standard.triggers.temporal import DateTimeTrigger

    from kvfleet.airflow.triggers.lease import LeaseFreeTrigger
    from kvfleet.history.db import get_engine
    from kvfleet.history.leases import Leases

    leases = Leases(get_engine())
    names = [f"bench-trigger-{i}" for i in range(k)]
    for name in names:
        leases.try_take(name, CONTENDER, "bench", 3600)
    out: dict[str, Any] = {"triggers": k, "seconds": seconds, "lease_poll_s": poll_s}
    try:
        lease_triggers = [LeaseFreeTrigger(name, "kvfleet_rollout/bench", poll_s=poll_s) for name in names]
        polls = {"n": 0}
        for t in lease_triggers:
            check = t._check

            def counted(check: Any = check) -> Any:
                polls["n"] += 1
                return check()

            t._check = counted  # type: ignore[method-assign]
        cpu, wall = time.process_time(), time.monotonic()
        fired = asyncio.run(_triggers_together(lease_triggers, seconds))
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        out["lease"] = {"fired": fired, "cpu_s": round(cpu, 3), "polls": polls["n"],
                        "polls_per_s": round(polls["n"] / wall, 1),
                        "cpu_s_per_trigger_hour": round(cpu / (k * wall) * 3600, 2)}
        moment = datetime.now(UTC) + timedelta(days=1)
        cpu, wall = time.process_time(), time.monotonic()
        asyncio.run(_triggers_together([DateTimeTrigger(moment=moment) for _ in range(k)], seconds))
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        out["bake"] = {"cpu_s": round(cpu, 3), "cpu_s_per_trigger_hour": round(cpu / (k * wall) * 3600, 2)}
    finally:
        for name in names:
            leases.release(name, CONTENDER)
    return out


# ---- main -------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON summary on stdout")
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 2],
                        help="part 1: twin clusters per contended rollout (1-8); none: skip part 1")
    parser.add_argument("--bake-s", type=float, default=2.0, help="bake after each wave, seconds (0.5-600)")
    parser.add_argument("--hold-s", type=float, default=5.0,
                        help="the other run keeps a cluster's lease this long after the rollout starts waiting (0-600)")
    parser.add_argument("--triggers", type=int, nargs="*", default=[10, 100, 1000],
                        help="part 2: concurrent triggers for the triggerer's cost (1-5000); none: skip part 2")
    parser.add_argument("--trigger-seconds", type=float, default=10.0, help="how long they run (1-300)")
    parser.add_argument("--curves", nargs="*", default=["1x10"], metavar="CxE",
                        help="part 3: C twin clusters x E endpoints per cluster (C 1-10, E 1-200), e.g. 1x10 2x10; "
                             "none: skip part 3")
    parser.add_argument("--wave-size", type=int, default=10,
                        help="part 3: the rollout's endpoints per cluster per wave after the canary (1-500)")
    args = parser.parse_args(argv)
    bad = [f"--sizes: {n} is not within 1-8" for n in args.sizes if not 1 <= n <= 8]
    bad += [] if 0.5 <= args.bake_s <= 600 else [f"--bake-s: {args.bake_s} is not within 0.5-600"]
    bad += [] if 0 <= args.hold_s <= 600 else [f"--hold-s: {args.hold_s} is not within 0-600"]
    bad += [f"--triggers: {k} is not within 1-5000" for k in args.triggers if not 1 <= k <= 5000]
    bad += [] if 1 <= args.trigger_seconds <= 300 else [f"--trigger-seconds: {args.trigger_seconds} not within 1-300"]
    bad += [] if 1 <= args.wave_size <= 500 else [f"--wave-size: {args.wave_size} is not within 1-500"]
    curves: list[tuple[int, int]] = []
    for size in args.curves:
        try:
            curves.append(fleet_curves.parse_size(size))
        except ValueError as exc:
            bad.append(str(exc))
    if bad:
        print("fleet_scale.py: " + "; ".join(bad), file=sys.stderr)
        return 2
    args.curve_sizes = curves
    # Airflow's task logs go to stdout: while the runs last, file descriptor 1 is stderr, so --json stays JSON.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with tempfile.TemporaryDirectory(prefix="kvfleet-fleet-scale-") as tmp:
            summary = run(Path(tmp), args)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    runs = summary["rollouts"] + [c[p] for c in summary["curves"] for p in ("rollout", "verification") if p in c]
    ok = all(s["state"] == "success" and s["slot_seconds_held_while_waiting"] == 0 for s in runs)
    summary["acceptance"] = {"zero_slot_seconds_while_waiting": ok}
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print_table(summary)
    return 0 if ok else 1


def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from kvfleet.history.db import EmbeddedPostgres
    from kvfleet_local.env import airflow_env

    os.environ.setdefault("XDG_RUNTIME_DIR", str(work / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ["KVFLEET_STATE_DIR"] = str(work / "state")
    os.environ["KVFLEET_FLEET_PATHS"] = str(work)  # the generated fleet files a run's `fleet` Param names
    pg = EmbeddedPostgres(work / "state").start()
    try:
        os.environ.update(airflow_env(work / "airflow", pg))
        (work / "airflow" / "plugins").mkdir(parents=True, exist_ok=True)
        os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}{os.pathsep}{os.environ['PATH']}"
        from airflow.dag_processing.dagbag import DagBag
        from airflow.utils import db

        log("migrating Airflow's metadata database")
        db.initdb()
        dagbag = DagBag(dag_folder=str(ROOT / "dags"))
        rollouts = []
        with TiStateLog(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], DAG_ID,
                        prefix="kvfleet_bench_ti_states") as states:
            for n in args.sizes:
                log(f"=== a gated rollout, bake {args.bake_s:g}s, leases contended, on {n} twin cluster(s)")
                rollouts.append(rollout_at(n, work, dagbag, states, args.bake_s, args.hold_s))
                log(json.dumps({k: v for k, v in rollouts[-1].items() if k != "waits"}))
        curves = []
        if args.curve_sizes:
            with contextlib.ExitStack() as stack:
                logs = {d: stack.enter_context(TiStateLog(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], d,
                                                          prefix="kvfleet_bench_curve_states"))
                        for d in (fleet_curves.ROLLOUT, fleet_curves.VERIFICATION)}
                for c, e in args.curve_sizes:
                    log(f"=== curves: {c} twin cluster(s) x {e} endpoints, rollout then hourly verification")
                    curves.append(fleet_curves.curve_at(c, e, work=work, dagbag=dagbag, states=logs,
                                                        wave_size=args.wave_size, sandbox=sandbox, analyse=analyse,
                                                        log=log))
        trig = []
        for k in args.triggers:
            log(f"=== {k} lease triggers and {k} bake triggers on one loop for {args.trigger_seconds:g}s")
            trig.append(triggerer_cost(k, args.trigger_seconds, poll_s=10.0))
            log(json.dumps(trig[-1]))
        return {"rollouts": rollouts, "triggerer": trig, "curves": curves, "bake_s": args.bake_s,
                "hold_s": args.hold_s, "commit": _commit()}
    finally:
        from kvfleet.history.db import dispose_engines

        dispose_engines()
        if "airflow.settings" in sys.modules:  # its session's connection may be gone (TiStateLog.__exit__)
            with contextlib.suppress(Exception):
                sys.modules["airflow.settings"].dispose_orm(do_log=False)
        pg.stop()


def _commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "plugins", "dags", "sandbox"],
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
        changed = sorted(line[3:] for line in dirty if line.strip())
        return head + (f" + uncommitted {', '.join(changed)}" if changed else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def print_table(summary: dict[str, Any]) -> None:
    print(f"{'clusters':>8}{'endpoints':>10}{'state':>9}{'wall s':>8}{'TIs':>5}{'deferrals':>10}{'running s':>10}"
          f"{'held while waiting':>20}{'blocking would hold':>21}")
    for s in summary["rollouts"]:
        print(f"{s['clusters']:>8}{s['endpoints']:>10}{s['state']:>9}{s['wall_s']:>8}{s['task_instances']:>5}"
              f"{s['deferrals']:>10}{s['running_s']:>10}{s['slot_seconds_held_while_waiting']:>20}"
              f"{s['slot_seconds_blocking_waits_would_hold']:>21}")
    print(f"\n{'triggers':>8}{'lease polls/s':>14}{'lease CPU s/trigger-h':>22}{'bake CPU s/trigger-h':>21}")
    for t in summary["triggerer"]:
        print(f"{t['triggers']:>8}{t['lease']['polls_per_s']:>14}{t['lease']['cpu_s_per_trigger_hour']:>22}"
              f"{t['bake']['cpu_s_per_trigger_hour']:>21}")
    if summary["curves"]:
        fleet_curves.print_curves(summary["curves"])
    print(f"\nacceptance: 0 slot-seconds held while waiting: {summary['acceptance']}")


if __name__ == "__main__":
    sys.exit(main())
