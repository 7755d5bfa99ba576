"""Task bodies of the `kvfleet_drift_check` DAG: open the run, check each cluster (mapped, in parallel), summarise.

Called from ``dags/kvfleet_drift_check.py``. The per-cluster task never fails because its cluster is unreachable:
``stages.drift.check`` records that as a ``cluster_unreachable`` finding and returns, so one dead API server does
not hide the drift of the others. The summary prints the open findings per LOB and cluster from the history
store (the same rows ``kvfleet audit drift --open`` shows) and the advice of this run. A remediation that was
refused or failed fails the summary after it is recorded, so the run is red in Airflow (and ``failed`` in the
history, closed by ``kvfleet.airflow.run_status``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kvfleet.airflow.boundary import task_boundary
from kvfleet.airflow.context import narrowed, pin_inventory, run_info, stage_context
from kvfleet.errors import PermanentError
from kvfleet.fleet.cluster_ref import Named, candidates
from kvfleet.history.keys import StepEvent, StepKey
from kvfleet.history.repos import HistoryRepos
from kvfleet.outcomes import Status
from kvfleet.stages import drift

log = logging.getLogger(__name__)


def _params(params: dict[str, Any]) -> dict[str, Any]:
    # Drift is judged against the whole inventory of a cluster (an endpoint outside a LOB scope would otherwise
    # read as unmanaged), so only the cluster scope applies.
    return {"fleet": params["fleet"], "clusters": params.get("clusters") or [],
            "aws_conn_id": params.get("aws_conn_id")}


@task_boundary
def open_run(params: dict[str, Any], watch_errors: list[dict[str, str]] | None = None,
             event_clusters: list[str] | None = None) -> list[str]:
    """Start the run in the history and return the clusters to check: the Params' scope, or ``event_clusters``,
    those the drift watch's events named (``kvfleet_drift_watch``), less any the inventory no longer has (the
    watch read it when it started; such a cluster is logged and skipped, not an error of the whole run).
    ``watch_errors``: the watch's ``error`` events among them, recorded last (``record_watch_errors``)."""
    from kvfleet.fleet.pinning import inventory_of

    info = run_info()
    pinned = pin_inventory(params["fleet"])
    whole = inventory_of(pinned)
    gone: list[str] = []
    if event_clusters:
        known = {c.key for c in whole.clusters} | {c.name for c in whole.clusters}
        gone = sorted(set(event_clusters) - known)
        if gone:
            log.warning("the drift watch named cluster(s) no longer in the inventory, not checked: %s",
                        ", ".join(gone))
        params = {**params, "clusters": [c for c in event_clusters if c in known]}
    history = HistoryRepos.on()  # the run pinned before its scope is judged (a refusal's notification reads it)
    history.runs.start(info.run_key, dag_id=info.dag_id, run_id=info.run_id, trigger=info.trigger,
                      triggered_by=info.triggered_by, params=params, inventory=pinned)
    inv = narrowed(whole, clusters=_params(params)["clusters"]) if params.get("clusters") or not event_clusters \
        else None
    clusters = [c.key for c in inv.clusters] if inv is not None else []
    history.runs.record_step(info.step_key, StepEvent("scope", "drift", "planned", detail={
        "clusters": clusters, "endpoints": len(inv.endpoints) if inv is not None else 0,
        "remediate": bool(params.get("remediate")), "inventory": pinned.revision,
        **({"not_in_inventory": gone} if gone else {})}), actor=info.actor)
    record_watch_errors(history, info.step_key, info.actor, watch_errors or [], clusters=whole.clusters)
    return clusters


