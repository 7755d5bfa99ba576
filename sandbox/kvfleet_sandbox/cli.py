"""`kvfleet-sandbox up|down|status`: run the digital twin of a fleet on this machine, on 127.0.0.1 only.

The command of the separate ``kvfleet-sandbox`` distribution. ``kvfleet sandbox ...`` hands its arguments to it in a
child process (kvfleet never imports the twin); ``python -m kvfleet_sandbox.cli`` is how ``up`` starts its detached
child (``serve``).

Files in the state directory (default ``$KVFLEET_STATE_DIR/sandbox``):

- ``kubeconfig`` — one context per inventory cluster, over TLS with the sandbox's CA and the sandbox admin's token
  (``system:masters``: for looking around with kubectl; kvfleet itself authenticates with its own EKS token and is
  bound by ``k8s/rbac``); ``env`` — ``export`` lines (``source DIR/env``);
- ``ports.json`` — URLs and every listening port, kept after ``down`` so it can be checked;
- ``sandbox.pid`` — the serving process; ``ready`` — written once everything answers; ``sandbox.log``.

``up`` returns once ``ready`` appears (or fails with the log's tail). ``down`` signals only the recorded PID, and
only after checking that its command line is a ``kvfleet_sandbox.cli serve`` for this state directory, then
checks that no recorded port still accepts connections. ``status`` exits 0 when the sandbox runs, 3 when not.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SERVE_MODULE = "kvfleet_sandbox.cli"
LMCACHE_VERSIONS = ("0.3.9", "0.5.6")
EXIT_NOT_RUNNING = 3


def default_state_dir() -> Path:
    from kvfleet.paths import state_dir

    return state_dir() / "sandbox"


def _paths(state: Path) -> dict[str, Path]:
    return {name: state / file for name, file in (
        ("pid", "sandbox.pid"), ("ready", "ready"), ("log", "sandbox.log"), ("ports", "ports.json"),
        ("env", "env"), ("kubeconfig", "kubeconfig"))}


# ---- processes ----------------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Running and not a zombie (a container's PID 1 may never reap an orphaned child)."""
    stat = Path(f"/proc/{pid}/stat")
    if stat.parent.parent.exists() and Path("/proc/self").exists():
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_our_server(pid: int, state: Path) -> bool:
    """The PID's command line is `... -m kvfleet_sandbox.cli serve ... --state-dir <state>`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    if SERVE_MODULE not in argv or "serve" not in argv or "--state-dir" not in argv:
        return False
    given = argv[argv.index("--state-dir") + 1] if argv.index("--state-dir") + 1 < len(argv) else ""
    return Path(given).resolve() == state.resolve()


def _read_pid(state: Path) -> int | None:
    try:
        return int(_paths(state)["pid"].read_text().strip())
    except (OSError, ValueError):
        return None


def _running_pid(state: Path) -> int | None:
    pid = _read_pid(state)
    return pid if pid is not None and _alive(pid) and _is_our_server(pid, state) else None


def _recorded(state: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(_paths(state)["ports"].read_text()))
    except (OSError, ValueError):
        return {}


def _log_tail(state: Path, lines: int = 30) -> str:
    try:
        return "\n".join(_paths(state)["log"].read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---- serve (the sandbox process itself) ---------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Start the sandbox in this process, write ``ready``, and serve until SIGTERM or Ctrl-C."""
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state = Path(args.state_dir).resolve()
    paths = _paths(state)
    started = time.monotonic()
    settings = SandboxSettings(time_scale=args.time_scale, seed=args.seed, lmcache_version=args.lmcache_version)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    sandbox = start_sandbox(fleet=args.fleet, state_dir=state, settings=settings)
    try:
        paths["pid"].write_text(f"{os.getpid()}\n")
        elapsed = time.monotonic() - started
        paths["ready"].write_text(json.dumps({"pid": os.getpid(), "startup_s": round(elapsed, 3)}) + "\n")
        nodes = sum(len(t.gpu_nodes) for t in sandbox.twins.values())
        print(f"sandbox serving {len(sandbox.twins)} clusters, {nodes} GPU nodes (started in {elapsed:.2f}s); "
              f"pid {os.getpid()}", flush=True)
        if args.foreground:
            _print_usage(state)
            print("Ctrl-C stops it.", flush=True)
        while not stop.wait(0.5):
            pass
        print("sandbox stopping", flush=True)
    finally:
        sandbox.stop()
        paths["ready"].unlink(missing_ok=True)
        if _read_pid(state) == os.getpid():
            paths["pid"].unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("sandbox stopped", flush=True)
    return 0


