"""Task bodies of the hourly `kvfleet_hit_verification` DAG: stage 5 on every managed endpoint, per cluster.

Called from ``dags/kvfleet_hit_verification.py``. Each mapped task verifies the endpoints of one cluster, in
batches: one read of the cluster's pods gives each endpoint's nodes, ``fleet.verify_batches`` puts
endpoints whose pods share no node in the same batch, the endpoints of a batch are verified at the same time (a
thread pool of at most ``max_parallel``), and the batches run one after another — endpoints that share a node are
never probed together, since one probe's prefill would disturb the TTFT the other measures. Every result is
recorded in the history store as before (one ``verify:<endpoint>:<tokens>`` row each) and returned in inventory
order. The summary logs one table per LOB.

Threads share the task's StageContext: its Kubernetes ``ApiClient`` (built before the pool starts, in this
thread: ``cached_property`` builds it without a lock) makes synchronous calls through one urllib3 ``PoolManager``,
which is thread-safe, and keeps no per-call state but the unused ``last_response``; the token refresh holds
``ClusterAccess._lock``; the history store's SQLAlchemy engine is thread-safe (one pooled connection per
transaction, the repositories keep none). Each thread has its own ``Verification``, prompt and log reads.

Probes draw their prompts from the bounded rotating pool (``verify.ProbePool``: the L2 footprint of a day of
probes stays bounded, bench/probe_footprint.py). Sweep rows carry ``detail.sweep``; an endpoint's first full-hit
sweep after its last rollout is its baseline (``verdict.baseline_from_rows``), passed to every probe.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY

from kvfleet.airflow.boundary import task_boundary
from kvfleet.airflow.context import narrowed, pin_inventory, run_info, stage_context
from kvfleet.errors import PermanentError
from kvfleet.fleet.inventory import Endpoint
from kvfleet.fleet.verdict import baseline_from_rows
from kvfleet.history.clusters import filter_values
from kvfleet.history.keys import StepEvent
from kvfleet.history.repos import HistoryRepos
from kvfleet.history.runs import Runs
from kvfleet.stages import verify
from kvfleet.stages.base import StageContext

# Endpoints of one batch verified at the same time (the DAG's ``max_parallel`` Param: 1 to MAX_PARALLEL_LIMIT).
# A batch of node-disjoint endpoints holds at most half the cluster's GPU nodes (two pods per endpoint).
DEFAULT_MAX_PARALLEL = 8
MAX_PARALLEL_LIMIT = 32

# The sweep rows of one endpoint since its last rollout: stage 4 ("endpoint") changing it in any run.
_BASELINE_SQL = """
SELECT v.run_key, v.at, v.prompt_tokens, v.speedup, v.hit_ratio
FROM hit_verifications v
WHERE v.cluster = ANY(:clusters) AND v.endpoint = :endpoint AND v.detail ->> 'sweep' = 'true'
  AND COALESCE(v.detail ->> 'cold', 'true') = 'true'
  AND v.at > COALESCE((SELECT max(e.at) FROM step_events e WHERE e.cluster = ANY(:clusters) AND e.endpoint = :endpoint
                       AND e.stage = 'endpoint' AND e.outcome = 'changed'), '-infinity'::timestamptz)