def record_watch_errors(history: HistoryRepos, step_key: StepKey, actor: str, errors: list[dict[str, str]],
                        clusters: Iterable[Named] = ()) -> None:
    """One ``drift_watch:<cluster>`` step (outcome ``watch_failed``, in the audit log too) per cluster the drift
    watch reported a failure of: its changes are not being watched until the watch is up again (the 10-minute
    drift check still runs), and why (``detail.errors``: each error's kind and message). The step names the
    cluster as the event did; its ``cluster`` is the key of the one cluster of ``clusters`` (the run's pinned
    inventory) that text names, as every history row names it, else the event's text."""
    pool = list(clusters)
    by_cluster: dict[str, list[dict[str, str]]] = {}
    for e in errors:
        log.warning("[%s] the drift watch reported: %s", e["cluster"], e["message"])
        by_cluster.setdefault(e["cluster"], []).append({"kind": e["kind"], "message": e["message"]})
    for cluster, found in sorted(by_cluster.items()):
        named = candidates(cluster, pool)
        key = named[0].ref.key if len(named) == 1 else cluster
        history.runs.record_step(step_key, StepEvent(f"drift_watch:{cluster}", "drift", Status.WATCH_FAILED,
                                                     cluster=key, detail={"errors": found}), actor=actor)


@task_boundary
def check_cluster(cluster: str, params: dict[str, Any]) -> dict[str, Any]:
    from kvfleet.airflow import halt

    ctx = stage_context(cluster, _params(params))
    try:
        remediate = bool(params.get("remediate"))
        held = halt.held(ctx) if remediate else None
        if held:  # a freeze or a stop: the check still observes and records; it changes nothing
            ctx.record(f"remediation_held:{ctx.cluster.name}", "drift", held["outcome"], reason=held["reason"])
        result = drift.check(ctx, remediate=remediate and not held)
    finally:
        ctx.close()
    out = result.as_dict()
    from kvfleet.airflow import notify  # new findings, an unreachable cluster, a refused remediation: never raises
    from kvfleet.airflow.context import run_info

    notify.notify_drift(out, run_info().run_key)
    log.info("[%s] %d finding(s), %s; observed in %.2fs%s", cluster, len(result.findings), result.sync,
             result.observe_s, f"; advice: {result.advice}" if result.advice else "")
    return out


def render_open(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no open drift"
    lines = []
    current: tuple[str, str] | None = None
    for r in rows:
        if (r["lob"], r["cluster"]) != current:
            current = (r["lob"], r["cluster"])
            lines.append(f"LOB {r['lob']} / cluster {r['cluster']}")
        fixed = f"  [remediation: {r['remediation'].get('action')} {r['remediation'].get('outcome')}]" \
            if r.get("remediation") else ""
        lines.append(f"  {r['severity']:<8} {r['kind']:<25} {r['object_ref']} {r['field']}: expected "
                     f"{r['expected']!r}, found {r['actual']!r} (since {r['first_seen']:%Y-%m-%d %H:%M}){fixed}")
    return "\n".join(lines)


@task_boundary
def summarize(results: list[dict[str, Any]] | None) -> dict[str, Any]:
    info = run_info()
    results = [r for r in results or [] if r]
    history = HistoryRepos.on()
    rows = history.queries.rows("drift_open_by_lob")
    checked = {r["cluster"] for r in results}
    rows = [r for r in rows if r["cluster"] in checked]
    log.info("open drift per line of business and cluster\n%s", render_open(rows))
    advice = [r["advice"] for r in results if r.get("advice")]
    for a in advice:
        log.warning("advice: %s", a)
    summary = {
        "clusters": sorted(checked),
        "unreachable": sorted(r["cluster"] for r in results if not r["reachable"]),
        "open": len(rows),
        "by_kind": _count(r["kind"] for r in rows),
        "remediations": sum(len(r["remediations"]) for r in results),
        "advice": advice,
    }
    bad = [f"{r['cluster']}: {m['action']} {m['outcome']} ({_why(m)})" for r in results
           for m in r["remediations"] if m["outcome"] in ("refused", "failed")]
    summary["remediations_not_done"] = bad
    history.runs.end(info.run_key, "failed" if bad else "success", summary)
    if bad:
        raise PermanentError(f"{len(bad)} drift remediation(s) refused or failed: " + "; ".join(bad)[:2000])
    return summary


def _why(remediation: dict[str, Any]) -> str:
    detail = remediation.get("detail") or {}
    return str(detail.get("reason") or detail.get("error") or "no reason recorded")[:300]


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in items:
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))
