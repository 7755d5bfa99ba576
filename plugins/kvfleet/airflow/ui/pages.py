"""The kvfleet page's views: what each one reads (named queries) and how it renders (HTML with inline SVG).

Called by ``kvfleet.airflow.ui.app``: ``build(view, history, filters)`` returns the view's data (served as JSON
under ``/api/<view>``), ``RENDERERS[view](data, ...)`` the HTML body of the same data, so the page and the API
cannot disagree. Every plot has a table of the same figures beneath it: the page reads without SVG or JS.

A renderer decides what is shown (rows, columns, links, which chart) and hands it to the view's template
(``templates/<view>.html``, through ``kvfleet.airflow.ui.templating``): the markup is the templates', every value
in it autoescaped; tables (``table``) and charts (``kvfleet.airflow.ui.svg``) are rendered templates too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup

from kvfleet.airflow import gates as gate_text
from kvfleet.airflow.ui import catalog, runbook
from kvfleet.airflow.ui.catalog import Filters, QueryError
from kvfleet.airflow.ui.svg import (
    PUBLISHED_COLOUR,
    Axis,
    Bar,
    Bucket,
    LobColours,
    Series,
    length_histogram,
    timeline,
    xy_chart,
)
from kvfleet.airflow.ui.templating import render
from kvfleet.fleet import economics
from kvfleet.history.queries import decode_cursor

VIEWS = ("fleet", "trends", "advisor", "drift", "curvine", "gates", "runs")
TITLES = {"fleet": "Fleet", "trends": "Verification trends", "advisor": "L2 advisor", "drift": "Drift timeline",
          "curvine": "Curvine", "gates": "Gates", "runs": "Runs", "runbook": "Runbook"}
GATE_DECISIONS_QUERY = "gate_decisions"  # a named query another change may add; used as soon as it exists
GATE_DAGS = ("kvfleet_rollout", "kvfleet_curvine_upgrade")  # the DAGs with human gates
RED_RUN_STATUSES = frozenset({"failed", "completed_with_failures", "aborted", "refused"})
RED_SEVERITIES = frozenset({"critical", "high"})
VERDICT_COLUMNS = frozenset({"verdict", "last_verdict", "l2_state", "status"})  # cells coloured by value (v-<value>)
DRIFT_PAGE = "drift_page"  # the drift view's list: keyset-paged, newest first_seen first
PENDING_WINDOW = "3d"  # how far back a pending gate's run is looked up (a gate times out after 2 h to 24 h)
PUBLISHED_SOURCES = {
    "ml.g5.4xlarge": "ml.g5.4xlarge TTFT curve (Qwen2-7B): 0.99× at 500, 1.7× at 1,000, 2.7× at 2,500 tokens",
    "ml.g6e.4xlarge": "ml.g6e.4xlarge 4-turn conversation, end to end: 1.22× at 530 → 1.34× at 2,114 tokens",
    "ml.g6.16xlarge": "no figure published for ml.g6; the g6e conversation figures (1.22–1.34×) as a floor",
}


def _ts(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        return datetime.fromisoformat(value).timestamp()
    return None


# ---- data ------------------------------------------------------------------------------------------------------


def lobs(history: Any) -> list[str]:
    return [r["lob"] for r in history.queries.rows("ui_lobs")]


def fleet_data(history: Any, f: Filters) -> dict[str, Any]:
    rows = catalog.run(history, "ui_fleet", f)
    q = (f.get("endpoint") or "").lower()
    state = f.get("status")
    rows = [r for r in rows if (not q or q in r["endpoint"].lower()) and (not state or r["l2_state"] == state)]
    clusters: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        clusters.setdefault(r["cluster"], {}).setdefault(r["lob"] or "(none)", []).append(r)
    states: dict[str, int] = {}
    for r in rows:
        states[r["l2_state"]] = states.get(r["l2_state"], 0) + 1
    return {"filters": {k: f.get(k) for k in ("cluster", "lob", "endpoint", "status")}, "endpoints": len(rows),
            "freezes": freezes_data(history), "l2_states": states,
            "open_drift": sum(int(r["open_drift"]) for r in rows),
            "clusters": [{"cluster": c, "lobs": [{"lob": lob, "endpoints": eps} for lob, eps in sorted(by.items())]}
                         for c, by in sorted(clusters.items())]}


def freezes_data(history: Any) -> list[dict[str, Any]]:
    """The freezes in force (``kvfleet.history.holds``), whatever the filters: a freeze holds more than the rows
    shown. Each as `kvfleet freeze list --json` prints it."""
    return [f.as_dict() for f in history.holds.active_freezes()]


def published_curve(instance_type: str | None) -> dict[str, Any]:
    itype = instance_type or "ml.g5.4xlarge"
    curve = [list(p) for p in economics.PROFILES.get(itype, economics.PUBLISHED_G5)]
    # The tables end with a flat extension of the last published figure ("flat after"): drawn, not marked.
    points = curve[:-1] if len(curve) > 1 and curve[-1][1] == curve[-2][1] else curve
    return {"instance_type": itype, "curve": curve, "points": points,
            "source": PUBLISHED_SOURCES.get(itype, "the ml.g5.4xlarge curve (no profile for this instance type)")}


def trends_data(history: Any, f: Filters) -> dict[str, Any]:
    cluster, endpoint = f.get("cluster"), f.get("endpoint")
    if not cluster or not endpoint:
        choices = catalog.run(history, "ui_fleet", f, lob=f.get("lob"))
        return {"cluster": cluster, "endpoint": endpoint, "choose": [
            {k: r[k] for k in ("cluster", "endpoint", "lob", "last_verdict", "instance_type")} for r in choices]}
    rows = catalog.run(history, "ui_endpoint_verifications", f)
    itype = next((r["instance_type"] for r in reversed(rows) if r["instance_type"]), None)
    latest_by_length: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r["prompt_tokens"] is not None and r["speedup"] is not None:
            latest_by_length[int(r["prompt_tokens"])] = r  # rows are oldest first: the newest wins
    sweep = [{"prompt_tokens": n, "speedup": r["speedup"], "expected_speedup": r["expected_speedup"],
              "hit_ratio": r["hit_ratio"], "at": r["at"], "run_key": r["run_key"], "verdict": r["verdict"]}
             for n, r in sorted(latest_by_length.items())]
    return {"cluster": cluster, "endpoint": endpoint, "lob": next((r["lob"] for r in rows if r["lob"]), None),
            "instance_type": itype, "since": f.since, "verifications": rows, "sweep": sweep,
            "published": published_curve(itype)}


DRIFT_COUNTS = ("seen", "open", "resolved", "remediated", "remediation_refused", "remediation_failed")


def drift_data(history: Any, f: Filters) -> dict[str, Any]:
    """The drift view: per cluster, the findings seen since the cutoff counted (``drift_summary``, kept at write
    time), and one page of the findings themselves, newest first (``drift_page``, keyset-paged as ``kvfleet audit
    drift`` pages): at most ``limit`` rows after the cursor ``after``, and the ``next`` cursor (None on the last
    page)."""
    after = f.get("after")
    if after:
        try:
            decode_cursor(DRIFT_PAGE, after)
        except ValueError:
            raise QueryError(f"after: {after[:80]!r} is not a cursor of the drift list; follow the page's 'next' "
                             "link, or leave after empty for the first page") from None
    cutoff, clusters = f.cutoff(), f.clusters(history.engine)  # a bare name is looked up once per request
    per_cluster = {r["cluster"]: {k: int(r[k]) for k in DRIFT_COUNTS}
                   for r in catalog.run(history, "drift_summary", f, cutoff=cutoff, clusters=clusters)}
    rows, next_cursor = history.queries.page(DRIFT_PAGE, limit=f.limit, after=after, cutoff=cutoff,
                                             clusters=clusters)
    return {"since": f.since, "per_cluster": per_cluster, "findings": rows, "limit": f.limit, "after": after,
            "next": next_cursor}


def curvine_data(history: Any, f: Filters) -> dict[str, Any]:
    """Curvine's releases and capacity: of the cluster the filter names (a key, or a bare name: the values it asks
    for, ``kvfleet.history.clusters``), else of each cluster the history knows, each by the value its rows hold
    (a value is never judged as a filter: a bare name kept from before revision 0011 that two accounts share
    lists its own rows, where as a filter it would be refused as ambiguous)."""
    clusters = [r["cluster"] for r in history.queries.rows("ui_clusters")]
    cluster = f.get("cluster")
    asked = [(cluster, f.clusters(history.engine))] if cluster else [(c, [c]) for c in clusters]
    return {"clusters": clusters, "curvine": [
        {"cluster": c, "releases": history.queries.rows("curvine_history", clusters=values),
         "capacity": history.queries.rows("capacity_history", clusters=values)} for c, values in asked]}


def gates_data(history: Any, f: Filters) -> dict[str, Any]:
    steps = catalog.run(history, "ui_gate_steps", f)
    if catalog.exists(GATE_DECISIONS_QUERY):
        return {"source": GATE_DECISIONS_QUERY, "note": "", "since": f.since,
                "rows": catalog.run(history, GATE_DECISIONS_QUERY, f), "steps": steps}
    return {"source": "ui_gate_steps", "since": f.since, "rows": steps, "steps": [],
            "note": "No gate-decisions query is installed yet: these are the gate steps recorded in the history's "
                    "step events (automatic gates after each wave, and every human answer with its responder)."}


def red_finding(r: Mapping[str, Any]) -> bool:
    """A finding an operator must act on: open and high/critical, or a remediation refused or failed."""
    outcome = (r.get("remediation") or {}).get("outcome") or r.get("remediation_outcome")
    return (r.get("resolved_at") is None and r.get("severity") in RED_SEVERITIES) or outcome in ("refused", "failed")


def red_decision(r: Mapping[str, Any]) -> bool:
    """A gate that stopped a cluster: aborted or rejected by a human, timed out, or a failed verification."""
    return (r.get("decision") in ("abort", "aborted") or bool(r.get("timed_out"))
            or r.get("outcome") in ("fail", "failed", "abort", "aborted"))


def pending_data(pending: Sequence[Any], history: Any) -> list[dict[str, Any]]:
    """The gates waiting for a human (``kvfleet.airflow.hitl.PendingGate``), each with its run's evidence: the
    newest verification per endpoint of the run and the open drift on the run's clusters, as markdown built by
    ``kvfleet.airflow.gates`` (the same tables as the gate's own body)."""
    if not pending:
        return []
    window = Filters(since=PENDING_WINDOW)
    verifications = catalog.run(history, "verifications", window)
    runs = {r["run_key"]: r for r in catalog.run(history, "recent_runs", window)}
    drift = history.queries.rows("open_drift")
    out = []
    for g in pending:
        run_key = f"{g.dag_id}/{g.run_id}"
        rows = [v for v in verifications if v.get("run_key") == run_key]
        params = (runs.get(run_key) or {}).get("params") or {}
        tolerance = float(params.get("speedup_tolerance") or gate_text.SPEEDUP_TOLERANCE)
        evidence = []
        for cluster in sorted({str(v["cluster"]) for v in rows}):
            evidence += [f"#### {cluster}: verifications of this run (bar = published × {1 - tolerance:.2f})",
                         gate_text.verification_table({}, [v for v in rows if v["cluster"] == cluster], tolerance),
                         f"#### {cluster}: open drift", gate_text.drift_table(drift, cluster), ""]
        out.append({"dag_id": g.dag_id, "run_id": g.run_id, "run_key": run_key, "task_id": g.task_id,
                    "map_index": g.map_index, "subject": g.subject, "body": g.body, "options": list(g.options),
                    "required_actions": gate_text.required_actions_url("", g.dag_id, g.run_id, g.task_id,
                                                                       g.map_index),
                    "evidence": "\n".join(evidence) or "_No verification of this run yet._"})
    return out


ADVICE_COLUMNS = ("verdict", "requests", "requests_per_hour", "mean_prompt_tokens", "share_below_payoff",
                  "saved_ms_per_request", "saved_s_per_hour", "saved_fraction", "working_set_bytes", "curve",
                  "prefer_prefix_routing", "value_usd_per_hour", "arithmetic", "assumptions")


def _lengths(raw: Any) -> list[dict[str, Any]]:
    """A recorded length distribution (``[{"tokens", "requests"}]`` or ``[[tokens, requests]]``), with each
    bucket's share of the requests."""
    out = []
    for item in raw or []:
        if isinstance(item, Mapping):
            tokens, requests = item.get("tokens"), item.get("requests")
        else:
            tokens, requests = (*item, None, None)[:2] if isinstance(item, list | tuple) else (None, None)
        if isinstance(tokens, int | float) and isinstance(requests, int | float):
            out.append({"tokens": float(tokens), "requests": float(requests)})
    total = sum(b["requests"] for b in out) or 1.0
    return [{**b, "share": b["requests"] / total} for b in sorted(out, key=lambda b: b["tokens"])]


def _advised_endpoints(detail: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The endpoints of one advise step: its full per-endpoint advice when recorded (``endpoints``: the CLI's
    ``kvfleet advise --json`` shape, with ``lengths``), else its verdicts."""
    full = detail.get("endpoints")
    if isinstance(full, list) and full:
        rows = [dict(e) for e in full if isinstance(e, Mapping) and e.get("endpoint")]
    else:
        rows = [{"endpoint": k, "verdict": v} for k, v in sorted((detail.get("verdicts") or {}).items())]
    for r in rows:
        r["lengths"] = _lengths(r.get("lengths"))
        if isinstance(r.get("working_set_bytes"), int | float):
            r["working_set_gib"] = r["working_set_bytes"] / 2 ** 30
    return rows


def advisor_data(history: Any, f: Filters) -> dict[str, Any]:
    """Per cluster, each endpoint's newest advice from the ``advise:<cluster>`` steps kvfleet_hit_verification
    recorded (a run scoped to some endpoints reports only those), with its LOB (from the Fleet view's rows), and
    the newest capacity recommendation and errors; filtered by LOB and endpoint."""
    lob_of = {(r["cluster"], r["endpoint"]): r["lob"] for r in catalog.run(history, "ui_fleet", Filters())}
    q = (f.get("endpoint") or "").lower()
    clusters: dict[str, dict[str, Any]] = {}
    for row in catalog.run(history, "ui_advice", f):  # newest first
        detail = row.get("detail") or {}
        c = clusters.setdefault(row["cluster"], {"cluster": row["cluster"], "at": row["at"], "run_key": row["run_key"],
                                                 "capacity": None, "capacity_run_key": None,
                                                 "errors": list(detail.get("errors") or []), "endpoints": {}})
        if c["capacity"] is None and detail.get("capacity"):
            c["capacity"], c["capacity_run_key"] = detail["capacity"], row["run_key"]
        for e in _advised_endpoints(detail):
            if e["endpoint"] in c["endpoints"]:
                continue
            e.update(lob=e.get("lob") or lob_of.get((row["cluster"], e["endpoint"])), reported_at=row["at"],
                     run_key=row["run_key"])
            c["endpoints"][e["endpoint"]] = e
    out = []
    for name in sorted(clusters):
        c = clusters[name]
        eps = [e for _, e in sorted(c["endpoints"].items())
               if (not f.get("lob") or e["lob"] == f.get("lob")) and (not q or q in str(e["endpoint"]).lower())]
        out.append({**c, "endpoints": eps})
    return {"since": f.since, "payoff_tokens": economics.MIN_USEFUL_TOKENS, "clusters": out}


def runs_data(history: Any, f: Filters) -> dict[str, Any]:
    rows = catalog.run(history, "recent_runs", f)
    if f.get("dag_id"):
        rows = [r for r in rows if r["dag_id"] == f.get("dag_id")]
    if f.get("status"):
        rows = [r for r in rows if r["status"] == f.get("status")]
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {"since": f.since, "runs": rows, "statuses": statuses}


BUILDERS: dict[str, Callable[[Any, Filters], dict[str, Any]]] = {
    "fleet": fleet_data, "trends": trends_data, "advisor": advisor_data, "drift": drift_data,
    "curvine": curvine_data, "gates": gates_data, "runs": runs_data}


def build(view: str, history: Any, f: Filters) -> dict[str, Any]:
    return BUILDERS[view](history, f)


# ---- HTML ------------------------------------------------------------------------------------------------------


def cell(value: Any) -> str:
    """Shown text of a value: as the CLI's tables print it (3 significant figures, whole numbers from 100)."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:.0f}"
        text = f"{value:.3g}"
        return f"{value:.6f}".rstrip("0").rstrip(".") if "e" in text else text
    if isinstance(value, dict | list):
        return json.dumps(catalog.jsonable(value), sort_keys=True)[:80]
    return str(value)


def _raw(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json.dumps(catalog.jsonable(value), sort_keys=True)
    return "" if value is None else str(value)


def _cells(r: Mapping[str, Any], columns: Sequence[str], colours: LobColours | None,
           link: Callable[[Mapping[str, Any]], str | None] | None,
           links: Mapping[str, Callable[[Mapping[str, Any]], str | None]]) -> list[dict[str, Any]]:
    """One row's cells as ``table.html`` draws them: shown text, raw value, CSS class, swatch and link."""
    out = []
    for c in columns:
        value = r.get(c)
        href = link(r) if c == "endpoint" and link is not None else None  # the endpoint's own view, same tab
        new_tab = False
        if not href and c in links and value is not None:  # e.g. the runbook: a new tab
            href = links[c](r)
            new_tab = bool(href)
        out.append({"col": c, "raw": _raw(value), "text": cell(value), "href": href, "new_tab": new_tab,
                    "cls": str(value) if c in VERDICT_COLUMNS else None,
                    "swatch": colours(value) if c == "lob" and colours is not None and value else None})
    return out


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, table_id: str = "",
          colours: LobColours | None = None, link: Callable[[Mapping[str, Any]], str | None] | None = None,
          data: Mapping[str, str] | None = None,
          links: Mapping[str, Callable[[Mapping[str, Any]], str | None]] | None = None) -> Markup:
    """Rows as an HTML table. ``link`` makes the endpoint cell a link; ``links`` does the same for any column
    (column -> href of a row, or None for no link); ``data`` are the table's ``data-*`` attributes."""
    return render("table.html", table_id=table_id, columns=list(columns),
                  data={f"data-{k}": v for k, v in (data or {}).items()},
                  rows=[_cells(r, columns, colours, link, links or {}) for r in rows])


def _form(fields: Sequence[tuple[str, str, Sequence[str] | None]], f: Filters) -> list[tuple[Any, ...]]:
    """The filter form's fields (``macros.html``'s ``filter_form``) with the values of this request."""
    return [(key, label, None if choices is None else list(choices), f.since if key == "since" else (f.get(key) or ""))
            for key, label, choices in fields]


def _href(base: str, view: str, **params: Any) -> str:
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return f"{base}/{view}" + (f"?{query}" if query else "")


def render_fleet(data: dict[str, Any], f: Filters, colours: LobColours, base: str,
                 ctx: Mapping[str, Any]) -> Markup:
    form = _form([("cluster", "cluster", ctx["clusters"]), ("lob", "LOB", ctx["lobs"]),
                  ("endpoint", "endpoint contains", None),
                  ("status", "L2 state", ["applied", "drifted", "failed", "not applied", "unknown"])], f)
    cols = ["endpoint", "lob", "l2_state", "last_verdict", "hit_ratio", "speedup", "expected_speedup",
            "open_drift", "drift_kinds", "last_change_at", "last_change_stage", "last_change_outcome"]
    clusters = [{"cluster": c["cluster"], "groups": [
        {"lob": g["lob"], "colour": colours(g["lob"]), "count": len(g["endpoints"]),
         "table": table(g["endpoints"], cols, table_id=f'fleet-{c["cluster"]}-{g["lob"]}', colours=colours,
                        data={"cluster": c["cluster"], "lob": g["lob"]},
                        link=lambda r: _href(base, "trends", cluster=r["cluster"], endpoint=r["endpoint"]))}
        for g in c["lobs"]]} for c in data["clusters"]]
    freezes = [{**fz, "scope": "all" if fz["scope"] == "all" else f'{fz["scope"]} {fz["target"]}',
                "lift": f'kvfleet freeze off --{fz["scope"]}' + (f' {fz["target"]}' if fz["target"] else "")
                        + ' --reason "…"'} for fz in data.get("freezes", [])]
    frozen = table(freezes, ["scope", "by", "at", "reason", "lift"], table_id="fleet-freezes") if freezes else None
    return render("fleet.html", form=form, data=data, clusters=clusters, frozen=frozen,
                  freeze_runbook=runbook.href(base, "freeze"),
                  red={s: n for s, n in data["l2_states"].items() if s in ("drifted", "failed")},
                  drift_runbook=runbook.href(base, "drift"), verification_runbook=runbook.href(base, "verification"))


def _trend_charts(data: dict[str, Any], colour: str) -> list[Markup]:
    """The trends view's plots: hit ratio and speedup over time, and the speedup per prompt length against the
    published curve."""
    rows, pub = data["verifications"], data["published"]
    timed = [(t, r) for r in rows if (t := _ts(r["at"])) is not None]
    older = [(float(r["prompt_tokens"]), float(r["speedup"])) for r in rows
             if r["prompt_tokens"] is not None and r["speedup"] is not None]
    return [
        xy_chart([Series("hit ratio", colour, [(t, r["hit_ratio"]) for t, r in timed if r["hit_ratio"] is not None])],
                 title="Cross-pod L2 hit ratio over time", x=Axis("time (UTC)", time=True),
                 y=Axis("hit ratio", lo=0.0, hi=1.05, fmt="{:.2f}"), chart_id="plot-hit-ratio"),
        xy_chart([Series("measured speedup", colour, [(t, r["speedup"]) for t, r in timed if r["speedup"] is not None]),
                  Series("expected (published)", PUBLISHED_COLOUR,
                         [(t, r["expected_speedup"]) for t, r in timed if r["expected_speedup"] is not None],
                         dashed=True, marker="none")],
                 title="TTFT speedup over time (cold on pod A / warm on pod B)", x=Axis("time (UTC)", time=True),
                 y=Axis("speedup ×", lo=0.0, fmt="{:.2f}"), chart_id="plot-speedup-time"),
        xy_chart([Series("published curve", PUBLISHED_COLOUR, [tuple(p) for p in pub["curve"]], dashed=True,
                         marker="none"),
                  Series("published points", PUBLISHED_COLOUR, [tuple(p) for p in pub["points"]], line=False,
                         marker="square"),
                  Series("all measurements", colour, older, line=False, opacity=0.35),
                  Series("latest per length", colour,
                         [(float(s["prompt_tokens"]), float(s["speedup"])) for s in data["sweep"]])],
                 title=f"Speedup vs prompt length, against the published curve ({pub['instance_type']})",
                 x=Axis("prompt tokens", lo=0.0, fmt="{:,.0f}"), y=Axis("speedup ×", lo=0.0, fmt="{:.2f}"),
                 chart_id="plot-sweep")]


def render_trends(data: dict[str, Any], f: Filters, colours: LobColours, base: str,
                  ctx: Mapping[str, Any]) -> Markup:
    if "choose" in data:
        return render("trends.html", choose=table(
            data["choose"], ["cluster", "endpoint", "lob", "instance_type", "last_verdict"], table_id="trends-choose",
            colours=colours, link=lambda r: _href(base, "trends", cluster=r["cluster"], endpoint=r["endpoint"])))
    rows, colour = data["verifications"], colours(data["lob"])
    form = _form([("cluster", "cluster", ctx["clusters"]), ("endpoint", "endpoint", None), ("since", "since", None)],
                 f)
    if not rows:
        return render("trends.html", choose=None, form=form, data=data, colour=colour, since=f.since)
    return render("trends.html", choose=None, form=form, data=data, colour=colour, since=f.since,
                  charts=_trend_charts(data, colour),
                  sweep=table(data["sweep"], ["prompt_tokens", "speedup", "expected_speedup", "hit_ratio", "verdict",
                                              "at", "run_key"], table_id="trends-sweep"),
                  verifications=table(list(reversed(rows)), ["at", "prompt_tokens", "hit_ratio", "ttft_cold_ms",
                                                             "ttft_warm_ms", "speedup", "expected_speedup", "verdict",
                                                             "diagnosis", "run_key"], table_id="trends-verifications"))


def _advised_endpoint(c: Mapping[str, Any], e: Mapping[str, Any], payoff: float,
                      colours: LobColours) -> dict[str, Any]:
    """One endpoint's advice section (``advisor.html``): its verdict, its prompt lengths plotted against the
    payoff threshold with the same figures as a table, and the arithmetic."""
    name, colour = f'{c["cluster"]}-{e["endpoint"]}', colours(e.get("lob"))
    out = {"endpoint": e["endpoint"], "lob": e.get("lob"), "verdict": str(e.get("verdict")), "colour": colour,
           "chart": None, "lengths": None, "arithmetic": list(e.get("arithmetic") or []),
           "assumptions": list(e.get("assumptions") or [])}
    if e["lengths"]:
        out["chart"] = length_histogram([Bucket(b["tokens"], b["requests"]) for b in e["lengths"]],
                                        title=f"Prompt lengths of {e['endpoint']} on {c['cluster']}",
                                        threshold=payoff, colour=colour, chart_id=f"plot-lengths-{name}")
        below = [{**b, "below_payoff": b["tokens"] < payoff} for b in e["lengths"]]
        out["lengths"] = table(below, ["tokens", "requests", "share", "below_payoff"], table_id=f"lengths-{name}")
    return out


def _advised_cluster(c: Mapping[str, Any], payoff: float, colours: LobColours) -> dict[str, Any]:
    cap = c.get("capacity") or {}
    cols = ["endpoint", "lob", *[k for k in ("verdict", "requests_per_hour", "mean_prompt_tokens",
                                              "share_below_payoff", "saved_ms_per_request", "saved_fraction",
                                              "working_set_gib", "curve")
                                 if any(k in e for e in c["endpoints"])], "reported_at", "run_key"]
    capacity = {"recommendation": str(cap.get("recommendation")), "add_workers": cap.get("add_workers"),
                "arithmetic": list(cap.get("arithmetic") or [])} if cap else None
    return {"cluster": c["cluster"], "at": cell(c["at"]), "run_key": c["run_key"], "capacity": capacity,
            "errors": [str(err) for err in c["errors"]],
            "table": table(c["endpoints"], cols, table_id=f'advisor-{c["cluster"]}', colours=colours,
                           data={"cluster": c["cluster"]}),
            "endpoints": [_advised_endpoint(c, e, payoff, colours) for e in c["endpoints"]]}


def render_advisor(data: dict[str, Any], f: Filters, colours: LobColours, base: str,
                   ctx: Mapping[str, Any]) -> Markup:
    form = _form([("cluster", "cluster", ctx["clusters"]), ("lob", "LOB", ctx["lobs"]),
                  ("endpoint", "endpoint contains", None), ("since", "since", None)], f)
    payoff = float(data["payoff_tokens"])
    return render("advisor.html", form=form, payoff=payoff, since=f.since,
                  clusters=[_advised_cluster(c, payoff, colours) for c in data["clusters"]])


def _drift_nav(data: dict[str, Any], f: Filters, base: str, nav_id: str) -> Markup:
    """Where this page of findings sits, and links to the first and the next page (a GET link each, no JS)."""
    keep = {"cluster": f.get("cluster"), "since": f.since,
            "limit": None if data["limit"] == catalog.DEFAULT_LIMIT else data["limit"]}
    return render("drift_nav.html", nav_id=nav_id, shown=len(data["findings"]), limit=data["limit"], since=f.since,
                  total=sum(c["seen"] for c in data["per_cluster"].values()), later=bool(data["after"]),
                  first_href=_href(base, "drift", **keep) if data["after"] else None,
                  next_href=_href(base, "drift", **keep, after=data["next"]) if data["next"] else None)


def _drift_chart(data: dict[str, Any], f: Filters, colours: LobColours) -> Markup | None:
    """The findings of this page as intervals, opened to resolved (or now), one row per object and kind."""
    bars = []
    for r in sorted(data["findings"], key=lambda r: (r["cluster"], _ts(r["first_seen"]) or 0.0)):
        start = _ts(r["first_seen"])
        if start is None:
            continue
        outcome = (r.get("remediation") or {}).get("outcome")
        bars.append(Bar(row=f'{r["cluster"]} · {r["endpoint"] or r["object_ref"]} · {r["kind"]}', start=start,
                        end=_ts(r["resolved_at"]), colour=colours(r["lob"]),
                        label=f'{r["kind"]} ({r["severity"]}) {r["field"] or ""}'.strip(),
                        hatched=outcome in ("refused", "failed"),
                        extra={"kind": r["kind"], "cluster": r["cluster"], "remediation": outcome or ""}))
    if not bars:
        return None
    shown = "" if not data["after"] and not data["next"] else f"; the {len(data['findings']):,} findings of this page"
    return timeline(bars, title=f"Drift findings opened and resolved (last {f.since}{shown})",
                    now=datetime.now(UTC).timestamp(), chart_id="plot-drift")


def render_drift(data: dict[str, Any], f: Filters, colours: LobColours, base: str,
                 ctx: Mapping[str, Any]) -> Markup:
    rows = data["findings"]
    per = [{"cluster": c, **v} for c, v in sorted(data["per_cluster"].items())]
    chart = _drift_chart(data, f, colours)
    for r in rows:
        rem = r.get("remediation") or {}
        r["remediation_outcome"] = rem.get("outcome")
        r["remediation_action"] = rem.get("action")
        r["runbook"] = f"what to do: {r['kind']}" if red_finding(r) else None
    findings = table(rows, ["cluster", "lob", "endpoint", "kind", "severity", "field", "expected", "actual",
                            "first_seen", "resolved_at", "remediation_action", "remediation_outcome", "runbook"],
                     table_id="drift-findings", colours=colours,
                     links={"runbook": lambda r: runbook.href(base, runbook.DRIFT_TOPIC)})
    return render("drift.html", form=_form([("cluster", "cluster", ctx["clusters"]), ("since", "since", None)], f),
                  per_cluster=table(per, ["cluster", *DRIFT_COUNTS], table_id="drift-per-cluster"), chart=chart,
                  nav=_drift_nav(data, f, base, "drift-paging"), findings=findings,
                  nav_end=_drift_nav(data, f, base, "drift-paging-end") if data["next"] else None)


def _curvine_cluster(c: Mapping[str, Any]) -> dict[str, Any]:
    gib = 2 ** 30
    caps = c["capacity"]
    points = [(t, r["capacity_bytes"] / gib) for r in caps
              if (t := _ts(r["at"])) is not None and r["capacity_bytes"] is not None]
    used = [(t, r["fs_used_bytes"] / gib) for r in caps
            if (t := _ts(r["at"])) is not None and r["fs_used_bytes"] is not None]
    chart = xy_chart([Series("capacity GiB", "#0072B2", points), Series("used GiB", "#E69F00", used)],
                     title=f"Curvine capacity on {c['cluster']}", x=Axis("time (UTC)", time=True),
                     y=Axis("GiB", lo=0.0, fmt="{:,.0f}"), chart_id=f"plot-capacity-{c['cluster']}") if points else None
    releases = table(c["releases"], ["release", "revision", "chart_version", "status", "format_master",
                                     "format_worker", "format_journal", "recorded_at", "run_key"],
                     table_id=f"curvine-releases-{c['cluster']}")
    for r in caps:
        r["capacity_gib"] = None if r["capacity_bytes"] is None else r["capacity_bytes"] / gib
        r["fs_used_gib"] = None if r["fs_used_bytes"] is None else r["fs_used_bytes"] / gib
    capacity = table(caps, ["at", "step", "phase", "capacity_gib", "fs_used_gib", "live_workers", "lost_workers",
                            "files_total", "run_key"], table_id=f"curvine-capacity-{c['cluster']}")
    return {"cluster": c["cluster"], "chart": chart, "releases": releases, "capacity": capacity}


def render_curvine(data: dict[str, Any], f: Filters, colours: LobColours, base: str,
                   ctx: Mapping[str, Any]) -> Markup:
    return render("curvine.html", form=_form([("cluster", "cluster", data["clusters"])], f),
                  clusters=[_curvine_cluster(c) for c in data["curvine"]])


def _airflow_base(base: str) -> str:
    """Airflow's UI base from the page's mount point (``<airflow>/kvfleet``)."""
    return base[: -len("/kvfleet")] if base.endswith("/kvfleet") else ""


def _pending_gate(g: Mapping[str, Any], base: str) -> dict[str, Any]:
    """A gate waiting for a human (``gates.html``): its body and evidence are markdown, rendered raw HTML off."""
    return {"run_key": g["run_key"], "task_id": g["task_id"], "map_index": int(g["map_index"]),
            "subject": g["subject"], "options": [str(o) for o in g["options"]],
            "answer": _airflow_base(base) + str(g["required_actions"]),
            "body": runbook.render(g["body"] or ""), "evidence": runbook.render(g["evidence"])}


def render_gates(data: dict[str, Any], f: Filters, colours: LobColours, base: str,
                 ctx: Mapping[str, Any]) -> Markup:
    rows = [{**r, "runbook": "what to do" if red_decision(r) else None} for r in data["rows"]]
    to_runbook = {"runbook": lambda r: runbook.href(base, "verification")}
    steps = None
    if data["steps"]:
        steps = table([{**r, "runbook": "what to do" if red_decision(r) else None} for r in data["steps"]],
                      [*data["steps"][0], "runbook"], table_id="gate-steps", links=to_runbook)
    pending = [_pending_gate(g, base) for g in data["pending"]] if "pending" in data else None
    return render("gates.html", form=_form([("since", "since", None)], f), data=data, pending=pending,
                  verification_runbook=runbook.href(base, "verification"), steps=steps,
                  decisions=table(rows, [*data["rows"][0], "runbook"] if rows else [], table_id="gates",
                                  links=to_runbook))


def render_runs(data: dict[str, Any], f: Filters, colours: LobColours, base: str,
                ctx: Mapping[str, Any]) -> Markup:
    form = _form([("dag_id", "DAG", None), ("status", "status", sorted(data["statuses"])), ("since", "since", None)],
                 f)
    rows = [{**r, "runbook": "what to do" if r.get("status") in RED_RUN_STATUSES else None} for r in data["runs"]]
    runs = table(rows, ["started_at", "ended_at", "dag_id", "run_id", "trigger", "triggered_by", "status", "reason",
                        "changed", "unchanged", "failed", "planned", "runbook"], table_id="runs",
                 links={"runbook": lambda r: runbook.href(base, runbook.TOPIC_OF_DAG.get(r["dag_id"], "rollout"))})
    return render("runs.html", form=form, data=data, runs=runs)


RENDERERS: dict[str, Callable[[dict[str, Any], Filters, LobColours, str, Mapping[str, Any]], Markup]] = {
    "fleet": render_fleet, "trends": render_trends, "advisor": render_advisor, "drift": render_drift,
    "curvine": render_curvine, "gates": render_gates, "runs": render_runs}


def page(view: str, body: Markup, *, base: str, user: str, colours: LobColours) -> str:
    """The whole page of a view: ``body`` is a rendered template (a plain ``str`` would be shown escaped)."""
    html = render("page.html", view=view, title=TITLES[view], tabs=[(v, TITLES[v]) for v in VIEWS], base=base,
                  user=user, runbook=runbook.href(base, ""), legend=colours.legend_html(), body=body)
    return str(html)  # the finished document, a plain str: it goes into no other template