ORDER BY v.at, v.id
"""


def endpoint_baseline(history: HistoryRepos | None, cluster: str, endpoint: str) -> dict[str, Any] | None:
    """The endpoint's recorded baseline (its first full-hit sweep after its last rollout), or ``None``.
    ``cluster``: its key, or a bare name (``kvfleet.history.clusters``)."""
    if history is None:
        return None
    clusters = filter_values(history.engine, cluster)
    with history.engine.connect() as conn:
        stmt = text(_BASELINE_SQL).bindparams(bindparam("clusters", type_=ARRAY(Text)))
        rows = [dict(r) for r in conn.execute(stmt, {"clusters": clusters, "endpoint": endpoint}).mappings()]
    return baseline_from_rows(rows)

log = logging.getLogger(__name__)


@task_boundary
def open_run(params: dict[str, Any]) -> list[str]:
    from kvfleet.fleet.pinning import inventory_of

    info = run_info()
    pinned = pin_inventory(params["fleet"])
    history = HistoryRepos.on()  # the run pinned before its scope is judged (a refusal's notification reads it)
    history.runs.start(info.run_key, dag_id=info.dag_id, run_id=info.run_id, trigger=info.trigger,
                      triggered_by=info.triggered_by, params=params, inventory=pinned)
    inv = narrowed(inventory_of(pinned), lobs=params.get("lobs"), clusters=params.get("clusters"),
                   endpoints=params.get("endpoints"))
    verify.check_prompt_length(int(params["prompt_tokens"]), inv.settings.chunk_size)
    history.runs.record_step(info.step_key, StepEvent("scope", "verify", "planned", detail={
        "endpoints": len(inv.endpoints), "inventory": pinned.revision}), actor=info.actor)
    return sorted({c.key for c in inv.clusters if inv.endpoints_of(c.key)})


def check_max_parallel(value: Any) -> int:
    """The ``max_parallel`` Param as an int in range, or a PermanentError naming field, value, range and fix."""
    if isinstance(value, float) and value.is_integer():  # JSON's 8.0: Airflow's integer Param accepts it
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLEL_LIMIT:
        raise PermanentError(f"max_parallel: {value!r} is not an integer from 1 to {MAX_PARALLEL_LIMIT} (endpoints of "
                             f"one cluster verified at the same time); use e.g. {DEFAULT_MAX_PARALLEL}, or 1 to "
                             "verify one endpoint at a time")
    return value


@task_boundary
def verify_cluster(cluster: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    sweep = bool(params.get("sweep"))
    lengths = verify.SWEEP_LENGTHS if sweep else (int(params["prompt_tokens"]),)
    max_parallel = check_max_parallel(params.get("max_parallel", DEFAULT_MAX_PARALLEL))
    # a sweep (on demand, rare) probes with fresh documents: its speeds may become the baseline. The pool is
    # stateless (frozen), so one is shared by every probe of the task.
    pool = None if sweep else verify.ProbePool()
    ctx = stage_context(cluster, params)
    try:
        return verify_endpoints(ctx, list(ctx.inventory.endpoints_of(cluster)), lengths, sweep=sweep, pool=pool,
                                max_parallel=max_parallel)
    finally:
        ctx.close()


def verify_endpoints(ctx: StageContext, endpoints: Sequence[Endpoint], lengths: Sequence[int], *, sweep: bool,
                     pool: verify.ProbePool | None, max_parallel: int = DEFAULT_MAX_PARALLEL) -> list[dict[str, Any]]:
    """Verify ``endpoints`` (of ``ctx``'s cluster) in node-disjoint batches, recording each result; the rows for the
    summary, in the order of ``endpoints``. An endpoint whose verification raises does not stop the others of its
    batch (each is recorded); the first error in inventory order is raised once the batch is done, and no later
    batch starts (as before, when the loop stopped there)."""
    rows = verify.in_node_batches(ctx, endpoints, lambda ep: _verify_one(ctx, ep, lengths, sweep, pool),
                                  max_parallel=max_parallel)
    return [r for ep in endpoints for r in rows[ep.key]]


def _verify_one(ctx: StageContext, ep: Endpoint, lengths: Sequence[int], sweep: bool,
                pool: verify.ProbePool | None) -> list[dict[str, Any]]:
    """Stage 5 on one endpoint at each length, each result recorded (``verify:<endpoint>:<tokens>``)."""
    out = []
    baseline = endpoint_baseline(ctx.history, ctx.cluster.key, ep.key)
    for n in lengths:
        result = verify.verify_endpoint(ctx, ep, n, pool=pool, baseline=baseline).as_dict()
        result["detail"] = {**(result.get("detail") or {}), "sweep": sweep}
        if ctx.history is not None and ctx.step_key is not None:
            ctx.history.verifications.record(ctx.step_key, f"verify:{ep.key}:{n}", result)
        log.info("%s %s tokens: %s hit %s speedup %s (expected %s) %s", ep.ref, n, result["verdict"],
                 result["hit_ratio"], result["speedup"], result["expected_speedup"], result.get("diagnosis") or "")
        out.append({k: result[k] for k in ("cluster", "endpoint", "lob", "prompt_tokens", "verdict", "hit_ratio",
                                           "speedup", "expected_speedup", "diagnosis")})
    return out


@task_boundary
def summarize(results: list[list[dict[str, Any]]] | None) -> dict[str, Any]:
    info = run_info()
    rows = [r for per_cluster in results or [] for r in per_cluster]
    by_lob: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_lob.setdefault(r["lob"], []).append(r)
    for lob in sorted(by_lob):
        lines = [f"{'endpoint':<36}{'tokens':>8}{'verdict':>14}{'hit':>7}{'speedup':>9}{'expected':>10}  diagnosis"]
        for r in sorted(by_lob[lob], key=lambda r: (r["cluster"], r["endpoint"], r["prompt_tokens"] or 0)):
            lines.append(f"{r['cluster'] + ':' + r['endpoint']:<36}{r['prompt_tokens'] or '-':>8}{r['verdict']:>14}"
                         f"{r['hit_ratio'] if r['hit_ratio'] is not None else '-':>7}"
                         f"{r['speedup'] if r['speedup'] is not None else '-':>9}{r['expected_speedup']:>10}  "
                         f"{r['diagnosis'] or ''}")
        log.info("LOB %s\n%s", lob, "\n".join(lines))
    verdicts = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("pass", "degraded", "fail", "unverifiable")}
    Runs().end(info.run_key, "success", {"verdicts": verdicts, "lobs": sorted(by_lob)})
    return verdicts


@task_boundary
def advise_cluster(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    """The L2 advisor for one cluster (read-only), recorded as a step so `kvfleet audit` and the kvfleet page
    can show it; the scale-out DAG's detection reads the capacity recommendation from here."""
    from kvfleet.stages import advise

    ctx = stage_context(cluster, params)
    try:
        # each endpoint's recorded sweep (its baseline) is its measured curve; the others use the published one.
        # advise_cluster reads each endpoint's previous observation from ctx.history (the last advise:<cluster>
        # step's detail.endpoints[].observation): the request rate is the counters' increase since then
        baselines = {ep.key: endpoint_baseline(ctx.history, ctx.cluster.key, ep.key)
                     for ep in ctx.inventory.endpoints_of(cluster)}
        report = advise.advise_cluster(ctx, sweeps={k: b["points"] for k, b in baselines.items() if b})
    finally:
        ctx.close()
    doc = report.as_dict()
    for e in report.endpoints:
        log.info("%s %s: %s (%s)", cluster, e.endpoint, e.verdict, " | ".join(e.arithmetic))
    if report.capacity:
        log.info("%s capacity: %s %s", cluster, report.capacity.recommendation, " | ".join(report.capacity.arithmetic))
    if ctx.history is not None and ctx.step_key is not None:
        ctx.record(f"advise:{cluster}", "advise", "reported",
                   verdicts={e.endpoint: e.verdict for e in report.endpoints},
                   endpoints=doc["endpoints"],  # the `kvfleet advise --json` shape (docs/advise.md), lengths included
                   capacity=doc["capacity"], errors=report.errors)
    return {"cluster": cluster, "verdicts": {e.endpoint: e.verdict for e in report.endpoints},
            "capacity": (report.capacity.recommendation if report.capacity else None)}
