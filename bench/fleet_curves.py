"""Part 3 of bench/fleet_scale.py: scaling curves of a rollout and of the hourly verification on the twin.

For each size ``CxE`` (C twin clusters × E endpoints per cluster):

1. a fleet file generated from the test suite's twin fleet (``tests/fleets/twin.yaml``): its two clusters are the
   templates (cluster i takes template i mod 2: the patch-mode production shape, then the kyverno stage shape),
   each with ``2 E + 2`` GPU nodes (two replicas per endpoint and a spare node for a surge), and its endpoints
   are the templates of that cluster's endpoints taken in turn (``<template>-<j>``): same LOBs, models, routing
   and workloads. Names and order are fixed, so two runs plan the same waves;
2. the sandbox in its own process (``python -m kvfleet_sandbox up``);
3. phase ``rollout``: ``kvfleet_rollout`` through ``dag.test()`` (``gate=verify``, no bake, ``wave_size``
   ``--wave-size``, no contention); phase ``verification``: ``kvfleet_hit_verification`` through ``dag.test()``
   (the DAG itself: scope, one ``verify_cluster`` and one ``advise`` per cluster, summary);
4. per phase: the wall time; the twin's request counters (the sandbox admin's ``GET /requests``, reset with
   ``POST /reset-requests`` before the phase) per endpoint; the rows each kvfleet history table gained during the
   phase (``count(*)`` before and after, per table); the bytes of the XCom values Airflow's ``xcom`` table holds
   for the run, per task; and, from the task-instance state log, the task seconds in ``running`` and the
   slot-seconds held while a task waited (deferred: target 0).

A gate left pending for 60 s (an inconclusive verification asks a human) is answered with its safe default and
the size is reported with ``gate_answered_by_bench``: its figures are then those of a run stopped by a gate.
"""

from __future__ import annotations

import collections
import copy
import itertools
import json
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
TWIN_FLEET = ROOT / "tests" / "fleets" / "twin.yaml"
ROLLOUT = "kvfleet_rollout"
VERIFICATION = "kvfleet_hit_verification"
MUTATING_VERBS = ("create", "update", "patch", "delete")
GATE_PATIENCE_S = 60.0


def parse_size(text: str) -> tuple[int, int]:
    """``"2x10"`` → (2, 10): clusters 1-10, endpoints per cluster 1-200."""
    c, sep, e = text.lower().partition("x")
    if not sep or not c.isdigit() or not e.isdigit():
        raise ValueError(f"--curves: {text!r} is not CxE (clusters x endpoints per cluster), e.g. 2x10")
    clusters, per = int(c), int(e)
    if not 1 <= clusters <= 10 or not 1 <= per <= 200:
        raise ValueError(f"--curves: {text!r}: clusters must be within 1-10 and endpoints per cluster within "
                         "1-200 (this machine holds no more), e.g. 2x10")
    return clusters, per


def fleet_yaml(clusters: int, per_cluster: int) -> str:
    """The twin fleet's shape at C clusters × E endpoints per cluster (module docstring)."""
    base = yaml.safe_load(TWIN_FLEET.read_text())
    templates = base["clusters"]
    out = {k: v for k, v in base.items() if k not in ("clusters", "endpoints")}
    out["clusters"], out["endpoints"] = [], []
    for i in range(clusters):
        tmpl = templates[i % len(templates)]
        c = copy.deepcopy(tmpl)
        c["name"] = name = f"twin-{i:02d}"
        c["gpu_nodes"] = {**c["gpu_nodes"], "count": 2 * per_cluster + 2}
        for addon in (c.get("addons") or {}).values():
            if "tlsCertificateS3Bucket" in (addon.get("configuration") or {}):
                addon["configuration"]["tlsCertificateS3Bucket"] = f"hyperpod-tls-{name}"
        out["clusters"].append(c)
        eps = [e for e in base["endpoints"] if e["cluster"] == tmpl["name"]]
        for j in range(per_cluster):
            e = copy.deepcopy(eps[j % len(eps)])
            e["name"], e["cluster"] = f"{e['name']}-{j:03d}", name
            out["endpoints"].append(e)
    return str(yaml.safe_dump(out, sort_keys=False, width=140))


# ---- what is counted --------------------------------------------------------------------------------------------
def admin(env: dict[str, str], path: str, post: bool = False) -> Any:
    req = urllib.request.Request(env["KVFLEET_SANDBOX_ADMIN"].rstrip("/") + path, method="POST" if post else "GET",
                                 data=b"{}" if post else None, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read() or b"null")


