"""`python -m kvfleet_local.demo` or `kvfleet-demo` (what `make demo` runs): the main job, end to end, on one machine.

1. start the embedded PostgreSQL (kvfleet history + Airflow metadata) and the sandbox fleet;
2. run `airflow dags test kvfleet_rollout` against the example inventory, exactly as a platform team would
   trigger it, with connections pointing at the sandbox;
3. print the per-LOB summary, each cluster's Curvine workers and capacity, and `kvfleet audit runs`;
4. stop everything it started.

Not part of the kvfleet wheel: it lives in the twin's distribution (kvfleet-sandbox), beside the twin it drives.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from kvfleet.history.db import EmbeddedPostgres
from kvfleet.paths import state_dir
from kvfleet_local.env import airflow_env


def _step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def _run(cmd: list[str], env: dict[str, str], *, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=quiet)
    if proc.returncode != 0:
        if quiet:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"demo: {' '.join(cmd[:4])} failed (exit {proc.returncode})")
    if quiet:
        print(f"    done in {time.monotonic() - started:.1f}s")
    return proc


def _read_env_file(path: Path) -> dict[str, str]:
    """The ``export K=V`` lines the sandbox writes to its ``env`` file (``source``-able, shell-quoted)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = shlex.split(line[len("export "):])[0].partition("=")
            out[key] = value
    return out


def _sandbox_env(stack: ExitStack, fleet: Path, root: Path, keep: bool) -> dict[str, str]:
    """Start the sandbox as its own process (`kvfleet sandbox up`), as a user would, and read what it exports.
    kvfleet never imports the sandbox: it reaches it through the env file only, and stops it with `down`."""
    state = root / "sandbox"
    sandbox_cli = [sys.executable, "-m", "kvfleet_sandbox.cli"]
    env = dict(os.environ)
    _run([*sandbox_cli, "up", "--fleet", str(fleet), "--state-dir", str(state), "--timeout", "120"], env)
    if keep:
        print(f"    left running: stop it with `kvfleet sandbox down --state-dir {state}`")
    else:
        stack.callback(_run, [*sandbox_cli, "down", "--state-dir", str(state)], env)
    # Waits poll faster than against real AWS: the sandbox runs its control plane on a scaled clock.
    return {**_read_env_file(state / "env"), "KVFLEET_POLL_SECONDS": "0.2"}


def _run_with_gate_watch(cmd: list[str], env: dict[str, str], log_path: Path) -> None:
    """Run the DAG test, showing progress; nobody sits at this terminal to answer a human gate, so one that
    waits longer than a minute gets its safe default (Abort), said out loud."""
    started = time.monotonic()
    first_seen: dict[tuple[str, int], float] = {}
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        last = ""
        while proc.poll() is None:
            time.sleep(2)
            done = [line for line in log_path.read_text().splitlines() if "[DAG TEST] end task" in line]
            status = f"    {len(done)} tasks done, {time.monotonic() - started:.0f}s"
            if done and done[-1] != last:
                last = done[-1]
                task = last.split("task_id=", 1)[-1].split()[0:2]
                print(f"{status} (last: {' '.join(task)})", flush=True)
            _answer_stale_gates(first_seen)
    if proc.returncode != 0:
        sys.stderr.write("\n".join(log_path.read_text().splitlines()[-60:]) + "\n")
        raise SystemExit(f"demo: the rollout failed (exit {proc.returncode}); full log: {log_path}")
    print(f"    rollout finished in {time.monotonic() - started:.0f}s; full log: {log_path}")


def _answer_stale_gates(first_seen: dict[tuple[str, int], float]) -> None:
    try:
        from kvfleet.airflow import hitl

        hitl.resume_stranded()  # a gate answered but left parked by dag.test (kvfleet.airflow.hitl.resume_stranded)
        for gate in hitl.pending():
            key = (gate.task_id, gate.map_index)
            if time.monotonic() - first_seen.setdefault(key, time.monotonic()) > 60:
                print(f"    gate {gate.task_id}[{gate.map_index}] waited 60s for a human: answering Abort "
                      f"(answer yourself with `kvfleet gate respond`): {gate.subject}", flush=True)
                hitl.respond(gate, "Abort" if "Abort" in gate.options else "Reject", "kvfleet-demo")
    except Exception as exc:  # the DB may not be ready on the very first poll
        print(f"    (gate watch: {exc})")


def run(args: argparse.Namespace) -> int:
    root = state_dir() / "demo"
    root.mkdir(parents=True, exist_ok=True)
    fleet = Path(args.fleet).resolve()
    with ExitStack() as stack:
        _step("starting the embedded PostgreSQL (kvfleet history + Airflow metadata)")
        pg = EmbeddedPostgres(root).start()
        stack.callback(pg.stop)
        env = {**os.environ, **airflow_env(root / "airflow", pg), "KVFLEET_FLEET_PATHS": str(fleet)}
        (root / "airflow" / "plugins").mkdir(parents=True, exist_ok=True)
        print(f"    history: {env['KVFLEET_HISTORY_URL']}")

        _step("starting the sandbox fleet (AWS and Kubernetes emulators, simulated controllers)")
        env.update(_sandbox_env(stack, fleet, root, args.keep))

        _step("migrating Airflow's metadata database")
        _run([sys.executable, "-m", "airflow", "db", "migrate"], env, quiet=True)

        _step(f"airflow dags test kvfleet_rollout (fleet {fleet.name}) — the full rollout, not a dry run")
        conf = json.dumps({"fleet": str(fleet)})  # the default speedup tolerance (25 %), as in production
        os.environ.update(env)
        _run_with_gate_watch([sys.executable, "-m", "airflow", "dags", "test", "kvfleet_rollout", "-c", conf], env,
                             root / "rollout.log")

        _step("per-LOB summary of the rollout (kvfleet audit rollout)")
        _run([sys.executable, "-m", "kvfleet.cli", "audit", "rollout"], env)

        _step("cross-pod L2 verification per endpoint (kvfleet audit verifications --since 1h)")
        _run([sys.executable, "-m", "kvfleet.cli", "audit", "verifications", "--since", "1h"], env)

        from kvfleet.fleet.inventory import load_inventory

        for cluster in load_inventory(fleet).clusters:  # one worker per GPU node: live workers and capacity 100Gi x N
            workers = cluster.curvine_workers
            _step(f"Curvine on {cluster.name}: {workers} workers, {cluster.curvine.worker.capacity(workers)} "
                  f"(kvfleet audit curvine --cluster {cluster.name})")
            _run([sys.executable, "-m", "kvfleet.cli", "audit", "curvine", "--cluster", cluster.name], env)

        _step("kvfleet audit runs")
        _run([sys.executable, "-m", "kvfleet.cli", "audit", "runs"], env)
    print("\nall stopped. Re-run with `make demo`; query history with `kvfleet audit ...`.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvfleet-demo", description="start the sandbox and an embedded "
                                     "PostgreSQL, run kvfleet_rollout, print the results, stop everything")
    parser.add_argument("--fleet", default=os.environ.get("KVFLEET_FLEET", "fleet.example.yaml"))
    parser.add_argument("--keep", action="store_true", help="leave the sandbox running afterwards")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
