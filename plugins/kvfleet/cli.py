"""The `kvfleet` command: validate, plan, audit, db, gate, freeze, stop, sandbox.

Entry point declared in pyproject.toml. Every subcommand works without Airflow running; `audit` and `db` use
the history database (embedded PostgreSQL when none is configured). Exit codes: 0 ok, 2 invalid input
(inventory, arguments, a bad ``KVFLEET_*`` setting), 1 anything else that failed (`audit verify` on a broken chain).
An error is one line on stderr, never a traceback (KVFLEET_DEBUG=1 shows it). `--json` prints JSON alone on stdout; logs
and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from kvfleet.errors import HistoryConfigError, HistoryUnreachable, InventoryError, KvfleetError
from kvfleet.fleet.inventory import InventoryWarning, load_inventory
from kvfleet.fleet.plan import make_plan, render_plan_text
from kvfleet.settings import ConfigError, load_settings

if TYPE_CHECKING:
    from kvfleet.clients.identity import Identity
    from kvfleet.fleet.inventory import Cluster, Inventory
    from kvfleet.history.repos import HistoryRepos

FLEET_HELP = "the fleet inventory YAML (default: $KVFLEET_FLEET, else fleet.example.yaml)"
# The same range as the kvfleet_rollout DAG Param `wave_size` (kvfleet.airflow.params; a unit test keeps them equal).
WAVE_SIZE_RANGE = (1, 500)
LIMIT_RANGE = (1, 100_000)


class UsageError(Exception):
    """Bad input found after parsing: exit 2 with this one line."""


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block) and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def _int_in(name: str, lo: int, hi: int) -> Any:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} {raw!r} is not a whole number ({lo}–{hi})") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} {value} is out of range: use {lo}–{hi}")
        return value

    return parse


def _matching(name: str, pattern: str, what: str) -> Any:
    import re

    rule = re.compile(pattern, re.ASCII)

    def parse(raw: str) -> str:
        if not rule.fullmatch(raw):
            raise argparse.ArgumentTypeError(f"{name} {raw[:80]!r} is not {what}")
        return raw

    return parse


def _identity_options(parser: argparse.ArgumentParser) -> None:
    """``--aws-conn-id`` / ``--profile``: the base identity, resolved as the DAGs resolve theirs
    (``kvfleet.clients.identity``): each cluster's account role is assumed from it."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--aws-conn-id", type=_matching("--aws-conn-id", r"[A-Za-z0-9_.-]{1,250}",
                                                       "an Airflow connection id (letters, digits, '_', '.', '-')"),
                       default=None, help="the Airflow AWS connection to act as, as a run's aws_conn_id (default: "
                                          "aws_default, as the DAGs; without it, the environment's credentials)")
    group.add_argument("--profile", type=_matching("--profile", r"[\w+=,.@-]{1,64}", "an AWS profile name"),
                       default=None, help="an AWS profile (~/.aws/config) to act as, instead of a connection")


def _identity(args: argparse.Namespace, command: str) -> Callable[[Inventory, Cluster], Identity]:
    """Each cluster's identity for a CLI command, from ``--aws-conn-id`` / ``--profile``: a connection that does
    not exist is a usage error (never a silent fall back to other credentials)."""
    from kvfleet.clients.identity import identity_for

    conn_id, profile = getattr(args, "aws_conn_id", None), getattr(args, "profile", None)
    if profile:
        import boto3
        from botocore.exceptions import ProfileNotFound

        try:
            boto3.session.Session(profile_name=profile)
        except ProfileNotFound:
            raise UsageError(f"--profile {profile}: no such AWS profile in the AWS config files (~/.aws/config, "
                             "~/.aws/credentials, or AWS_CONFIG_FILE); name one of them, or use "
                             "--aws-conn-id") from None
    elif not conn_id:
        conn_id = "aws_default"  # the DAGs' base identity (without that connection: the environment's credentials)
    if conn_id and conn_id != "aws_default":
        from airflow.sdk.bases.hook import BaseHook

        try:
            BaseHook.get_connection(conn_id)
        except Exception as exc:  # AirflowNotFoundException, or a secrets backend that cannot answer
            raise UsageError(f"--aws-conn-id {conn_id}: no such Airflow connection ({type(exc).__name__}); define "
                             f"it (AIRFLOW_CONN_{conn_id.upper().replace('.', '_').replace('-', '_')}, or `airflow "
                             "connections add`), or leave the option out for aws_default (without it, the "
                             "environment's AWS credentials)") from None
    return lambda inv, cl: identity_for(inv, cl, conn_id=conn_id, profile=profile, run=("kvfleet_cli", command))


def _float_in(name: str, lo: float, hi: float) -> Any:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} {raw[:40]!r} is not a number ({lo}–{hi})") from None
        if not lo <= value <= hi:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"{name} {value} is out of range: use {lo}–{hi}")
        return value

    return parse