def api_calls(env: dict[str, str], endpoints: int) -> dict[str, Any]:
    """The twin's request counters since the last reset, in total and per endpoint."""
    got = admin(env, "/requests")
    verbs: collections.Counter[str] = collections.Counter()
    resources: collections.Counter[str] = collections.Counter()
    for c in got["clusters"].values():
        for key, n in c["counts"].items():
            verbs[key.split(" ", 1)[0]] += n
            resources[key] += n
    aws = collections.Counter(op.split(":", 1)[-1] for op in got["aws"]["operations"])
    k8s = sum(verbs.values())
    mutating = sum(n for v, n in verbs.items() if v in MUTATING_VERBS)
    aws_total = sum(aws.values())
    return {"k8s": k8s, "k8s_mutating": mutating, "aws": aws_total,
            "k8s_per_endpoint": round(k8s / endpoints, 1), "k8s_mutating_per_endpoint": round(mutating / endpoints, 1),
            "aws_per_endpoint": round(aws_total / endpoints, 2), "k8s_by_verb": dict(sorted(verbs.items())),
            "k8s_top": dict(resources.most_common(12)), "aws_by_operation": dict(sorted(aws.items()))}


def history_counts(engine: Any) -> dict[str, int]:
    """``count(*)`` of every kvfleet history table (the migrations' version table left out)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        tables = [r[0] for r in conn.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename NOT LIKE '%version%' "
            "ORDER BY tablename"))]
        return {t: int(conn.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one()) for t in tables}


def history_delta(before: dict[str, int], after: dict[str, int], endpoints: int) -> dict[str, Any]:
    delta = {t: after.get(t, 0) - before.get(t, 0) for t in after}
    delta = {t: d for t, d in delta.items() if d}
    total = sum(delta.values())
    return {"rows": total, "rows_per_endpoint": round(total / endpoints, 2), "by_table": delta,
            "per_endpoint_by_table": {t: round(d / endpoints, 2) for t, d in delta.items()}}


def xcom_bytes(url: str, dag_id: str, run_id: str) -> dict[str, Any]:
    """Bytes of the XCom values of one run (their JSON text), per task_id: total, task instances, max per TI."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT task_id, map_index, sum(octet_length(value::text)) AS b FROM xcom "
                "WHERE dag_id = :d AND run_id = :r GROUP BY task_id, map_index"), {"d": dag_id, "r": run_id}).all()
    finally:
        engine.dispose()
    per: dict[str, dict[str, int]] = {}
    for task_id, _map_index, b in rows:
        p = per.setdefault(task_id, {"bytes": 0, "task_instances": 0, "max_per_ti": 0})
        p["bytes"] += int(b or 0)
        p["task_instances"] += 1
        p["max_per_ti"] = max(p["max_per_ti"], int(b or 0))
    return {"total": sum(p["bytes"] for p in per.values()), "per_task": dict(sorted(per.items()))}


