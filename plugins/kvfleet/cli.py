"""The `kvfleet` command: validate, plan, audit, db, sandbox, demo.

Entry point declared in pyproject.toml. Every subcommand works without Airflow running; `audit` and `db` use
the history database (embedded PostgreSQL when none is configured). Exit codes: 0 ok, 2 invalid input
(inventory, arguments), 1 anything else that failed.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kvfleet.errors import InventoryError, KvfleetError
from kvfleet.fleet.inventory import InventoryWarning, load_inventory
from kvfleet.fleet.plan import make_plan, render_plan_text

DEFAULT_FLEET = os.environ.get("KVFLEET_FLEET", "fleet.example.yaml")


def _print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    if not rows:
        print("(none)")
        return
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        if abs(value) >= 100:  # milliseconds and byte counts: whole numbers, never 1.1e+03
            return f"{value:.0f}"
        text = f"{value:.3g}"
        return f"{value:.6f}".rstrip("0").rstrip(".") if "e" in text else text
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)[:60]
    return str(value)


def _json_dump(rows: Any) -> None:
    print(json.dumps(rows, default=str, indent=2, sort_keys=True))


# ---- validate / plan ---------------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InventoryWarning)
        inv = load_inventory(args.fleet)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    print(f"{args.fleet}: valid — {len(inv.lobs)} LOBs, {len(inv.clusters)} clusters, "
          f"{len(inv.endpoints)} endpoints")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    inv = load_inventory(args.fleet).select(lobs=args.lob, clusters=args.cluster)
    plan = make_plan(inv, wave_size=args.wave_size, canary=not args.no_canary)
    if args.diff:
        from kvfleet.stages.dry_run import print_fleet_diff

        return print_fleet_diff(inv, plan)
    if args.json:
        _json_dump(plan.as_dict())
    else:
        print(render_plan_text(plan))
    return 0


# ---- audit ---------------------------------------------------------------------------------------------------


def _history() -> Any:
    from kvfleet.history.repo import History

    return History()


def _cutoff(since: str) -> datetime:
    from kvfleet.history.repo import since_cutoff

    return since_cutoff(since, datetime.now(UTC))


def cmd_audit(args: argparse.Namespace) -> int:
    h = _history()
    what = args.what
    if what == "runs":
        rows = h.query("recent_runs", cutoff=_cutoff(args.since), limit=args.limit)
        cols = ["started_at", "dag_id", "run_id", "trigger", "triggered_by", "status", "changed", "unchanged",
                "failed", "planned"]
    elif what == "verifications":
        rows = h.query("verifications", cutoff=_cutoff(args.since), lob=args.lob, endpoint=args.endpoint)
        cols = ["at", "cluster", "endpoint", "lob", "prompt_tokens", "hit_ratio", "ttft_cold_ms", "ttft_warm_ms",
                "speedup", "expected_speedup", "verdict", "diagnosis"]
    elif what == "drift":
        rows = h.query("open_drift") if args.open else h.query("drift_since", cutoff=_cutoff(args.since))
        cols = ["cluster", "lob", "endpoint", "kind", "severity", "field", "expected", "actual", "first_seen",
                "last_seen"] + ([] if args.open else ["resolved_at"])
    elif what == "curvine":
        if not args.cluster:
            print("kvfleet audit curvine: --cluster is required", file=sys.stderr)
            return 2
        rows = h.query("curvine_history", cluster=args.cluster)
        caps = h.query("capacity_history", cluster=args.cluster)
        if args.json:
            _json_dump({"releases": rows, "capacity": caps})
            return 0
        print(f"Curvine releases on {args.cluster} (format flags at every revision)")
        _print_table(rows, ["release", "revision", "chart_version", "status", "format_master", "format_worker",
                            "format_journal", "recorded_at", "run_key"])
        print(f"\nCapacity snapshots on {args.cluster}")
        for c in caps:  # bytes as GiB for reading; --json keeps the bytes
            c["capacity_gib"] = None if c.get("capacity_bytes") is None else f"{c['capacity_bytes'] / 2**30:.0f}"
            c["fs_used_gib"] = None if c.get("fs_used_bytes") is None else f"{c['fs_used_bytes'] / 2**30:.2f}"
        _print_table(caps, ["at", "step", "phase", "capacity_gib", "fs_used_gib", "live_workers", "lost_workers",
                            "files_total", "run_key"])
        return 0
    elif what == "rollout":
        return _audit_rollout(h, args)
    elif what == "endpoint":
        rows = h.query("endpoint_changes", endpoint=args.endpoint or "", cutoff=_cutoff(args.since))
        cols = ["at", "cluster", "endpoint", "stage", "step", "outcome", "dag_id", "trigger", "triggered_by"]
    else:  # argparse restricts choices
        raise AssertionError(what)
    if args.json:
        _json_dump(rows)
    else:
        _print_table(rows, cols)
    return 0


def _audit_rollout(h: Any, args: argparse.Namespace) -> int:
    """Per-LOB table of one rollout run (the newest one unless --run is given)."""
    run_key = args.run
    if not run_key:
        last = h.query("last_run", dag_id="kvfleet_rollout")
        if not last:
            print("no kvfleet_rollout run recorded yet")
            return 0
        run_key = last[0]["run_key"]
    rows = h.query("rollout_by_lob", run_key=run_key)
    if args.json:
        _json_dump({"run_key": run_key, "lobs": rows})
        return 0
    print(f"rollout {run_key}")
    _print_table(rows, ["lob", "moved", "unchanged", "skipped", "failed", "verified_pass", "verified_other",
                        "avg_hit_ratio", "avg_speedup", "avg_expected"])
    return 0


# ---- db ------------------------------------------------------------------------------------------------------


def cmd_db(args: argparse.Namespace) -> int:
    from sqlalchemy import create_engine

    from kvfleet.history import migrate
    from kvfleet.history.db import history_url

    engine = create_engine(history_url())
    if args.action == "upgrade":
        migrate.upgrade(engine, args.revision or "head")
    elif args.action == "downgrade":
        migrate.downgrade(engine, args.revision or "base")
    print(f"history schema at revision {migrate.current_revision(engine) or '(empty)'} "
          f"(head {migrate.head_revision()})")
    engine.dispose()
    return 0


# ---- gates -------------------------------------------------------------------------------------------------


def cmd_gate(args: argparse.Namespace) -> int:
    """Rollout gates waiting for a human: list them, or answer one (the same code path as Airflow's REST API)."""
    from kvfleet.airflow import hitl

    gates = hitl.pending(args.dag)
    if args.action == "list":
        if not gates:
            print("no gate is waiting for a human")
        for i, g in enumerate(gates):
            print(f"[{i}] {g.run_id} {g.task_id}[{g.map_index}]: {g.subject}\n    options: {', '.join(g.options)}")
            for line in (g.body or "").splitlines():
                print(f"    {line}")
        return 0
    if args.index is None or not 0 <= args.index < len(gates):
        print(f"kvfleet gate respond: --index must be one of 0..{len(gates) - 1} (see `kvfleet gate list`)",
              file=sys.stderr)
        return 2
    hitl.respond(gates[args.index], args.option, args.user)
    print(f"answered {args.option!r} on {gates[args.index].task_id}[{gates[args.index].map_index}]")
    return 0


# ---- parser --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvfleet", description="Tiered KV cache fleet manager for SageMaker HyperPod")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="validate a fleet inventory; exit 2 listing every problem")
    v.add_argument("--fleet", default=DEFAULT_FLEET)
    v.set_defaults(func=cmd_validate)

    pl = sub.add_parser("plan", help="print the rollout plan (stages per cluster, then waves)")
    pl.add_argument("--fleet", default=DEFAULT_FLEET)
    pl.add_argument("--lob", action="append", help="restrict to a line of business (repeatable)")
    pl.add_argument("--cluster", action="append", help="restrict to a cluster (repeatable)")
    pl.add_argument("--wave-size", type=int, default=None, help="endpoints per cluster per wave")
    pl.add_argument("--no-canary", action="store_true", help="no canary wave")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--diff", action="store_true", help="observe the live fleet and print what would change")
    pl.set_defaults(func=cmd_plan)

    a = sub.add_parser("audit", help="query the history store")
    a.add_argument("what", choices=["runs", "rollout", "verifications", "drift", "curvine", "endpoint"])
    a.add_argument("--run", help="rollout: the run key (dag_id/run_id); default the newest")
    a.add_argument("--since", default="7d")
    a.add_argument("--limit", type=int, default=50)
    a.add_argument("--lob")
    a.add_argument("--endpoint")
    a.add_argument("--cluster")
    a.add_argument("--open", action="store_true", help="drift: only findings open now")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_audit)

    d = sub.add_parser("db", help="history database migrations")
    d.add_argument("action", choices=["upgrade", "downgrade", "current"])
    d.add_argument("revision", nargs="?")
    d.set_defaults(func=cmd_db)

    g = sub.add_parser("gate", help="rollout gates waiting for a human: list, respond")
    g.add_argument("action", choices=["list", "respond"])
    g.add_argument("--dag", default="kvfleet_rollout")
    g.add_argument("--index", type=int, help="respond: which pending gate (from `gate list`)")
    g.add_argument("--option", default="Approve", help="respond: Approve | Skip endpoint | Abort | Reject")
    g.add_argument("--user", default=getpass.getuser(), help="respond: recorded as the responder")
    g.set_defaults(func=cmd_gate)

    try:
        from kvfleet.sandbox.cli import add_sandbox_parser
    except ImportError:  # the sandbox ships with the package; this only guards partial installs
        pass
    else:
        add_sandbox_parser(sub)

    dm = sub.add_parser("demo", help="start the sandbox and embedded PostgreSQL, run kvfleet_rollout, print results")
    dm.add_argument("--fleet", default=DEFAULT_FLEET)
    dm.add_argument("--keep", action="store_true", help="leave the sandbox running afterwards")
    dm.set_defaults(func=lambda ns: __import__("kvfleet.demo", fromlist=["run"]).run(ns))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except InventoryError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"kvfleet: {exc}", file=sys.stderr)
        return 2
    except KvfleetError as exc:
        print(f"kvfleet: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