def _since(raw: str) -> str:
    from kvfleet.history.queries import since_to_timedelta

    try:
        since_to_timedelta(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--since: ")) from None
    return raw


_STDOUT: list[Any] = []  # the real stdout while a command runs with sys.stdout pointed at stderr


def _out(*values: Any, **kwargs: Any) -> None:
    """Print a command's result: on the real stdout, where only results go."""
    print(*values, file=_STDOUT[-1] if _STDOUT else sys.stdout, **kwargs)


def _print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    if not rows:
        _out("(none)")
        return
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    _out("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        _out("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


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


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _json_dump(rows: Any) -> None:
    _out(json.dumps(rows, default=_json_default, indent=2, sort_keys=True))


# ---- validate / plan ---------------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InventoryWarning)
        inv = load_inventory(args.fleet)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    # warnings: patch on a production cluster, fewer Curvine workers than GPU nodes, routing against the
    # workload, a model kvfleet cannot size; refusals (a model that does not fit, hash_seed) raised above, exit 2
    if args.json:
        _json_dump({"source": inv.source, "warnings": list(inv.warnings), **inv.model_dump(mode="json")})
        return 0
    noted = f"; {len(caught)} warning(s) on stderr" if caught else ""
    _out(f"{args.fleet}: valid — {len(inv.lobs)} LOBs, {len(inv.clusters)} clusters, "
          f"{len(inv.endpoints)} endpoints{noted}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """The inventory's JSON Schema, generated from the model (kvfleet.fleet.inventory.schema)."""
    from kvfleet.fleet.inventory.loader import json_schema

    _out(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    inv = load_inventory(args.fleet).select(lobs=args.lob, clusters=args.cluster)
    plan = make_plan(inv, wave_size=args.wave_size, canary=not args.no_canary)
    if args.diff:
        from kvfleet.stages.dry_run import print_fleet_diff

        return print_fleet_diff(inv, plan, identity=_identity(args, "plan"))
    if args.json:
        _json_dump(plan.as_dict())
    else:
        _out(render_plan_text(plan))
    return 0


# ---- audit ---------------------------------------------------------------------------------------------------


def _history() -> HistoryRepos:
    from kvfleet.history.repos import HistoryRepos

    return HistoryRepos.on()


def _reading() -> HistoryRepos:
    """The history as its reader role (``kvfleet.history.db.reader_url``): what `kvfleet audit` reads with."""
    from kvfleet.history.db import reader_engine
    from kvfleet.history.repos import HistoryRepos

    return HistoryRepos.on(reader_engine())


def _cutoff(since: str | None) -> datetime | None:
    from kvfleet.history.queries import since_cutoff

    return None if since is None else since_cutoff(since, datetime.now(UTC))


Table = tuple[list[dict[str, Any]], list[str]]


def _runs(h: Any, args: argparse.Namespace) -> Table:
    rows = h.queries.rows("recent_runs", cutoff=_cutoff(args.since), limit=args.limit)
    if not args.json:  # the table shows the inventory as a person reads it; --json keeps the three columns
        for r in rows:
            r["inventory"] = _revision(r["inventory_sha256"], r["inventory_commit"], r["inventory_dirty"])
    return rows, ["started_at", "dag_id", "run_id", "trigger", "triggered_by", "status", "changed", "unchanged",
                  "failed", "planned", "unknown_changes", "inventory", "reason"]


def _revision(sha256: str | None, commit: str | None, dirty: bool | None) -> str | None:
    """``1a2b3c4d5e6f@0123456789ab`` (digest, then commit; ``+dirty`` when the file had uncommitted changes)."""
    if not sha256:
        return None
    return sha256[:12] + (f"@{commit[:12]}" + ("+dirty" if dirty else "") if commit else "")


def _paged(h: Any, args: argparse.Namespace, name: str, **binds: Any) -> list[dict[str, Any]]:
    """One page (--limit rows after --after) of a keyset-paged query; its next cursor goes to ``args.next``."""
    try:
        rows, args.next = h.queries.page(name, limit=args.limit, after=args.after, **binds)
    except ValueError as exc:
        raise UsageError(f"kvfleet audit {args.what}: {exc}") from None
    return list(rows)


def _verifications(h: Any, args: argparse.Namespace) -> Table:
    rows = _paged(h, args, "verifications_page", cutoff=_cutoff(args.since), lob=args.lob, clusters=args.clusters,
                  endpoint=args.endpoint)
    return rows, ["at", "run", "cluster", "endpoint", "lob", "prompt_tokens", "hit_ratio", "ttft_cold_ms",
                  "ttft_warm_ms", "speedup", "expected_speedup", "verdict", "diagnosis"]


def _drift(h: Any, args: argparse.Namespace) -> Table:
    rows = _paged(h, args, "open_drift_page" if args.open else "drift_page", cutoff=_cutoff(args.since),
                  clusters=args.clusters)
    return rows, (["cluster", "lob", "endpoint", "kind", "severity", "field", "expected", "actual", "first_seen",
                   "last_seen"] + ([] if args.open else ["resolved_at", "resolution"])
                  + ["remediation_action", "remediation_outcome"])


def _gates(h: Any, args: argparse.Namespace) -> Table:
    rows = h.queries.rows("gate_decisions", cutoff=_cutoff(args.since), run_key=args.run, limit=args.limit)
    for r in rows:  # the table shows the verdicts at the moment of the answer as endpoint=verdict
        r["verifications_then"] = ", ".join(
            f"{e}={v.get('verdict')}" for e, v in sorted((r.get("verifications") or {}).items())) or None
    return rows, ["answered_at", "run_key", "cluster", "gate", "asked", "chosen", "decision", "answered_by",
                  "timed_out", "waited_s", "wave_verdict", "verifications_then"]


def _changes(h: Any, args: argparse.Namespace) -> Table:
    rows = h.queries.rows("write_ahead", cutoff=_cutoff(args.since), run_key=args.run, clusters=args.clusters,
                   endpoint=args.endpoint, limit=args.limit)
    return rows, ["at", "run_key", "cluster", "endpoint", "action", "target", "outcome", "outcome_at", "actor"]


def _endpoint(h: Any, args: argparse.Namespace) -> Table:
    if not args.endpoint:
        raise UsageError("kvfleet audit endpoint: --endpoint is required (namespace/name or name)")
    rows = h.queries.rows("endpoint_changes", endpoint=args.endpoint, cutoff=_cutoff(args.since))
    return rows, ["at", "cluster", "endpoint", "stage", "step", "outcome", "run_key", "run_status", "trigger",
                  "triggered_by"]


_PAGED = ("verifications", "drift")  # keyset-paged with --limit / --after (Queries.page)
PAGE_SIZE = 100
_TABLES = {"runs": _runs, "verifications": _verifications, "drift": _drift, "gates": _gates, "changes": _changes,
           "endpoint": _endpoint}


# Every filter option of `kvfleet audit` and the subcommands it narrows; any other subcommand refuses it (exit 2)
# rather than list every row. tests/e2e/test_cli_audit_filters.py runs each pair of the parser against this.
AUDIT_FILTERS: dict[str, tuple[str, ...]] = {
    "run": ("rollout", "gates", "changes", "inventory"),
    "since": ("runs", "verifications", "drift", "endpoint", "gates", "changes"),
    "limit": ("runs", "verifications", "drift", "gates", "changes"),
    "after": _PAGED,
    "lob": ("rollout", "verifications"),
    "endpoint": ("verifications", "endpoint", "changes"),
    "cluster": ("verifications", "drift", "curvine", "changes"),
    "open": ("drift",),
}
DEFAULT_SINCE = "7d"


def _refuse_foreign_filters(args: argparse.Namespace) -> None:
    """Exit 2 naming a filter given to a subcommand that does not narrow by it."""
    for dest, takers in AUDIT_FILTERS.items():
        value = getattr(args, dest)
        if value in (None, False) or args.what in takers:
            continue
        shown = f"--{dest}" if value is True else f"--{dest} {str(value)[:80]}"
        raise UsageError(f"kvfleet audit {args.what}: {shown} does not filter this listing; only "
                         f"{', '.join(takers)} take --{dest}: drop it or use one of those")


def _check_audit_args(args: argparse.Namespace) -> None:
    _refuse_foreign_filters(args)
    if args.since is None and not (args.what == "drift" and args.open):  # open drift: however old, by default
        args.since = DEFAULT_SINCE
    if args.what == "curvine" and not args.cluster:
        raise UsageError("kvfleet audit curvine: --cluster is required")
    if args.what == "inventory" and not args.run:
        raise UsageError("kvfleet audit inventory: --run is required (dag_id/run_id, as `kvfleet audit runs` lists "
                         "them)")
    if args.what == "endpoint" and not args.endpoint:
        raise UsageError("kvfleet audit endpoint: --endpoint is required (namespace/name or name)")
    if args.limit is None:  # a page of 100 for the paged listings, 50 rows for the others (as before)
        args.limit = PAGE_SIZE if args.what in _PAGED else 50


def _cluster_filter(h: Any, args: argparse.Namespace) -> list[str] | None:
    """What --cluster (a key account/region/name, or a bare name) asks of the history; exit 2 when it is
    ambiguous (the keys listed) or neither."""
    from kvfleet.history.clusters import filter_values

    try:
        return filter_values(h.engine, args.cluster)
    except ValueError as exc:
        raise UsageError(f"kvfleet audit {args.what}: {exc}") from None


def cmd_audit(args: argparse.Namespace) -> int:
    _check_audit_args(args)
    h = _reading()
    args.clusters = _cluster_filter(h, args)
    if args.what == "verify":
        return _audit_verify(h, args)
    if args.what == "rollout":
        return _audit_rollout(h, args)
    if args.what == "curvine":
        return _audit_curvine(h, args)
    if args.what == "inventory":
        return _audit_inventory(h, args)
    args.next = None
    rows, cols = _TABLES[args.what](h, args)
    if args.json:
        _json_dump(rows)
    else:
        _print_table(rows, cols)
    if args.next:  # JSON stays a list of rows on stdout; the cursor of the next page goes beside it
        line = f"next page: kvfleet audit {args.what} --after {args.next}"
        if args.json:
            print(json.dumps({"next": args.next}), file=sys.stderr)
        else:
            _out(line)
    return 0


def _audit_curvine(h: Any, args: argparse.Namespace) -> int:
    rows = h.queries.rows("curvine_history", clusters=args.clusters)
    caps = h.queries.rows("capacity_history", clusters=args.clusters)
    if args.json:
        _json_dump({"releases": rows, "capacity": caps})
        return 0
    _out(f"Curvine releases on {args.cluster} (format flags at every revision)")
    _print_table(rows, ["release", "revision", "chart_version", "status", "format_master", "format_worker",
                        "format_journal", "recorded_at", "run_key"])
    _out(f"\nCapacity snapshots on {args.cluster}")
    for c in caps:  # bytes as GiB for reading; --json keeps the bytes
        c["capacity_gib"] = None if c.get("capacity_bytes") is None else f"{c['capacity_bytes'] / 2**30:.0f}"
        c["fs_used_gib"] = None if c.get("fs_used_bytes") is None else f"{c['fs_used_bytes'] / 2**30:.2f}"
    _print_table(caps, ["at", "step", "phase", "capacity_gib", "fs_used_gib", "live_workers", "lost_workers",
                        "files_total", "run_key"])
    return 0


def _audit_inventory(h: Any, args: argparse.Namespace) -> int:
    """The inventory a run applied, as its first task pinned it (canonical JSON); exit 1 when it has none."""
    pinned = h.runs.pinned(args.run)
    if pinned is None:
        print(f"kvfleet audit inventory: run {args.run[:200]} has no pinned inventory (no such run, or one recorded "
              "before inventories were pinned); `kvfleet audit runs` lists the runs", file=sys.stderr)
        return 1
    if hashlib.sha256(pinned["body"].encode()).hexdigest() != pinned["sha256"]:
        print(f"kvfleet audit inventory: run {args.run[:200]}: the stored inventory does not match its digest "
              f"sha256:{pinned['sha256']}; the history store's copy was changed", file=sys.stderr)
        return 1
    body = json.loads(pinned["body"])
    if args.json:
        _json_dump({"run_key": args.run, "sha256": pinned["sha256"], "commit": pinned["commit"],
                    "dirty": pinned["dirty"], "source": pinned["source"], "inventory": body})
        return 0
    _out(f"# run {args.run}: {pinned['source']} sha256:{pinned['sha256']}"
         + (f" at {pinned['commit']}" + (" (the file had uncommitted changes)" if pinned["dirty"] else "")
            if pinned["commit"] else ""))
    _out(json.dumps(body, indent=2, sort_keys=True))
    return 0


def _audit_rollout(h: Any, args: argparse.Namespace) -> int:
    """Per-LOB table of one rollout run (the newest one unless --run is given)."""
    run_key = args.run
    if not run_key:
        last = h.queries.rows("last_run", dag_id="kvfleet_rollout")
        if not last:
            if args.json:
                _json_dump({"run_key": None, "lobs": []})
            else:
                _out("no kvfleet_rollout run recorded yet")
            return 0
        run_key = last[0]["run_key"]
    rows = h.queries.rows("rollout_by_lob", run_key=run_key, lob=args.lob)
    if args.json:
        _json_dump({"run_key": run_key, "lobs": rows})
        return 0
    _out(f"rollout {run_key}")
    _print_table(rows, ["lob", "moved", "unchanged", "skipped", "failed", "verified_pass", "verified_other",
                        "avg_hit_ratio", "avg_speedup", "avg_expected"])
    return 0


def _audit_verify(h: Any, args: argparse.Namespace) -> int:
    """Walk the audit log's hash chain; exit 1 naming the first broken row."""
    result = h.audit.verify_chain()
    if args.json:
        _json_dump(result)
    elif result["ok"]:
        head = result["head"]
        _out(f"audit chain intact: {result['rows']} row(s); head seq {head['seq']} hash {head['hash']}")
    if not result["ok"]:
        b = result["broken"]
        print(f"kvfleet audit verify: audit_log row id={b['id']} (seq {b['seq']}, event {b['event_key']}) is "
              f"broken: {b['problem']}", file=sys.stderr)
        return 1
    return 0


# ---- db ------------------------------------------------------------------------------------------------------


def _check_revision(migrate: Any, revision: str) -> None:
    from alembic.script import ScriptDirectory

    if revision in ("head", "base", "heads") or revision.lstrip("+-").isdigit():
        return
    script = ScriptDirectory.from_config(migrate._config())
    known = [r.revision for r in script.walk_revisions()]
    if revision not in known:
        raise UsageError(f"kvfleet db: unknown revision {revision!r}; known: base, "
                         f"{', '.join(reversed(known))}, head")


def cmd_db(args: argparse.Namespace) -> int:
    from alembic.util import CommandError

    from kvfleet.history import migrate
    from kvfleet.history.db import migration_url, new_engine

    if args.action == "downgrade" and not args.revision:
        raise UsageError("kvfleet db downgrade: name the revision to go down to (kvfleet db current shows where "
                         "the schema is); there is no default")
    if args.action == "downgrade" and args.revision == "base" and not args.drop_history:
        raise UsageError("kvfleet db downgrade base drops every history table, the audit log included; add "
                         "--drop-history to mean it (take a backup first: pg_dump)")
    if args.revision:
        _check_revision(migrate, args.revision)
    if args.action == "downgrade" and not args.yes:
        raise UsageError(f"kvfleet db downgrade {args.revision}: it drops what every revision above "
                         f"{args.revision} added, with its rows; add --yes to mean it (kvfleet db current shows where "
                         "the schema is)")
    url = migration_url()
    engine = new_engine(url)  # as the owner role when one is configured
    try:
        if args.action == "downgrade" and args.revision == "base":
            _out(f"exported every history table first: {_export_history(engine, url)}")
        _migrate(args, migrate, engine, url)
    except CommandError as exc:
        raise UsageError(f"kvfleet db {args.action}: {str(exc).splitlines()[0]}") from None
    finally:
        engine.dispose()
    return 0


def _export_history(engine: Any, url: str) -> Path:
    """Every table of the history, one CSV file each (PostgreSQL's COPY, with a header), in a new directory under
    the state directory: what `db downgrade base` drops, kept before it does. Any failure stops the downgrade."""
    from kvfleet.history.db import reachable
    from kvfleet.paths import state_dir

    out = state_dir() / f"history-export-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    out.mkdir(parents=True, exist_ok=False, mode=0o700)
    with reachable(url), engine.connect() as conn:
        tables = [r[0] for r in conn.exec_driver_sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")]
        cursor = conn.connection.driver_connection.cursor()
        try:
            for table in tables:
                with (out / f"{table}.csv").open("w", encoding="utf-8") as fh:
                    cursor.copy_expert(f'COPY public."{table}" TO STDOUT WITH (FORMAT csv, HEADER)', fh)
        finally:
            cursor.close()
    return out


def _migrate(args: argparse.Namespace, migrate: Any, engine: Any, url: str) -> None:
    from kvfleet.history.db import reachable

    with reachable(url):
        if args.action == "upgrade":
            migrate.upgrade(engine, args.revision or "head")
        elif args.action == "downgrade":
            migrate.downgrade(engine, args.revision)
        _out(f"history schema at revision {migrate.current_revision(engine) or '(empty)'} "
              f"(head {migrate.head_revision()})")


# ---- gates -------------------------------------------------------------------------------------------------
# `kvfleet gate` goes through Airflow's REST API as an authenticated user (never Airflow's database): the
# responder Airflow records is that user, and API-only users can answer gates.
API_URL_ENV, API_TOKEN_ENV, API_USER_ENV, API_PASSWORD_ENV = (
    "AIRFLOW_API_URL", "AIRFLOW_API_TOKEN", "AIRFLOW_API_USER", "AIRFLOW_API_PASSWORD")
API_TIMEOUT_S = 30.0


class AirflowApi:
    """The few calls of Airflow's REST API (``/api/v2``) that `kvfleet gate` makes, with a bearer token."""

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url, self.token = base_url.rstrip("/"), token

    @classmethod
    def from_env(cls) -> AirflowApi:
        base = os.environ.get(API_URL_ENV, "").strip()
        if not base:
            raise UsageError(f"kvfleet gate: no Airflow API configured: set {API_URL_ENV} (the api-server, e.g. "
                             f"http://127.0.0.1:8080) and {API_TOKEN_ENV}, or {API_USER_ENV} and {API_PASSWORD_ENV}")
        if not base.startswith(("http://", "https://")):
            raise UsageError(f"kvfleet gate: {API_URL_ENV}={base[:80]!r} is not an http(s) URL "
                             "(e.g. http://127.0.0.1:8080)")
        token = os.environ.get(API_TOKEN_ENV, "").strip()
        if token:
            return cls(base, token)
        user, password = os.environ.get(API_USER_ENV, ""), os.environ.get(API_PASSWORD_ENV, "")
        if not (user and password):
            raise UsageError(f"kvfleet gate: no credentials for {base}: set {API_TOKEN_ENV}, or {API_USER_ENV} "
                             f"and {API_PASSWORD_ENV}")
        answer = cls(base, "").request("POST", "/auth/token", {"username": user, "password": password})
        return cls(base, str(answer["access_token"]))

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import urllib.error
        import urllib.request

        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base_url + path, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=API_TIMEOUT_S) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise UsageError(f"kvfleet gate: Airflow answered {exc.code} {exc.reason} to {method} "
                             f"{path.split('?')[0]}: {_api_detail(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KvfleetError(f"cannot reach the Airflow API at {self.base_url}: {reason}") from None


def _api_detail(exc: Any) -> str:
    try:
        detail = json.loads(exc.read() or b"{}").get("detail")
    except (ValueError, AttributeError, OSError):
        detail = None
    text = detail if isinstance(detail, str) else json.dumps(detail) if detail else ""
    return (text or "no detail").replace("\n", " ")[:300]


def _quote(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


def pending_gates(api: AirflowApi, dag_id: str) -> list[dict[str, Any]]:
    """Gates of ``dag_id`` waiting for a human, oldest first (``GET .../dagRuns/~/hitlDetails``)."""
    answer = api.request("GET", f"/api/v2/dags/{_quote(dag_id)}/dagRuns/~/hitlDetails"
                                "?response_received=false&order_by=created_at&limit=100")
    return [d for d in answer.get("hitl_details") or []
            if (d.get("task_instance") or {}).get("state") == "awaiting_input"]


def respond_gate(api: AirflowApi, gate: dict[str, Any], option: str) -> dict[str, Any]:
    ti = gate["task_instance"]
    path = (f"/api/v2/dags/{_quote(ti['dag_id'])}/dagRuns/{_quote(ti['dag_run_id'])}/taskInstances/"
            f"{_quote(ti['task_id'])}/{int(ti['map_index'])}/hitlDetails")
    return dict(api.request("PATCH", path, {"chosen_options": [option], "params_input": {}}))


def cmd_gate(args: argparse.Namespace) -> int:
    """Rollout gates waiting for a human: list them, or answer one, through Airflow's REST API."""
    api = AirflowApi.from_env()
    gates = pending_gates(api, args.dag)
    if args.action == "list":
        if args.json:
            _json_dump([{"index": i, "dag_id": g["task_instance"]["dag_id"], "run_id": g["task_instance"]["dag_run_id"],
                         "task_id": g["task_instance"]["task_id"], "map_index": g["task_instance"]["map_index"],
                         "subject": g.get("subject"), "body": g.get("body"), "options": g.get("options"),
                         "created_at": g.get("created_at")} for i, g in enumerate(gates)])
            return 0
        if not gates:
            _out("no gate is waiting for a human")
        for i, g in enumerate(gates):
            ti = g["task_instance"]
            _out(f"[{i}] {ti['dag_run_id']} {ti['task_id']}[{ti['map_index']}]: {g.get('subject')}\n"
                 f"    options: {', '.join(g.get('options') or [])}")
            for line in (g.get("body") or "").splitlines():
                _out(f"    {line}")
        return 0
    if not gates:
        raise UsageError("kvfleet gate respond: no gate is waiting for a human")
    if args.index is None or not 0 <= args.index < len(gates):
        raise UsageError(f"kvfleet gate respond: --index must be one of 0..{len(gates) - 1} (see `kvfleet gate list`)")
    gate = gates[args.index]
    if args.option not in (gate.get("options") or []):
        raise UsageError(f"kvfleet gate respond: --option {args.option!r} is not one of "
                         f"{', '.join(gate.get('options') or [])} for this gate")
    answer = respond_gate(api, gate, args.option)
    who = (answer.get("responded_by") or {}).get("name") or "?"
    _out(f"answered {args.option!r} on {gate['task_instance']['task_id']}[{gate['task_instance']['map_index']}] "
         f"as {who}")
    return 0


# ---- freeze and emergency stop -------------------------------------------------------------------------------
# The holds live in the history (kvfleet.history.holds): each freeze, lift and stop is a row and an audit line.
# A scope named for `freeze on` and `stop` is checked against the fleet inventory (a typo would freeze nothing);
# `freeze off` names a freeze in force, whatever the inventory says now.


def _reason(raw: str) -> str:
    from kvfleet.history.holds import MAX_REASON, HoldError, checked_text

    try:
        return checked_text("the reason", raw, MAX_REASON)
    except HoldError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _by(raw: str) -> str:
    from kvfleet.history.holds import MAX_BY, HoldError, checked_text

    try:
        return checked_text("the user", raw, MAX_BY)
    except HoldError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _requester(args: argparse.Namespace, command: str) -> str:
    """--by, else KVFLEET_USER, else the OS login name."""
    if args.by:
        return str(args.by)
    import getpass

    try:
        who = load_settings().user or getpass.getuser()
    except (OSError, KeyError):  # no login name (a container's uid with no passwd entry)
        who = ""
    try:
        return _by(who)
    except argparse.ArgumentTypeError:
        raise UsageError(f"{command}: who is asking is unknown (no KVFLEET_USER, no login name {who[:40]!r} kvfleet "
                         "can record): pass --by USER") from None


def _hold_scope(args: argparse.Namespace, command: str, *, check: bool) -> Any:
    """The scope the options name. ``check``: a LOB or cluster must be one of the fleet inventory's (a cluster
    by its key, or a name only one cluster has, recorded as the key)."""
    from kvfleet.history.holds import ALL, CLUSTER, LOB, RUN, Scope

    if getattr(args, "run", None):
        return Scope(RUN, args.run)
    if args.all:
        return Scope(ALL)
    lob = getattr(args, "lob", None)
    if not check:
        return Scope(LOB, lob) if lob else Scope(CLUSTER, args.cluster)
    with warnings.catch_warnings():  # the inventory's advice about other things is not this command's business
        warnings.simplefilter("ignore", InventoryWarning)
        inv = load_inventory(args.fleet)
    if lob:
        lobs = [x.name for x in inv.lobs]
        if lob not in lobs:
            raise UsageError(f"{command}: --lob {lob[:100]!r} is not a line of business of {args.fleet}; "
                             f"choose one of: {', '.join(lobs)}")
        return Scope(LOB, lob)
    from kvfleet.fleet.cluster_ref import ambiguity, candidates

    found = candidates(args.cluster, inv.clusters)
    if len(found) != 1:
        raise UsageError(f"{command}: --cluster {ambiguity(args.cluster[:100], found)}" if found else
                         f"{command}: --cluster {args.cluster[:100]!r} is not a cluster of {args.fleet}; choose one "
                         f"of: {', '.join(c.key for c in inv.clusters)}")
    return Scope(CLUSTER, found[0].key)


def _frozen_scope(h: HistoryRepos, args: argparse.Namespace) -> Any:
    """`freeze off`'s scope: a cluster's bare name is the key of the one cluster freeze in force of that name."""
    from kvfleet.history.holds import CLUSTER, Scope

    scope = _hold_scope(args, "kvfleet freeze off", check=False)
    if scope.level == CLUSTER and "/" not in scope.name:
        keys = [f.scope.name for f in h.holds.active_freezes()
                if f.scope.level == CLUSTER and f.scope.name.rsplit("/", 1)[-1] == scope.name]
        if len(keys) > 1:
            raise UsageError(f"kvfleet freeze off: --cluster {scope.name!r} names {len(keys)} frozen clusters "
                             f"({', '.join(keys)}); write the cluster's key account/region/name")
        if keys:
            return Scope(CLUSTER, keys[0])
    return scope


def _print_hold(args: argparse.Namespace, hold: Any, line: str, **extra: Any) -> None:
    if args.json:
        _json_dump({**hold.as_dict(), **extra})
    else:
        _out(line)


def cmd_freeze(args: argparse.Namespace) -> int:
    """Freeze a scope (all, a LOB, a cluster), lift a freeze, or list the freezes in force."""
    from kvfleet.history.holds import HoldError

    command = f"kvfleet freeze {args.action}"
    if args.action == "list":
        return _freeze_list(_history(), args)
    if args.run:
        raise UsageError(f"{command}: --run: a freeze covers the whole fleet (--all), a LOB (--lob) or a cluster "
                         f"(--cluster), not a run; to halt run {args.run[:200]}: kvfleet stop --run {args.run[:200]} "
                         "--reason ...")
    by = _requester(args, command)
    scope = _hold_scope(args, command, check=True) if args.action == "on" else None
    h = _history()
    try:
        if scope is None:
            hold = h.holds.lift(_frozen_scope(h, args), args.reason, by)
            _print_hold(args, hold, f"lifted: {hold.message}")
            return 0
        before = {f.scope for f in h.holds.active_freezes()}
        hold = h.holds.freeze(scope, args.reason, by)
    except HoldError as exc:
        raise UsageError(f"{command}: {exc}") from None
    already = hold.scope in before
    _print_hold(args, hold, (f"already frozen (nothing recorded): {hold.message}" if already
                             else f"frozen: {hold.message}"), already=already)
    return 0


def _freeze_list(h: HistoryRepos, args: argparse.Namespace) -> int:
    freezes = h.holds.active_freezes()
    if args.json:
        _json_dump([f.as_dict() for f in freezes])
    elif not freezes:
        _out("nothing is frozen")
    else:
        _print_table([{"scope": f.scope.level, "target": f.scope.name or None, "by": f.by, "since": f.at,
                       "reason": f.reason, "lift with": f"kvfleet freeze off {f.scope.option} --reason ..."}
                      for f in freezes], ["scope", "target", "by", "since", "reason", "lift with"])
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """An emergency stop: the runs of the scope in flight now stop at their next safe point."""
    from kvfleet.history.holds import HoldError

    by = _requester(args, "kvfleet stop")
    scope = _hold_scope(args, "kvfleet stop", check=True)
    try:
        hold = _history().holds.stop(scope, args.reason, by)
    except HoldError as exc:
        raise UsageError(f"kvfleet stop: {exc}") from None
    _print_hold(args, hold, f"recorded: {hold.message}")
    _end_waiting_gates(hold, quiet=args.json)
    return 0


STOPPED_GATE_DAGS = ("kvfleet_rollout", "kvfleet_curvine_upgrade")  # the DAGs whose gates wait for a human


def _end_waiting_gates(hold: Any, *, quiet: bool) -> None:
    """A run of the stop's scope that waits at a gate would wait for its answer before its next safe point: with
    Airflow's REST API configured (``AIRFLOW_API_URL`` and credentials, as for `kvfleet gate`), each such gate is
    answered with its safe option (Abort, else Reject) as the stopping user's API identity; the gate sees the stop
    and the run ends ``stopped``. Without the API, or when Airflow refuses an answer, stderr says which gates still
    wait (answer them with `kvfleet gate respond`). Never fails the stop, which is recorded."""
    from kvfleet.history.holds import ALL, CLUSTER, RUN

    def covered(ti: dict[str, Any]) -> bool:
        return bool(hold.scope.level == ALL or (hold.scope.level == RUN and f"{ti['dag_id']}/{ti['dag_run_id']}"
                                            == hold.scope.name)
                or (hold.scope.level == CLUSTER and ti.get("rendered_map_index") == hold.scope.name))

    if not os.environ.get(API_URL_ENV, "").strip():
        print(f"kvfleet stop: a run waiting at a gate stays there until the gate is answered ({API_URL_ENV} is not "
              "set): kvfleet gate list, then kvfleet gate respond --option Abort (or Reject)", file=sys.stderr)
        return
    try:
        api = AirflowApi.from_env()
        waiting = [g for dag in STOPPED_GATE_DAGS for g in pending_gates(api, dag) if covered(g["task_instance"])]
    except KvfleetError as exc:
        print(f"kvfleet stop: the gates waiting could not be listed: {exc}", file=sys.stderr)
        return
    for g in waiting:
        ti, options = g["task_instance"], g.get("options") or []
        option = "Abort" if "Abort" in options else "Reject"
        where = f"{ti['dag_id']}/{ti['dag_run_id']} {ti['task_id']}[{ti['map_index']}]"
        try:
            respond_gate(api, g, option)
        except KvfleetError as exc:
            print(f"kvfleet stop: the gate {where} still waits: {exc}", file=sys.stderr)
            continue
        if not quiet:
            _out(f"answered {option} on {where}: it ends at the stop")


def _hold_options(parser: argparse.ArgumentParser, *, run: bool) -> None:
    """--reason, exactly one scope, --by, --fleet and --json: the options of `freeze on|off` and `stop`."""
    parser.add_argument("--reason", required=True, type=_reason,
                        help="why, in one line (required, at most 500 characters); recorded and shown to whoever "
                             "the hold refuses")
    scope = parser.add_mutually_exclusive_group(required=True)
    if run:
        scope.add_argument("--run", type=_matching("--run", r"[^/\s]{1,250}/\S{1,250}",
                                                   "a run key dag_id/run_id (as `kvfleet audit runs` lists them)"),
                           help="one run, by its run key dag_id/run_id")
    else:
        scope.add_argument("--lob", help="one line of business of the inventory")
        scope.add_argument("--run", help=argparse.SUPPRESS)  # refused by name: a run is stopped, not frozen
    scope.add_argument("--cluster", help="one cluster: its key account/region/name, or a name only one cluster has")
    scope.add_argument("--all", action="store_true", help="the whole fleet")
    parser.add_argument("--by", type=_by, default=None,
                        help="who asks (default: $KVFLEET_USER, else the OS login name)")
    parser.add_argument("--fleet", default=None, help=FLEET_HELP + "; a LOB or cluster is checked against it")
    parser.add_argument("--json", action="store_true", help="print the hold recorded as JSON")


def _add_hold_commands(sub: Any) -> None:
    fr = sub.add_parser("freeze", help="freeze kvfleet's mutating runs on the whole fleet, a LOB or a cluster, "
                                       "lift a freeze, or list the freezes in force (recorded in the history)")
    actions = fr.add_subparsers(dest="action", required=True)
    on = actions.add_parser("on", help="freeze a scope: no mutating run starts in it until the freeze is lifted")
    _hold_options(on, run=False)
    off = actions.add_parser("off", help="lift the freeze of a scope")
    _hold_options(off, run=False)
    ls = actions.add_parser("list", help="the freezes in force: scope, who, since when, why")
    ls.add_argument("--json", action="store_true")
    fr.set_defaults(func=cmd_freeze)
    st = sub.add_parser("stop", help="emergency stop: the runs of the whole fleet, a cluster or one run that are in "
                                     "flight now stop at their next safe point (a later run is not held)")
    _hold_options(st, run=True)
    st.set_defaults(func=cmd_stop)


# ---- parser --------------------------------------------------------------------------------------------------


def cmd_bootstrap(args: argparse.Namespace) -> int:
    """The kvfleet-bootstrap bundle of one cluster, for a cluster admin to apply (kvfleet.fleet.bootstrap_bundle)."""
    from kvfleet.fleet import bootstrap_bundle as bb
    from kvfleet.fleet.cluster_ref import ambiguity, candidates
    from kvfleet.paths import project_root

    inv = load_inventory(args.fleet)
    names = [c.name if [d.name for d in inv.clusters].count(c.name) == 1 else c.key for c in inv.clusters]
    found = candidates(args.cluster, inv.clusters) if args.cluster is not None else []
    if args.cluster is not None and len(found) != 1:
        raise UsageError(f"kvfleet bootstrap: --cluster {ambiguity(args.cluster[:100], found)}" if found else
                         f"kvfleet bootstrap: --cluster {args.cluster[:100]!r} is not a cluster of {args.fleet}; "
                         f"choose one of: {', '.join(names)}")
    if not args.print:
        raise UsageError("kvfleet bootstrap: kvfleet never applies the bundle itself (its own identity may not write "
                         "roles); print it and have a cluster admin apply it: "
                         + bb.apply_command(str(args.fleet), args.cluster or names[0]))
    if args.cluster is None and len(names) > 1:
        raise UsageError(f"kvfleet bootstrap: --cluster is required: the fleet {args.fleet} has {len(names)} "
                         f"clusters ({', '.join(names)}), and each gets its own bundle")
    cluster = found[0] if found else inv.clusters[0]
    rbac_dir = project_root() / "k8s" / "rbac"
    missing = [p.name for p in bb.runtime_role_files(rbac_dir, kyverno=True) if not p.is_file()]
    if missing:
        raise UsageError(f"kvfleet bootstrap: the runtime RBAC files {', '.join(missing)} are not in {rbac_dir}; "
                         "run it from a kvfleet checkout (the files are part of the source, not of the wheel)")
    kyverno_install = policy = None
    if cluster.l2_injection == "kyverno":
        from kvfleet.fleet.endpoint_spec import kyverno_policy
        from kvfleet.stages import kyverno

        kyverno_install = (f"cat > kyverno-values.yaml <<'EOF'\n{kyverno.values_yaml()}EOF\n"
                           f"{kyverno.install_command(load_settings())}")
        policy = kyverno_policy(inv.settings)
    namespaces = [e.namespace for e in inv.endpoints if e.on(cluster)]
    _out(bb.render_text(cluster, namespaces, rbac_dir, fleet=str(args.fleet), kyverno_install=kyverno_install,
                        policy=policy).rstrip("\n"))
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    from kvfleet.stages import preflight

    return preflight.cmd_preflight(args, out=_out, identity=_identity(args, "preflight"))


def cmd_advise(args: argparse.Namespace) -> int:
    """Does L2 pay off per endpoint, and is Curvine big enough per cluster: observed, read-only."""
    from kvfleet.stages import advise
    from kvfleet.stages.base import StageContext

    inv = load_inventory(args.fleet).select(clusters=args.cluster)
    identity = _identity(args, "advise")
    reports = []
    for cl in inv.clusters:
        ctx = StageContext(inventory=inv, cluster=cl, aws_conn_id=None, identity=identity(inv, cl),
                           progress=lambda msg: None)
        try:
            reports.append(advise.advise_cluster(ctx, threshold=args.threshold, retention_h=args.retention_hours))
        finally:
            ctx.close()
    if args.json:
        _out(json.dumps({"clusters": [r.as_dict() for r in reports]}, indent=2, sort_keys=True, default=str))
        return 0
    for r in reports:
        _out(f"== {r.cluster}")
        _print_table([{"endpoint": e.endpoint, "verdict": e.verdict, "req_per_h": e.requests_per_hour,
                       "mean_tokens": e.mean_prompt_tokens, "below_payoff": e.share_below_payoff,
                       "saved_ms": e.saved_ms_per_request, "saved_share": e.saved_fraction,
                       "working_set_gib": (round(e.working_set_bytes / 2**30, 2) if e.working_set_bytes is not None
                                           else "unknown")} for e in r.endpoints],
                     ["endpoint", "verdict", "req_per_h", "mean_tokens", "below_payoff", "saved_ms", "saved_share",
                      "working_set_gib"])
        for e in r.endpoints:
            _out(f"  {e.endpoint}: " + " | ".join(e.arithmetic))
        if r.capacity:
            _out(f"  capacity: {r.capacity.recommendation}" + (f" (+{r.capacity.add_workers} workers)"
                                                               if r.capacity.add_workers else "")
                 + " — " + " | ".join(r.capacity.arithmetic))
        for err in r.errors:
            _out(f"  could not read: {err}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvfleet", description="Tiered KV cache fleet manager for SageMaker HyperPod")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="validate a fleet inventory; exit 2 listing every problem")
    v.add_argument("--fleet", default=None, help=FLEET_HELP)
    v.add_argument("--json", action="store_true", help="print the validated inventory (defaults resolved) as JSON")
    v.set_defaults(func=cmd_validate)

    sc = sub.add_parser("schema", help="print the inventory's JSON Schema (generated from kvfleet's model)")
    sc.set_defaults(func=cmd_schema)

    pl = sub.add_parser("plan", help="print the rollout plan (stages per cluster, then waves)")
    pl.add_argument("--fleet", default=None, help=FLEET_HELP)
    pl.add_argument("--lob", action="append", help="restrict to a line of business (repeatable)")
    pl.add_argument("--cluster", action="append", help="restrict to a cluster (repeatable)")
    pl.add_argument("--wave-size", type=_int_in("--wave-size", *WAVE_SIZE_RANGE), default=None,
                    help=f"endpoints per cluster per wave ({WAVE_SIZE_RANGE[0]}–{WAVE_SIZE_RANGE[1]})")
    pl.add_argument("--no-canary", action="store_true", help="no canary wave")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--diff", action="store_true", help="observe the live fleet and print what would change")
    _identity_options(pl)
    pl.set_defaults(func=cmd_plan)

    pf = sub.add_parser("preflight", help="check each cluster's prerequisites; exit 1 listing what is missing "
                                          "and the fix")
    pf.add_argument("--fleet", default=None, help=FLEET_HELP)
    pf.add_argument("--cluster", action="append", help="restrict to a cluster (repeatable)")
    pf.add_argument("--json", action="store_true")
    pf.set_defaults(func=cmd_preflight)
    _identity_options(pf)

    bs = sub.add_parser("bootstrap", help="print the kvfleet-bootstrap bundle of a cluster (the roles, namespaces "
                                          "and Curvine RBAC a cluster admin applies once, before the first rollout)")
    bs.add_argument("--print", action="store_true", required=False,
                    help="print the bundle as YAML (pipe it to `kubectl apply -f -` as a cluster admin)")
    bs.add_argument("--fleet", default=None, help=FLEET_HELP)
    bs.add_argument("--cluster", default=None, help="the cluster whose bundle to print (required when the fleet has "
                                                     "more than one)")
    bs.set_defaults(func=cmd_bootstrap)

    ad = sub.add_parser("advise", help="does L2 pay off per endpoint, and how big must Curvine be (read-only)")
    ad.add_argument("--fleet", default=None, help=FLEET_HELP)
    ad.add_argument("--cluster", action="append", help="restrict to a cluster (repeatable)")
    ad.add_argument("--threshold", type=_float_in("--threshold", 0.05, 1.0), default=0.8,
                    help="recommend more Curvine workers above this share of capacity (0.05–1.0, default 0.8)")
    ad.add_argument("--retention-hours", type=_float_in("--retention-hours", 1.0, 720.0), default=24.0,
                    help="how long a prefix stays useful in L2 (1–720 h, default 24)")
    ad.add_argument("--json", action="store_true")
    ad.set_defaults(func=cmd_advise)
    _identity_options(ad)

    a = sub.add_parser("audit", help="query the history store")
    a.add_argument("what", choices=["runs", "rollout", "verifications", "drift", "curvine", "endpoint", "gates",
                                     "changes", "inventory", "verify"],
                   help="changes: write-ahead records; inventory: what a run applied, as it pinned it; verify: "
                        "check the audit log's hash chain")
    a.add_argument("--run", help="rollout, gates, changes, inventory (required): the run key (dag_id/run_id); "
                                 "rollout: default the newest")
    a.add_argument("--since", type=_since, default=None,
                   help="runs, verifications, drift, endpoint, gates, changes: 7d, 12h, 30m (at most 36500d; "
                        f"default {DEFAULT_SINCE}, drift --open: every open finding)")
    a.add_argument("--limit", type=_int_in("--limit", *LIMIT_RANGE), default=None,
                   help="rows per page for verifications and drift (default 100), per listing for runs, gates "
                        "and changes (default 50)")
    a.add_argument("--after", metavar="CURSOR", help="verifications, drift: the page after this cursor (the "
                                                     "'next' value the previous page printed)")
    a.add_argument("--lob", help="rollout, verifications: one line of business")
    a.add_argument("--endpoint", help="verifications, endpoint (required), changes: namespace/name or name")
    a.add_argument("--cluster", help="verifications, drift, curvine (required), changes: one cluster")
    a.add_argument("--open", action="store_true", help="drift: only findings open now")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_audit)

    d = sub.add_parser("db", help="history database migrations")
    d.add_argument("action", choices=["upgrade", "downgrade", "current"])
    d.add_argument("revision", nargs="?", help="upgrade: default head; downgrade: required")
    d.add_argument("--drop-history", action="store_true",
                   help="with `downgrade base`: really drop every history table, the audit log included (each table "
                        "is exported to CSV under the state directory first)")
    d.add_argument("--yes", action="store_true", help="downgrade: mean it (a downgrade drops what it goes below)")
    d.set_defaults(func=cmd_db)

    g = sub.add_parser("gate", help="rollout gates waiting for a human: list, respond (through Airflow's REST API: "
                                    f"{API_URL_ENV} and {API_TOKEN_ENV}, or {API_USER_ENV}/{API_PASSWORD_ENV})")
    g.add_argument("action", choices=["list", "respond"])
    g.add_argument("--dag", default="kvfleet_rollout")
    g.add_argument("--index", type=int, help="respond: which pending gate (from `gate list`)")
    g.add_argument("--option", default="Approve", help="respond: Approve | Skip endpoint | Abort | Reject")
    g.add_argument("--json", action="store_true", help="list: the pending gates as JSON")
    g.set_defaults(func=cmd_gate)

    _add_hold_commands(sub)

    sb = sub.add_parser("sandbox", help="the digital twin (up, down, status): runs `kvfleet-sandbox`, a separate "
                        "distribution that production installs do not carry", add_help=False)
    sb.add_argument("sandbox_args", nargs=argparse.REMAINDER)
    sb.set_defaults(func=cmd_sandbox)

    return p


def cmd_sandbox(args: argparse.Namespace) -> int:
    """Hand `kvfleet sandbox ...` to the twin's own command: kvfleet never imports the twin. The process is replaced
    (exec), so the PID, the signals and the exit status are the twin's, as if `kvfleet-sandbox` had been run."""
    if importlib.util.find_spec("kvfleet_sandbox") is None:
        print("kvfleet sandbox: the twin is not installed in this environment (it is the separate distribution "
              "kvfleet-sandbox: `pip install -e ./sandbox` in a checkout)", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "kvfleet_sandbox", *args.sandbox_args])


def _logs_to_stderr() -> None:
    """Logs (the embedded-PostgreSQL notice...) and warnings on stderr, whatever configured logging before."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) is sys.stdout:
            handler.setStream(sys.stderr)
    logging.captureWarnings(True)


def main(argv: Sequence[str] | None = None) -> int:
    _logs_to_stderr()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sandbox"]:  # everything after `sandbox`, --help included, belongs to the twin's command
        return cmd_sandbox(argparse.Namespace(sandbox_args=argv[1:]))
    args = build_parser().parse_args(argv)
    # Results go through _out to the real stdout; anything else that prints on sys.stdout meanwhile (Airflow's
    # structlog set up on import, a library's notice) lands on stderr, so `--json | python -m json.tool` works.
    # The sandbox command prints its own progress and keeps stdout.
    quiet = args.command in ("validate", "audit", "db", "gate", "bootstrap", "freeze", "stop") or (
        bool(getattr(args, "json", False)) and args.command != "sandbox")
    if quiet:
        _STDOUT.append(sys.stdout)
        sys.stdout = sys.stderr
    try:
        return _dispatch(args)
    finally:
        if quiet:
            sys.stdout = _STDOUT.pop()


def _dispatch(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()  # read now: a bad KVFLEET_* value exits 2, an unknown name is warned about
        if getattr(args, "fleet", "") is None:  # --fleet not given: the setting
            args.fleet = settings.fleet
        return int(args.func(args))
    except (InventoryError, ConfigError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except (HistoryConfigError, HistoryUnreachable) as exc:  # the history is misconfigured or does not answer
        print(f"kvfleet: {exc}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"kvfleet: {exc}", file=sys.stderr)
        return 2
    except KvfleetError as exc:
        print(f"kvfleet: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kvfleet: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # never a traceback for a user; KVFLEET_DEBUG=1 shows it
        if _debug():
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:500]
        print(f"kvfleet: {type(exc).__name__}: {first} (KVFLEET_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


def _debug() -> bool:
    try:
        return load_settings().debug
    except ConfigError:  # the error being reported comes first; a bad KVFLEET_DEBUG shows no traceback
        return False


if __name__ == "__main__":
    sys.exit(main())
