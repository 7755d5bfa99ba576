"""Every `kvfleet audit` filter narrows the rows of the subcommand it is given to, or the command exits 2 naming the
filter and the subcommands that take it: never accepted and ignored.

The pairs are read from the real argparse definition (every subcommand choice times every option of `audit`), so
a new filter or subcommand is tested as soon as it exists. The history holds rows of two LOBs on two clusters,
recent and 20 days old, in two rollout runs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import warnings
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from kvfleet.cli import build_parser, main
from kvfleet.fleet.inventory import InventoryWarning
from kvfleet.fleet.pinning import pin
from kvfleet.history.keys import StepEvent, StepKey
from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.e2e

NOT_FILTERS = {"help", "json", "what"}
# Each value filter: the value asked for, the other value seeded, and the row field it must match.
VALUE_FILTERS: dict[str, tuple[str, str, str]] = {
    "lob": ("retail", "claims", "lob"),
    "cluster": ("c1", "c2", "cluster"),
    "endpoint": ("retail/a", "claims/b", "endpoint"),
    "run": ("kvfleet_rollout/r1", "kvfleet_rollout/r2", "run_key"),
}
REQUIRED = {"curvine": "cluster", "endpoint": "endpoint", "inventory": "run"}  # a subcommand's own required filter
FLEET = Path(__file__).resolve().parents[1] / "fleets" / "twin.yaml"
ENDPOINTS = {"c1": ("retail/a", "retail"), "c2": ("claims/b", "claims")}


def _audit_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["audit"]


def _subcommands() -> list[str]:
    what = next(a for a in _audit_parser()._actions if a.dest == "what")
    return list(what.choices or ())


def _filters() -> list[argparse.Action]:
    return [a for a in _audit_parser()._actions if a.dest not in NOT_FILTERS]


def _pairs() -> list[Any]:
    return [pytest.param(w, a.dest, id=f"{w}-{a.option_strings[0]}") for w in _subcommands() for a in _filters()]


def _seed_run(history: HistoryRepos, run_id: str, at: datetime) -> None:
    run_key = f"kvfleet_rollout/{run_id}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InventoryWarning)
        pinned = pin(FLEET)
    history.runs.start(run_key, dag_id="kvfleet_rollout", run_id=run_id, trigger="manual", triggered_by="alice",
                       params={}, inventory=pinned)
    for cluster, (endpoint, lob) in ENDPOINTS.items():
        key = StepKey(run_key, f"{cluster}.wave_0", 0)
        history.runs.record_step(key, StepEvent(f"endpoint:{endpoint}", "endpoint", "changed", cluster=cluster,
                                                endpoint=endpoint, lob=lob))
        history.verifications.record(key, f"verify:0:{endpoint}", {"cluster": cluster, "endpoint": endpoint,
                                                                    "lob": lob, "verdict": "pass", "hit_ratio": 1.0,
                                                                    "speedup": 2.0})
        history.runs.record_step(StepKey(run_key, f"{cluster}.gate_0", 0), StepEvent(
            f"gate_response:{cluster}.gate_0", "gate", "continue", cluster=cluster,
            detail={"chosen": "Approve", "asked": "ask_review"}), actor="dana")
        history.audit.intent(key, "apply_iec", f"InferenceEndpointConfig {endpoint}", cluster=cluster,
                             endpoint=endpoint)
        history.drift.sync(cluster, [{"fingerprint": f"{cluster}|{run_id}", "kind": "patch_lost", "lob": lob,
                                      "endpoint": endpoint, "severity": "high", "object_ref": f"iec/{endpoint}"}],
                           run_key, scope_kinds=["patch_lost"])  # r2's check resolves r1's finding
        history.curvine.record(cluster=cluster, namespace="curvine", release="curvine",
                               revision=1 if run_id == "r1" else 2, chart_version="0.3.2", status="deployed",
                               flags={}, values={}, run_key=run_key)
        history.curvine.record_capacity(run_key=run_key, step="curvine_upgrade", cluster=cluster, phase="before",
                                        overview={"capacity": 2**30, "live_workers": 2})
    history.runs.close(run_key, "success")
    with history.engine.begin() as conn:  # the run's rows move back to ``at`` (the audit log's guard is lifted)
        conn.execute(text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only"))
        for table, col in (("runs", "started_at"), ("step_events", "at"), ("hit_verifications", "at"),
                           ("audit_log", "at"), ("capacity_snapshots", "at"), ("curvine_releases", "recorded_at")):
            conn.execute(text(f"UPDATE {table} SET {col} = :at WHERE run_key = :k"), {"at": at, "k": run_key})
        conn.execute(text("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only"))
        conn.execute(text("UPDATE drift_findings SET first_seen = :at, last_seen = :at WHERE first_run_key = :k"),
                     {"at": at, "k": run_key})


@pytest.fixture(scope="module")
def seeded_env(pg) -> Any:  # type: ignore[no-untyped-def]
    """One history for the module, per cluster: run r1 20 days ago, r2 an hour ago. r2's check resolved r1's
    finding and left its own open; a later check found one finding still open (last seen 20 days ago, as if
    that check had stalled since) and resolved one opened today."""
    import uuid

    from kvfleet.history.db import dispose_engines, get_engine
    from kvfleet.history.migrate import ensure_schema

    name = f"t_{uuid.uuid4().hex[:12]}"
    pg.ensure_database(name)
    url = pg.url(name)
    engine = get_engine(url)
    ensure_schema(engine)
    history = HistoryRepos.on(engine)
    now = datetime.now(UTC)
    _seed_run(history, "r1", now - timedelta(days=20))
    _seed_run(history, "r2", now - timedelta(hours=1))
    for cluster, (endpoint, lob) in ENDPOINTS.items():
        finding = {"kind": "operator_paused", "severity": "critical", "lob": lob, "endpoint": endpoint}
        history.drift.sync(cluster, [{**finding, "fingerprint": f"{cluster}|stale", "object_ref": "deployment/op"},
                                     {**finding, "fingerprint": f"{cluster}|today", "object_ref": "deployment/x"}],
                           "kvfleet_rollout/r2", scope_kinds=["operator_paused"])
        history.drift.sync(cluster, [{**finding, "fingerprint": f"{cluster}|stale", "object_ref": "deployment/op"}],
                           "kvfleet_rollout/r2", scope_kinds=["operator_paused"])
    with engine.begin() as conn:
        conn.execute(text("UPDATE drift_findings SET first_seen = :at, last_seen = :at WHERE fingerprint LIKE "
                          "'%|stale'"), {"at": now - timedelta(days=20)})
    yield {"KVFLEET_HISTORY_URL": url}
    dispose_engines()


def _run(env: dict[str, str], what: str, *args: str) -> tuple[int, Any, str]:
    """`kvfleet audit <what> <args> --json` through the CLI's entry point: exit code, stdout's JSON, stderr."""
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["audit", what, *args, "--json"])
            except SystemExit as exc:  # argparse's own errors
                code = int(exc.code or 0)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    return code, json.loads(out.getvalue()) if code == 0 else None, err.getvalue()


def _rows(what: str, out: Any) -> list[dict[str, Any]]:
    """The rows of one listing's JSON: a list, or a rollout's per-LOB lines (each with the run key), or curvine's
    releases and capacity snapshots."""
    if what == "rollout":
        return [{**r, "run_key": out["run_key"]} for r in out["lobs"]]
    if what == "curvine":
        return [*out["releases"], *out["capacity"]]
    if what in ("verify", "inventory"):
        return [out]
    return list(out)


def _ident(rows: list[dict[str, Any]]) -> set[str]:
    """The rows, comparable across calls (an open finding's age grows between them)."""
    return {json.dumps({k: v for k, v in r.items() if k != "open_for"}, sort_keys=True, default=str) for r in rows}


def _wide(env: dict[str, str], what: str, mode: list[str]) -> list[str]:
    """``--since 36500d`` (the whole history) where the listing takes it."""
    ok = _run(env, what, *_base(what, ()), *mode, "--since", "36500d")[0] == 0
    return ["--since", "36500d"] if ok else []


def _listing(env: dict[str, str], what: str, mode: list[str], *args: str) -> list[dict[str, Any]]:
    """One listing, asserted to succeed."""
    code, out, err = _run(env, what, *_base(what, args), *mode, *args)
    assert code == 0, err
    return _rows(what, out)


def _base(what: str, args: tuple[str, ...]) -> list[str]:
    """A subcommand's required filter, unless the arguments give it."""
    need = REQUIRED.get(what)
    if need is None or f"--{need}" in args:
        return []
    return [f"--{need}", VALUE_FILTERS[need][0]]


def _assert_refused(code: int, err: str, what: str, dest: str) -> None:
    """Exit 2, one line naming the filter and the subcommands that take it; each of those must then narrow."""
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    takers = re.search(rf"only ([a-z, ]+) take --{dest}\b", err)
    assert f"--{dest}" in err and takers, err
    assert what not in takers.group(1).split(", ")
    assert set(takers.group(1).split(", ")) <= set(_subcommands()), err


def _assert_narrows(env: dict[str, str], what: str, dest: str, mode: list[str]) -> None:
    if dest in VALUE_FILTERS:
        want, other, field = VALUE_FILTERS[dest]
        wide = _wide(env, what, mode)
        for value, absent in ((want, other), (other, want)):  # each value: its rows present, the other's absent
            rows = _listing(env, what, mode, *wide, f"--{dest}", value)
            assert rows, f"audit {what} {' '.join(mode)} --{dest} {value}: no rows"
            assert all(str(r.get(field)) == value for r in rows), (value, absent, rows)
    elif dest == "since":
        wide = _ident(_listing(env, what, mode, "--since", "36500d"))
        narrow = _ident(_listing(env, what, mode, "--since", "10d"))
        assert narrow and narrow < wide, (narrow, wide)
    elif dest == "limit":
        wide = _wide(env, what, mode)
        assert len(_listing(env, what, mode, *wide, "--limit", "1")) == 1
        assert len(_listing(env, what, mode, *wide, "--limit", "100")) > 1
    elif dest == "after":
        code, first, err = _run(env, what, *_base(what, ()), *mode, "--limit", "1")
        assert code == 0, err
        cursor = json.loads(err.strip().splitlines()[-1])["next"]
        second = _listing(env, what, mode, "--limit", "1", "--after", cursor)
        assert second and not _ident(second) & _ident(_rows(what, first))
    elif dest == "open":
        everything = _listing(env, what, [], "--since", "36500d")
        opened = _listing(env, what, ["--open"])
        assert opened and all("resolved_at" not in r or r["resolved_at"] is None for r in opened)
        resolved = {(r["cluster"], r["object_ref"], str(r["first_seen"])) for r in everything if r["resolved_at"]}
        assert resolved and not resolved & {(r["cluster"], r["object_ref"], str(r["first_seen"])) for r in opened}
    else:
        raise AssertionError(f"--{dest} is a new audit filter: teach this test how it narrows")


def _filter_args(env: dict[str, str], what: str, dest: str, mode: list[str]) -> list[str]:
    if dest in VALUE_FILTERS:
        return [f"--{dest}", VALUE_FILTERS[dest][0]]
    if dest == "after":  # a real cursor where the listing pages, else any
        code, _, err = _run(env, what, *_base(what, ()), *mode, "--limit", "1")
        nxt = err.strip().splitlines()[-1] if code == 0 and err.strip() else ""
        return ["--after", json.loads(nxt)["next"] if nxt.startswith("{") else "c2Vlbg"]
    return {"since": ["--since", "10d"], "limit": ["--limit", "1"], "open": ["--open"]}[dest]


@cache
def _switches(url: str, what: str) -> tuple[str, ...]:
    """The switches (store_true filters) ``what`` takes."""
    env = {"KVFLEET_HISTORY_URL": url}
    return tuple(a.option_strings[0] for a in _filters()
                 if a.nargs == 0 and _run(env, what, *_base(what, ()), a.option_strings[0])[0] == 0)


def _modes(env: dict[str, str], what: str, dest: str) -> list[list[str]]:
    """No mode, and each switch the subcommand takes, combined with the filter under test."""
    return [[]] + [[s] for s in _switches(env["KVFLEET_HISTORY_URL"], what) if s != f"--{dest}"]


@pytest.mark.parametrize(("what", "dest"), _pairs())
def test_each_audit_filter_narrows_or_is_refused(seeded_env: dict[str, str], what: str, dest: str) -> None:
    for mode in _modes(seeded_env, what, dest):
        code, _, err = _run(seeded_env, what, *_base(what, (f"--{dest}",)), *mode,
                            *_filter_args(seeded_env, what, dest, mode))
        if code == 2:
            _assert_refused(code, err, what, dest)
        else:
            assert code == 0, err
            _assert_narrows(seeded_env, what, dest, mode)


def test_the_filters_the_runbook_shows_narrow(seeded_env: dict[str, str]) -> None:
    """`audit rollout --lob` and `audit drift --open --cluster` (docs/runbook.md) are honoured, not refused."""
    lobs = _listing(seeded_env, "rollout", [], "--lob", "claims")
    assert [r["lob"] for r in lobs] == ["claims"]
    drift = _listing(seeded_env, "drift", ["--open"], "--cluster", "c2")
    assert drift and {r["cluster"] for r in drift} == {"c2"}
