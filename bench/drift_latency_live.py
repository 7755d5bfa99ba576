"""Benchmark: from a change made by hand to a recorded drift finding, through the real local Airflow.

``bench/drift_latency.py`` runs the watch trigger in-process and calls the drift check itself. This one takes the
whole Airflow path: it starts the local service kvfleet ships (``tools/up.sh``, what ``make up`` runs: the sandbox,
the embedded PostgreSQL for the history and Airflow's metadata, and Airflow's api-server, scheduler,
dag-processor and triggerer with the LocalExecutor, all on 127.0.0.1) in a fresh state directory on a free port,
with an inventory of ml-prod-use1 and two endpoints (what the in-process bench rolls out), then:

1. rolls out stages 1–3 and the two endpoints from this process (the in-process bench's set-up, against the
   service's sandbox and history), and records the drift baseline;
2. unpauses ``kvfleet_drift_watch`` over the REST API and waits until the dag-processor has registered its
   ``AssetWatcher`` trigger (``FleetWatchTrigger``) and the triggerer has picked it up (Airflow's ``trigger`` table),
   then until the fleet is quiet;
3. for each trial makes one change by hand (``kubectl patch`` of an endpoint Deployment's env, ``helm upgrade
   --reuse-values --set cluster.formatMaster=true`` of Curvine, an operator re-render through the sandbox's admin
   endpoint, which re-renders every endpoint of the cluster) and polls kvfleet's history until a
   ``kvfleet_drift_watch`` run has recorded the expected finding (``drift_findings``: that kind on ml-prod-use1,
   seen after the change, by a ``kvfleet_drift_watch/…`` run). From Airflow's metadata database it then reads when
   the asset event was created (``asset_event``, linked to the run by ``dagrun_asset_event``), when the run was
   created and queued (``dag_run``) and when its ``check_cluster`` task started and ended (``task_instance``);
4. between trials kvfleet remediates from this process (untimed), then waits until no asset event came for the
   quiet window plus 5 s and no ``kvfleet_drift_watch`` run is queued or running.

Everything it started is stopped at the end with ``tools/down.sh`` (pid files of this state directory only),
also on failure, Ctrl-C or SIGTERM.

    python bench/drift_latency_live.py [--trials 3] [--quiet-s 15] [--json] [--keep-logs DIR]
    python bench/drift_latency.py --live ...      (the same)

``--json`` prints only the JSON result on stdout. Exit 0 when every trial recorded its finding and p50 < 60 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import drift_latency as inproc  # the set-up, the changes and the constants are shared

ROOT = inproc.ROOT
PROD, ROLLED, EXPECTED, TARGET_P50_S = inproc.PROD, inproc.ROLLED, inproc.EXPECTED, inproc.TARGET_P50_S
DAG_ID = "kvfleet_drift_watch"
TRIAL_TIMEOUT_S = 300.0
UP_TIMEOUT_S = 900.0
QUIET_TIMEOUT_S = 300.0


def _load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_fleet(path: Path) -> Path:
    """The in-process bench's inventory (``drift_latency.fleet_text()``), for the service and this process."""
    path.write_text(inproc.fleet_text())
    return path


def _read_env(env_file: Path) -> dict[str, str]:
    """The environment tools/up.sh wrote (``export`` lines), as bash reads it."""
    out = subprocess.run(["bash", "-c", 'set -a; source "$1"; env -0', "_", str(env_file)], check=True,
                         capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]}).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


class Service:
    """tools/up.sh in its own state directory and port; ``stop()`` runs tools/down.sh on the same directory."""

    def __init__(self, state: Path, port: int, fleet: Path, quiet_s: float, say: Callable[[str], None]) -> None:
        self.state, self.port, self.fleet, self.say = state, port, fleet, say
        self.env = {**os.environ, "KVFLEET_STATE_DIR": str(state), "KVFLEET_UP_PORT": str(port),
                    "KVFLEET_FLEET": str(fleet), "KVFLEET_DRIFT_WATCH_QUIET_S": repr(quiet_s)}
        for key in ("KVFLEET_HISTORY_URL", "KVFLEET_HISTORY_OWNER_URL", "AIRFLOW_CONN_KVFLEET_HISTORY",
                    "AIRFLOW_HOME", "AIRFLOW_CONFIG"):
            self.env.pop(key, None)
        self.up_dir = state / "up"
        self.started = False

    def start(self) -> dict[str, str]:
        script = ROOT / "tools" / "up.sh"
        self.started = True  # down.sh is safe on a half-started service: it goes by the pid files
        log = self.state / "up.log"
        with log.open("w") as fh:
            proc = subprocess.run(["bash", str(script)], cwd=ROOT, env=self.env, stdout=fh,
                                  stderr=subprocess.STDOUT, timeout=UP_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"tools/up.sh exited {proc.returncode}: {log.read_text()[-2000:]}")
        return _read_env(self.up_dir / "env")

    def stop(self) -> str:
        if not self.started:
            return "not started"
        proc = subprocess.run(["bash", str(ROOT / "tools" / "down.sh")], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=300, check=False)
        return f"tools/down.sh exit {proc.returncode}: {(proc.stdout + proc.stderr).strip()}"