# ---- up / down / status -------------------------------------------------------------------------------------


def _print_usage(state: Path) -> None:
    paths = _paths(state)
    print(f"  kubeconfig: {paths['kubeconfig']}")
    print(f"  env file:   {paths['env']}")
    print(f"  use it:     source {paths['env']}")


def _serve_argv(args: argparse.Namespace, state: Path) -> list[str]:
    return [sys.executable, "-m", SERVE_MODULE, "serve", "--fleet", str(Path(args.fleet).resolve()),
            "--state-dir", str(state), "--time-scale", repr(args.time_scale), "--seed", str(args.seed),
            "--lmcache-version", args.lmcache_version]


def cmd_up(args: argparse.Namespace) -> int:
    from kvfleet_sandbox.fleet_reader import FleetReadError, read_fleet

    state = Path(args.state_dir or default_state_dir()).resolve()
    state.mkdir(parents=True, exist_ok=True)
    paths = _paths(state)
    running = _running_pid(state)
    if running is not None:
        print(f"sandbox already running in {state} (pid {running}); `kvfleet sandbox down --state-dir {state}` "
              "stops it")
        _print_usage(state)
        return 0
    try:
        read_fleet(args.fleet)  # refuse a fleet file the sandbox cannot read here, before the child starts
    except FleetReadError as exc:
        print(f"kvfleet sandbox: cannot start from {args.fleet}:\n  " + "\n  ".join(exc.problems), file=sys.stderr)
        return 2
    for name in ("pid", "ready"):
        paths[name].unlink(missing_ok=True)
    if args.foreground:
        args.state_dir = str(state)
        return cmd_serve(args)
    started = time.monotonic()
    with paths["log"].open("ab") as log:
        child = subprocess.Popen(_serve_argv(args, state), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    paths["pid"].write_text(f"{child.pid}\n")
    deadline = started + args.timeout
    while not paths["ready"].exists():
        if child.poll() is not None:
            paths["pid"].unlink(missing_ok=True)
            print(f"kvfleet sandbox: the sandbox exited with code {child.returncode} while starting; "
                  f"{paths['log']} ends with:\n{_log_tail(state)}", file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
            paths["pid"].unlink(missing_ok=True)
            print(f"kvfleet sandbox: not ready after {args.timeout:.0f}s (stopped it); {paths['log']} ends with:\n"
                  f"{_log_tail(state)}", file=sys.stderr)
            return 1
        time.sleep(0.05)
    recorded = _recorded(state)
    print(f"sandbox up in {time.monotonic() - started:.2f}s (pid {child.pid}): "
          f"{len(recorded.get('clusters', {}))} clusters, state in {state}")
    for name, info in recorded.get("clusters", {}).items():
        print(f"  {name:<16} {info['region']:<10} {info['gpu_nodes']:>3} x {info['instance_type']:<16} "
              f"{info['kube_url']}")
    _print_usage(state)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from kvfleet_sandbox.runtime import port_refuses

    state = Path(args.state_dir or default_state_dir()).resolve()
    paths = _paths(state)
    pid = _read_pid(state)
    if pid is None or not _alive(pid):
        paths["pid"].unlink(missing_ok=True)
        paths["ready"].unlink(missing_ok=True)
        print(f"no sandbox running in {state}")
    elif not _is_our_server(pid, state):
        print(f"kvfleet sandbox: pid {pid} in {paths['pid']} is not a sandbox serving {state}; not signalling it "
              "(remove the stale pid file if the sandbox is gone)", file=sys.stderr)
        return 1
    else:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            print(f"kvfleet sandbox: pid {pid} ignored SIGTERM for {args.timeout:.0f}s; killing it",
                  file=sys.stderr)
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        paths["pid"].unlink(missing_ok=True)
        paths["ready"].unlink(missing_ok=True)
        print(f"sandbox stopped (pid {pid})")
    listening = [p for p in _recorded(state).get("ports", []) if not port_refuses(int(p))]
    if listening:
        print(f"kvfleet sandbox: ports still listening after down: {listening}", file=sys.stderr)
        return 1
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = Path(args.state_dir or default_state_dir()).resolve()
    pid = _running_pid(state)
    recorded = _recorded(state) if pid is not None else {}
    live: dict[str, Any] = {}
    if pid is not None and recorded.get("admin_url"):
        try:
            with urllib.request.urlopen(f"{recorded['admin_url']}/clusters", timeout=3) as resp:
                live = json.load(resp)
        except OSError:
            live = {}
    info = live or recorded
    report = {"state_dir": str(state), "running": pid is not None, "pid": pid, "answering": bool(live),
              "aws_url": info.get("aws_url"), "admin_url": info.get("admin_url"),
              "clusters": info.get("clusters", {}),
              "env_file": str(_paths(state)["env"]) if pid is not None else None}
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    elif pid is None:
        print(f"sandbox: not running in {state}")
    else:
        print(f"sandbox: running in {state} (pid {pid}, {'answering' if live else 'NOT answering'})")
        print(f"  aws:   {report['aws_url']}")
        print(f"  admin: {report['admin_url']}")
        for name, cluster in report["clusters"].items():
            print(f"  {name:<16} {cluster['region']:<10} {cluster['gpu_nodes']:>3} GPU nodes  {cluster['kube_url']}"
                  f"  controllers: {len(cluster.get('controllers', []))}")
        print(f"  env:   source {report['env_file']}")
    return 0 if pid is not None else EXIT_NOT_RUNNING


# ---- parser -------------------------------------------------------------------------------------------------


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _add_commands(sub: Any) -> None:
    default_fleet = os.environ.get("KVFLEET_FLEET", "fleet.example.yaml")
    state_help = "state directory (default $KVFLEET_STATE_DIR/sandbox)"

    def starting(p: argparse.ArgumentParser) -> None:
        p.add_argument("--fleet", default=default_fleet, help="inventory file (default %(default)s)")
        p.add_argument("--state-dir", help=state_help)
        p.add_argument("--time-scale", type=_positive, default=0.02,
                       help="real seconds per model second (default %(default)s: a 30 s start-up takes 0.6 s)")
        p.add_argument("--seed", type=int, default=7)
        p.add_argument("--lmcache-version", choices=LMCACHE_VERSIONS, default="0.3.9",
                       help="LMCache log format the vLLM pods write")

    up = sub.add_parser("up", help="start the sandbox fleet; returns once everything answers")
    starting(up)
    up.add_argument("--foreground", action="store_true", help="run in this process until Ctrl-C or SIGTERM")
    up.add_argument("--timeout", type=_positive, default=60.0, help="seconds to wait for readiness")
    up.set_defaults(func=cmd_up)

    serve = sub.add_parser("serve", help="(internal) the sandbox process that `up` starts")
    starting(serve)
    serve.set_defaults(func=cmd_serve, foreground=False)

    down = sub.add_parser("down", help="stop the sandbox and check that nothing is left listening")
    down.add_argument("--state-dir", help=state_help)
    down.add_argument("--timeout", type=_positive, default=20.0, help="seconds to wait after SIGTERM")
    down.set_defaults(func=cmd_down)

    status = sub.add_parser("status", help="what runs: clusters, URLs, PID (exit 3 when not running)")
    status.add_argument("--state-dir", help=state_help)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvfleet-sandbox", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="sandbox_command", required=True)
    _add_commands(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