def running_per_task(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds in ``running`` per task_id (all its map indexes), from the state log."""
    by_ti: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        by_ti.setdefault((r["task_id"], r["map_index"]), []).append(r)
    out: dict[str, float] = collections.defaultdict(float)
    for (task_id, _m), seq in by_ti.items():
        for a, b in itertools.pairwise(seq):
            if a["state"] == "running":
                out[task_id] += b["at"].timestamp() - a["at"].timestamp()
    return {k: round(v, 2) for k, v in sorted(out.items())}


class GateWatchdog:
    """Answers a gate pending for more than GATE_PATIENCE_S with its safe default (Abort / Reject)."""

    def __init__(self) -> None:
        self.answered: list[str] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> GateWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        from kvfleet.airflow import hitl

        first_seen: dict[tuple[str, str, int], float] = {}
        while not self._done.wait(1.0):
            try:
                hitl.resume_stranded()  # a gate answered but left parked by dag.test
                for gate in hitl.pending():
                    key = (gate.run_id, gate.task_id, gate.map_index)
                    if time.monotonic() - first_seen.setdefault(key, time.monotonic()) > GATE_PATIENCE_S:
                        safe = "Abort" if "Abort" in gate.options else "Reject"
                        hitl.respond(gate, safe, "fleet-scale-bench")
                        self.answered.append(f"{gate.task_id}[{gate.map_index}]: {safe} ({gate.subject})")
            except Exception as exc:  # the watchdog must not die with one bad poll
                print(f"gate watchdog: {exc}", flush=True)


# ---- one size ---------------------------------------------------------------------------------------------------
def phase(name: str, dag_id: str, conf: dict[str, Any], *, env: dict[str, str], endpoints: int, dagbag: Any,
          states: Any, history_engine: Any, analyse: Callable[..., dict[str, Any]], log: Callable[[str], None],
          ) -> dict[str, Any]:
    admin(env, "/reset-requests", post=True)
    before = history_counts(history_engine)
    load_before = os.getloadavg()
    log(f"--- {name}: {dag_id} on {endpoints} endpoints (load {load_before[0]:.1f})")
    started = time.monotonic()
    with GateWatchdog() as gates:
        dr = dagbag.get_dag(dag_id).test(run_conf=conf)
    wall = time.monotonic() - started
    load_after = os.getloadavg()
    calls = api_calls(env, endpoints)
    hist = history_delta(before, history_counts(history_engine), endpoints)
    xcom = xcom_bytes(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], dag_id, dr.run_id)
    rows = states.rows(run_id=dr.run_id)
    waits = analyse(rows, {}, {}, 0.0)
    return {"phase": name, "dag_id": dag_id, "state": str(dr.state), "wall_s": round(wall, 1),
            "wall_s_per_endpoint": round(wall / endpoints, 2),
            "load_1m_before_after": [round(load_before[0], 1), round(load_after[0], 1)],
            "gate_answered_by_bench": gates.answered, "calls": calls, "history": hist, "xcom_bytes": xcom,
            "running_s_per_task": running_per_task(rows),
            **{k: v for k, v in waits.items() if k != "waits"},
            "waits_by_trigger": dict(collections.Counter(w["trigger"] or "(trigger row gone)"
                                                         for w in waits["waits"]))}


def curve_at(clusters: int, per_cluster: int, *, work: Path, dagbag: Any, states: dict[str, Any], wave_size: int,
             sandbox: Callable[..., tuple[dict[str, str], Callable[[], None]]],
             analyse: Callable[..., dict[str, Any]], log: Callable[[str], None]) -> dict[str, Any]:
    from kvfleet.history.db import get_engine

    endpoints = clusters * per_cluster
    fleet = work / f"curve-{clusters}x{per_cluster}.yaml"
    fleet.write_text(fleet_yaml(clusters, per_cluster))
    started = time.monotonic()
    env, down = sandbox(fleet, work / f"curve-sandbox-{clusters}x{per_cluster}",
                        timeout=180 + 6 * endpoints)
    up_s = time.monotonic() - started
    out: dict[str, Any] = {"size": f"{clusters}x{per_cluster}", "clusters": clusters,
                           "endpoints_per_cluster": per_cluster, "endpoints": endpoints,
                           "gpu_nodes_per_cluster": 2 * per_cluster + 2, "sandbox_up_s": round(up_s, 1),
                           "wave_size": wave_size}
    try:
        os.environ.update(env)
        os.environ["KVFLEET_POLL_SECONDS"] = "0.1"
        history_engine = get_engine()
        common = {"env": env, "endpoints": endpoints, "dagbag": dagbag, "history_engine": history_engine,
                  "analyse": analyse, "log": log}
        conf = {"fleet": str(fleet), "lobs": [], "clusters": [], "endpoints": [], "dry_run": False,
                # dag.test() runs one task at a time and a deferred task's trigger in line: with fewer parallel
                # slots than clusters, a cluster waiting for a slot would block the run until its patience ran
                # out, since the slot's holder cannot move meanwhile. Under a scheduler the default 4 applies.
                "wave_size": wave_size, "max_parallel_clusters": min(clusters, 64), "canary": True, "bake_minutes": 0,
                "gate": "verify", "approval": "none", "lock_wait_minutes": 10}
        out["rollout"] = phase("rollout", ROLLOUT, conf, states=states[ROLLOUT], **common)
        log(json.dumps(brief(out["rollout"])))
        conf = {"fleet": str(fleet), "lobs": [], "clusters": [], "endpoints": [], "prompt_tokens": 2000,
                "sweep": False}
        out["verification"] = phase("verification", VERIFICATION, conf, states=states[VERIFICATION], **common)
        log(json.dumps(brief(out["verification"])))
    finally:
        down()
    return out


def brief(p: dict[str, Any]) -> dict[str, Any]:
    return {"phase": p["phase"], "state": p["state"], "wall_s": p["wall_s"],
            "k8s_per_endpoint": p["calls"]["k8s_per_endpoint"], "aws_per_endpoint": p["calls"]["aws_per_endpoint"],
            "history_rows_per_endpoint": p["history"]["rows_per_endpoint"], "xcom_bytes": p["xcom_bytes"]["total"],
            "held_while_waiting": p["slot_seconds_held_while_waiting"], "load": p["load_1m_before_after"]}


def print_curves(curves: list[dict[str, Any]]) -> None:
    print(f"\n{'size':>7}{'phase':>14}{'state':>9}{'wall s':>8}{'k8s/ep':>8}{'k8s mut/ep':>11}{'aws/ep':>8}"
          f"{'rows/ep':>9}{'xcom B':>9}{'deferrals':>10}{'held s':>8}{'load':>12}")
    for c in curves:
        for name in ("rollout", "verification"):
            p = c.get(name)
            if not p:
                continue
            k = p["calls"]
            print(f"{c['size']:>7}{name:>14}{p['state']:>9}{p['wall_s']:>8}{k['k8s_per_endpoint']:>8}"
                  f"{k['k8s_mutating_per_endpoint']:>11}{k['aws_per_endpoint']:>8}"
                  f"{p['history']['rows_per_endpoint']:>9}{p['xcom_bytes']['total']:>9}{p['deferrals']:>10}"
                  f"{p['slot_seconds_held_while_waiting']:>8}{p['load_1m_before_after']!s:>12}")