class Airflow:
    """Airflow's REST API (as the service's admin) and its metadata database (read only)."""

    def __init__(self, env: dict[str, str]) -> None:
        from sqlalchemy import create_engine

        self.url = env["AIRFLOW_API_URL"]
        self.user, self.password = env["AIRFLOW_API_USER"], env["AIRFLOW_API_PASSWORD"]
        self.db = create_engine(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], pool_pre_ping=True)
        self._token: str | None = None

    def close(self) -> None:
        self.db.dispose()

    def _request(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        headers = {"Content-Type": "application/json"}
        if auth:
            if self._token is None:
                self._token = self._request("POST", "/auth/token", {"username": self.user,
                                                                   "password": self.password},
                                            auth=False)["access_token"]
            headers["Authorization"] = f"Bearer {self._token}"
        req = urllib.request.Request(self.url + path, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=30) as resp:  # 127.0.0.1, our own service
            return json.loads(resp.read() or b"null")

    def unpause_when_parsed(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._request("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
                return
            except (urllib.error.HTTPError, urllib.error.URLError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{DAG_ID} was not parsed (or not unpausable) in {timeout_s:.0f}s: "
                                       f"{exc}") from None
                time.sleep(2)

    def rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        from sqlalchemy import text

        with self.db.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text(sql), params)]

    def watcher_trigger(self) -> dict[str, Any] | None:
        rows = self.rows("SELECT t.id, t.classpath, t.triggerer_id, t.created_date FROM trigger t "
                         "JOIN asset_watcher w ON w.trigger_id = t.id WHERE t.classpath LIKE '%FleetWatchTrigger'")
        return rows[0] if rows else None

    def last_event(self) -> datetime | None:
        rows = self.rows("SELECT max(timestamp) AS ts FROM asset_event")
        return rows[0]["ts"] if rows else None

    def active_runs(self) -> int:
        return int(self.rows("SELECT count(*) AS n FROM dag_run WHERE dag_id = :d AND state IN ('queued', 'running')",
                             d=DAG_ID)[0]["n"])

    def run_timeline(self, run_id: str, since: datetime) -> dict[str, Any]:
        run = self.rows("SELECT id, state, created_at, queued_at, start_date, end_date FROM dag_run "
                        "WHERE dag_id = :d AND run_id = :r", d=DAG_ID, r=run_id)
        if not run:
            return {}
        r = run[0]
        events = self.rows("SELECT e.id, e.timestamp, e.extra FROM asset_event e JOIN dagrun_asset_event de "
                           "ON de.event_id = e.id WHERE de.dag_run_id = :i ORDER BY e.timestamp", i=r["id"])
        tis = self.rows("SELECT task_id, map_index, state, queued_dttm, start_date, end_date FROM task_instance "
                        "WHERE dag_id = :d AND run_id = :r", d=DAG_ID, r=run_id)
        after = [e for e in events if e["timestamp"] >= since]
        check = [t for t in tis if t["task_id"] == "check_cluster" and t["start_date"] is not None]
        scope = [t for t in tis if t["task_id"] == "scope" and t["start_date"] is not None]

        def rel(ts: datetime | None) -> float | None:
            return None if ts is None else round((ts - since).total_seconds(), 2)

        return {"dag_run_id": r["id"], "run_state": r["state"], "events_linked": len(events),
                "event_s": rel(after[0]["timestamp"] if after else None),
                "event_before_change": len(events) - len(after),
                "run_created_s": rel(r["created_at"]), "run_queued_s": rel(r["queued_at"]),
                "run_started_s": rel(r["start_date"]),
                "scope_started_s": rel(min(t["start_date"] for t in scope) if scope else None),
                "check_queued_s": rel(min(t["queued_dttm"] for t in check if t["queued_dttm"]) if check else None),
                "check_started_s": rel(min(t["start_date"] for t in check) if check else None),
                "check_ended_s": rel(max(t["end_date"] for t in check if t["end_date"])
                                     if check and any(t["end_date"] for t in check) else None)}


class History:
    """kvfleet's history (the keeper's PostgreSQL, as the writer role the service's tasks use)."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine

        self.db = create_engine(url, pool_pre_ping=True)

    def finding(self, kind: str, since: datetime) -> dict[str, Any] | None:
        from sqlalchemy import text

        with self.db.connect() as conn:
            row = conn.execute(text(
                "SELECT id, fingerprint, first_seen, last_seen, last_run_key FROM drift_findings "
                "WHERE cluster = :c AND kind = :k AND last_seen >= :t AND last_run_key LIKE :p "
                "ORDER BY last_seen LIMIT 1"), {"c": PROD, "k": kind, "t": since, "p": f"{DAG_ID}/%"}).first()
        return dict(row._mapping) if row else None


class LiveBench(inproc.Bench):
    """The in-process bench's changes and remediation, against the service's sandbox; its own drift checks are
    recorded under ``bench/…`` runs so they are never taken for the DAG's."""

    def check(self, remediate: bool = False) -> Any:
        from kvfleet.history.keys import StepKey
        from kvfleet.stages import drift

        ctx = inproc._ctx(self.inv)
        run = f"bench/live-{os.getpid()}-{next(self.runs)}"
        self.history.runs.start(run, dag_id="bench", run_id=run, trigger="bench", triggered_by=None, params={})
        ctx.history, ctx.step_key = self.history, StepKey(run, "check_cluster")
        try:
            return drift.check(ctx, remediate=remediate)
        finally:
            ctx.close()

    def operator_rerender(self, n: int) -> None:
        _admin("POST", "/fault", {"cluster": PROD, "kind": "operator_rerender"})


def _admin(method: str, path: str, body: Any = None) -> Any:
    """The sandbox's admin endpoint (fault hooks, request counters; 127.0.0.1)."""
    req = urllib.request.Request(os.environ["KVFLEET_SANDBOX_ADMIN"].rstrip("/") + path, method=method,
                                 headers={"Content-Type": "application/json"},
                                 data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


WATCHED = ("watch inferenceendpointconfigs", "watch deployments", "watch pods", "watch secrets")


def _watch_requests() -> dict[str, int]:
    """How many watch requests the sandbox's API server for ml-prod-use1 has received, per watched collection
    (the trigger's ``streams()``): the triggerer's watches are open once each has grown."""
    counts = _admin("GET", f"/requests?cluster={PROD}")["clusters"][PROD]["counts"]
    return {k: int(counts.get(k, 0)) for k in WATCHED}


def _wait_quiet(af: Airflow, quiet_s: float, since: float, say: Callable[[str], None]) -> float:
    """Until no asset event for quiet_s + 5 s (counted from ``since`` at the earliest) and no drift_watch run
    queued or running. Returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < QUIET_TIMEOUT_S:
        last = af.last_event()
        since_event = (datetime.now(UTC) - last).total_seconds() if last else float("inf")
        quiet_for = min(since_event, time.time() - since)
        if quiet_for >= quiet_s + 5 and af.active_runs() == 0:
            return time.monotonic() - started
        time.sleep(1)
    say(f"  (not quiet after {QUIET_TIMEOUT_S:.0f}s; going on)")
    return time.monotonic() - started


def _trial(bench: LiveBench, af: Airflow, hist: History, kind: str, n: int) -> dict[str, Any]:
    expected = EXPECTED[kind]
    t0 = datetime.now(UTC)
    started = time.monotonic()
    getattr(bench, kind)(n)
    change_s = time.monotonic() - started
    while time.monotonic() - started < TRIAL_TIMEOUT_S:
        row = hist.finding(expected, t0)
        if row is not None:
            seen_s = round(time.monotonic() - started, 2)
            run_id = row["last_run_key"].split("/", 1)[1]
            out = {"change": kind, "trial": n, "found": True, "latency_s": seen_s,
                   "recorded_s": round((row["last_seen"] - t0).total_seconds(), 2),
                   "change_call_s": round(change_s, 2), "run_id": run_id, "load": _load()}
            time.sleep(1)  # the task's end_date is written right after the finding's transaction
            out.update(af.run_timeline(run_id, t0))
            return out
        time.sleep(0.5)
    return {"change": kind, "trial": n, "found": False, "latency_s": None, "load": _load()}


def _phases(t: dict[str, Any]) -> dict[str, float | None]:
    def diff(a: str, b: str) -> float | None:
        return round(t[b] - t[a], 2) if t.get(a) is not None and t.get(b) is not None else None

    return {"debounce_s": t.get("event_s"), "scheduling_s": diff("event_s", "check_started_s"),
            "task_s": diff("check_started_s", "recorded_s"), "total_s": t.get("latency_s")}


def _summary(trials: list[dict[str, Any]], quiet_s: float, wall_s: float, load: dict[str, Any]) -> dict[str, Any]:
    for t in trials:
        if t["found"]:
            t.update(_phases(t))
    found = [t["latency_s"] for t in trials if t["found"]]
    by_change: dict[str, Any] = {}
    for kind in EXPECTED:
        rows = [t for t in trials if t["change"] == kind and t["found"]]

        def med(key: str, rows: list[dict[str, Any]] = rows) -> float | None:
            xs = [r[key] for r in rows if r.get(key) is not None]
            return round(statistics.median(xs), 2) if xs else None

        by_change[kind] = {"trials": sum(t["change"] == kind for t in trials), "found": len(rows),
                           "p50_s": med("latency_s"), "max_s": max((r["latency_s"] for r in rows), default=None),
                           "debounce_p50_s": med("debounce_s"), "scheduling_p50_s": med("scheduling_s"),
                           "task_p50_s": med("task_s")}
    p50 = round(statistics.median(found), 2) if found else None
    return {"bench": "drift_latency", "mode": "live", "cluster": PROD, "quiet_s": quiet_s,
            "target_p50_s": TARGET_P50_S, "p50_s": p50, "max_s": max(found) if found else None,
            "found": len(found), "trials": len(trials), "by_change": by_change, "runs": trials,
            "wall_s": round(wall_s, 1), "load": load,
            "path": "tools/up.sh (make up): FleetWatchTrigger in Airflow's triggerer -> asset event -> scheduler "
                    "-> kvfleet_drift_watch run (LocalExecutor) -> check_cluster -> drift_findings",
            "ok": bool(found) and len(found) == len(trials) and p50 is not None and p50 < TARGET_P50_S}


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM (and SIGHUP) unwind like Ctrl-C, so the finally blocks stop the service."""
    def handler(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _start_watch(af: Airflow, state: Path, load: dict[str, Any], say: Callable[[str], None]) -> None:
    """Unpause the DAG; wait until the dag-processor registered its AssetWatcher trigger, the triggerer took it,
    and the trigger's watches are open on the sandbox's API server."""
    say(f"unpausing {DAG_ID}; waiting for its AssetWatcher trigger in the triggerer ...")
    t = time.monotonic()
    before = _watch_requests()
    af.unpause_when_parsed()
    deadline = time.monotonic() + 600
    trig = af.watcher_trigger()
    while trig is None or trig["triggerer_id"] is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the FleetWatchTrigger of {DAG_ID} was not running in the triggerer after "
                               f"600s (trigger row: {trig}); see {state}/up/logs/")
        time.sleep(1)
        trig = af.watcher_trigger()
    load["trigger_assigned_s"] = round(time.monotonic() - t, 1)
    # The trigger row is assigned before run() has listed and opened its watches (20 s under load): a change
    # made in between is in the initial list and never fires. Wait until every stream's watch is open.
    while not all(n > before[k] for k, n in _watch_requests().items()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the triggerer's watches on {PROD} did not open in 600s (watch requests "
                               f"{_watch_requests()}, before {before}); see {state}/up/logs/triggerer.log")
        time.sleep(0.5)
    time.sleep(2)
    load["watch_running_s"] = round(time.monotonic() - t, 1)
    say(f"  trigger {trig['id']} on triggerer {trig['triggerer_id']} after {load['trigger_assigned_s']:.0f}s, "
        f"its watches open after {load['watch_running_s']:.0f}s")


def _run(state: Path, trials: int, quiet_s: float, say: Callable[[str], None], started: float,
         kinds: tuple[str, ...]) -> dict[str, Any]:
    from kvfleet.history.repos import HistoryRepos as KvHistory

    fleet = _write_fleet(state / "fleet.yaml")
    port = _free_port()
    service = Service(state, port, fleet, quiet_s, say)
    load: dict[str, Any] = {"before": _load()}
    runs: list[dict[str, Any]] = []
    af: Airflow | None = None
    try:
        say(f"starting the local Airflow service (tools/up.sh) on 127.0.0.1:{port}, state {state} ...")
        t = time.monotonic()
        env = service.start()
        load["up_s"] = round(time.monotonic() - t, 1)
        say(f"  up in {load['up_s']:.0f}s")
        os.environ.update(env)
        os.environ.pop("AIRFLOW_CONN_AWS_DEFAULT", None)  # this process: boto3 reads AWS_ENDPOINT_URL natively
        os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "WARNING"  # this process only: the service logs to files
        os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}{os.pathsep}{os.environ['PATH']}"
        af = Airflow(env)
        inv = inproc._inventory()  # what _write_fleet wrote for the service
        say("converging ml-prod-use1 (stages 1-3, two endpoints) ...")
        t = time.monotonic()
        inproc._converge(inv)
        load["converge_s"] = round(time.monotonic() - t, 1)
        sandbox = type("SandboxRef", (), {"kubeconfig": Path(env["KUBECONFIG"])})()
        bench = LiveBench(sandbox, inv, KvHistory(), quiet_s, say)
        bench.check()  # the baseline (a Curvine snapshot the loss check compares with)
        hist = History(env["KVFLEET_HISTORY_URL"])
        _start_watch(af, state, load, say)
        _wait_quiet(af, quiet_s, time.time(), say)
        for n in range(trials):
            for kind in kinds:
                run = _trial(bench, af, hist, kind, n)
                runs.append(run)
                if run["found"]:
                    ph = _phases(run)
                    say(f"  {kind} #{n}: finding after {run['latency_s']:.1f}s (event {ph['debounce_s']}s, "
                        f"check started {run.get('check_started_s')}s, recorded {run['recorded_s']}s; "
                        f"run {run['run_id']}; load {run['load']})")
                else:
                    say(f"  {kind} #{n}: NO finding within {TRIAL_TIMEOUT_S:.0f}s")
                for _ in range(3):  # untimed: kvfleet's own fix, then the watch's and Airflow's quiet
                    if not bench.check(remediate=True).findings:
                        break
                    time.sleep(1)
                _wait_quiet(af, quiet_s, time.time(), say)
        load["after"] = _load()
    finally:
        if af is not None:
            af.close()
        with contextlib.suppress(Exception):
            from kvfleet.history.db import dispose_engines

            dispose_engines()
        say("stopping the service (tools/down.sh) ...")
        load["down"] = service.stop()
        say(f"  {load['down']}")
    return _summary(runs, quiet_s, time.monotonic() - started, load)


def _print(summary: dict[str, Any], say: Callable[[str], None]) -> None:
    say(f"\ndrift latency through Airflow (quiet window {summary['quiet_s']:.0f}s), {summary['found']}/"
        f"{summary['trials']} findings recorded; load average {summary['load'].get('before')} -> "
        f"{summary['load'].get('after')}")
    say(f"{'change':<20}{'found':>8}{'debounce':>10}{'sched':>8}{'task':>8}{'p50 s':>8}{'max s':>8}")
    for kind, row in summary["by_change"].items():
        say(f"{kind:<20}{row['found']:>4}/{row['trials']:<3}{row['debounce_p50_s'] or '-':>10}"
            f"{row['scheduling_p50_s'] or '-':>8}{row['task_p50_s'] or '-':>8}{row['p50_s'] or '-':>8}"
            f"{row['max_s'] or '-':>8}")
    say(f"{'all':<20}{summary['found']:>4}/{summary['trials']:<3}{'':>26}{summary['p50_s'] or '-':>8}"
        f"{summary['max_s'] or '-':>8}   target p50 < {summary['target_p50_s']:.0f}s")
    for t in summary["runs"]:
        if t["found"]:
            say(f"  {t['change']} #{t['trial']}: event {t.get('event_s')}s, run created {t.get('run_created_s')}s, "
                f"scope {t.get('scope_started_s')}s, check {t.get('check_started_s')}-{t.get('check_ended_s')}s, "
                f"recorded {t['recorded_s']}s, seen {t['latency_s']}s")
    say(f"path: {summary['path']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    inproc.add_common_arguments(parser)
    parser.add_argument("--changes", nargs="+", choices=list(EXPECTED), default=list(EXPECTED),
                        help="which changes to make (default: all three)")
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy the service's logs (state/up/logs) here before the state is removed")
    args = parser.parse_args(argv)
    if not inproc.common_arguments_valid(args):
        return 2
    out = sys.stderr if args.json else sys.stdout

    def say(msg: str) -> None:
        print(msg, file=out, flush=True)

    started = time.monotonic()
    # A short path: the embedded PostgreSQL's Unix socket lives under it (108-byte limit).
    state = Path(tempfile.mkdtemp(prefix="kvf-live-", dir="/tmp"))
    try:
        with _signals_raise(), (contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()):
            summary = _run(state, args.trials, args.quiet_s, say, started, tuple(args.changes))
    finally:
        if args.keep_logs is not None and (state / "up" / "logs").is_dir():
            shutil.copytree(state / "up" / "logs", args.keep_logs, dirs_exist_ok=True)
        shutil.rmtree(state, ignore_errors=True)
    if args.json:
        print(json.dumps(summary, sort_keys=True, default=str))
    else:
        _print(summary, say)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
