"""The kvfleet page's views: what each one reads (named queries) and how it renders (HTML with inline SVG).

Called by ``kvfleet.airflow.ui.app``: ``build(view, history, filters)`` returns the view's data (served as JSON
under ``/api/<view>``), ``render(view, data, ...)`` the HTML body of the same data, so the page and the API
cannot disagree. Every plot has a table of the same figures beneath it: the page reads without SVG or JS.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

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
from kvfleet.fleet import economics
from kvfleet.history.queries import decode_cursor

VIEWS = ("fleet", "trends", "advisor", "drift", "curvine", "gates", "runs")
TITLES = {"fleet": "Fleet", "trends": "Verification trends", "advisor": "L2 advisor", "drift": "Drift timeline",
          "curvine": "Curvine", "gates": "Gates", "runs": "Runs", "runbook": "Runbook"}
GATE_DECISIONS_QUERY = "gate_decisions"  # a named query another change may add; used as soon as it exists
GATE_DAGS = ("kvfleet_rollout", "kvfleet_curvine_upgrade")  # the DAGs with human gates
RED_RUN_STATUSES = frozenset({"failed", "completed_with_failures", "aborted", "refused"})
RED_SEVERITIES = frozenset({"critical", "high"})
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
            "l2_states": states, "open_drift": sum(int(r["open_drift"]) for r in rows),
            "clusters": [{"cluster": c, "lobs": [{"lob": lob, "endpoints": eps} for lob, eps in sorted(by.items())]}
                         for c, by in sorted(clusters.items())]}


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
    cutoff = f.cutoff()
    per_cluster = {r["cluster"]: {k: int(r[k]) for k in DRIFT_COUNTS}
                   for r in catalog.run(history, "drift_summary", f, cutoff=cutoff)}
    rows, next_cursor = history.queries.page(DRIFT_PAGE, limit=f.limit, after=after, cutoff=cutoff,
                                             cluster=f.get("cluster"))
    return {"since": f.since, "per_cluster": per_cluster, "findings": rows, "limit": f.limit, "after": after,
            "next": next_cursor}


def curvine_data(history: Any, f: Filters) -> dict[str, Any]:
    clusters = [r["cluster"] for r in history.queries.rows("ui_clusters")]
    chosen = [f.get("cluster")] if f.get("cluster") else clusters
    return {"clusters": clusters, "curvine": [
        {"cluster": c, "releases": history.queries.rows("curvine_history", cluster=c),
         "capacity": history.queries.rows("capacity_history", cluster=c)} for c in chosen]}


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


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, table_id: str = "",
          colours: LobColours | None = None, link: Callable[[Mapping[str, Any]], str | None] | None = None,
          data: Mapping[str, str] | None = None,
          links: Mapping[str, Callable[[Mapping[str, Any]], str | None]] | None = None) -> str:
    """Rows as an HTML table. ``link`` makes the endpoint cell a link; ``links`` does the same for any column
    (column -> href of a row, or None for no link)."""
    if not rows:
        return '<p class="empty">(none recorded)</p>'
    head = "".join(f"<th>{escape(c.replace('_', ' '))}</th>" for c in columns)
    body = []
    for r in rows:
        tds = []
        for c in columns:
            text = escape(cell(r.get(c)))
            if c == "lob" and colours is not None and r.get(c):
                text = f'<span class="swatch" style="background:{colours(r[c])}"></span>{text}'
            if c == "endpoint" and link is not None and (href := link(r)):
                text = f'<a href="{escape(href)}">{text}</a>'
            elif links and c in links and r.get(c) is not None and (href := links[c](r)):
                text = f'<a href="{escape(href)}" target="_blank" rel="noopener">{text}</a>'
            cls = f' class="v-{escape(str(r[c]))}"' if c in ("verdict", "last_verdict", "l2_state", "status") else ""
            tds.append(f'<td data-col="{escape(c)}" data-value="{escape(_raw(r.get(c)))}"{cls}>{text}</td>')
        body.append(f"<tr>{''.join(tds)}</tr>")
    attrs = "".join(f' data-{escape(k)}="{escape(v)}"' for k, v in (data or {}).items())
    return (f'<table id="{escape(table_id)}" class="data"{attrs}><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _filter_form(fields: Sequence[tuple[str, str, Sequence[str] | None]], f: Filters) -> str:
    """A plain GET form (no JS): text inputs, or selects when the choices are known."""
    parts = []
    for key, label, choices in fields:
        value = f.since if key == "since" else (f.get(key) or "")
        if choices is not None:
            opts = "".join(f'<option value="{escape(c)}"{" selected" if c == value else ""}>{escape(c or "all")}'
                           "</option>" for c in ["", *choices])
            parts.append(f'<label>{escape(label)} <select name="{key}">{opts}</select></label>')
        else:
            parts.append(f'<label>{escape(label)} <input name="{key}" value="{escape(value)}" size="14"></label>')
    return f'<form class="filters" method="get">{"".join(parts)}<button type="submit">Apply</button></form>'


def _href(base: str, view: str, **params: Any) -> str:
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return f"{base}/{view}" + (f"?{query}" if query else "")


def render_fleet(data: dict[str, Any], f: Filters, colours: LobColours, base: str, ctx: Mapping[str, Any]) -> str:
    form = _filter_form([("cluster", "cluster", ctx["clusters"]), ("lob", "LOB", ctx["lobs"]),
                         ("endpoint", "endpoint contains", None),
                         ("status", "L2 state", ["applied", "drifted", "failed", "not applied", "unknown"])], f)
    summary = ", ".join(f"{n} {escape(s)}" for s, n in sorted(data["l2_states"].items())) or "none"
    out = [form, f'<p class="summary">{data["endpoints"]} endpoints: {summary}; {data["open_drift"]} open drift '
                 "findings.</p>"]
    red = {s: n for s, n in data["l2_states"].items() if s in ("drifted", "failed")}
    if red:
        what = ", ".join(f"{n} {escape(s)}" for s, n in sorted(red.items()))
        out.append(f'<p class="note red" id="fleet-runbook">{what}: see the runbook on '
                   f'<a href="{escape(runbook.href(base, "drift"))}" target="_blank" rel="noopener">drift, what each '
                   f'kind means and what to do</a> and on <a href="{escape(runbook.href(base, "verification"))}" '
                   'target="_blank" rel="noopener">verifying cross-pod hits</a>.</p>')
    cols = ["endpoint", "lob", "l2_state", "last_verdict", "hit_ratio", "speedup", "expected_speedup",
            "open_drift", "drift_kinds", "last_change_at", "last_change_stage", "last_change_outcome"]
    for c in data["clusters"]:
        out.append(f'<h2 id="cluster-{escape(c["cluster"])}">{escape(c["cluster"])}</h2>')
        for group in c["lobs"]:
            out.append(f'<h3><span class="swatch" style="background:{colours(group["lob"])}"></span>'
                       f'{escape(group["lob"])} <small>({len(group["endpoints"])} endpoints)</small></h3>')
            out.append(table(group["endpoints"], cols, table_id=f'fleet-{c["cluster"]}-{group["lob"]}',
                             colours=colours, data={"cluster": c["cluster"], "lob": group["lob"]},
                             link=lambda r: _href(base, "trends", cluster=r["cluster"], endpoint=r["endpoint"])))
    return "".join(out)


def render_trends(data: dict[str, Any], f: Filters, colours: LobColours, base: str, ctx: Mapping[str, Any]) -> str:
    if "choose" in data:
        return ("<p>Pick an endpoint (or open one from the Fleet view).</p>"
                + table(data["choose"], ["cluster", "endpoint", "lob", "instance_type", "last_verdict"],
                        table_id="trends-choose", colours=colours,
                        link=lambda r: _href(base, "trends", cluster=r["cluster"], endpoint=r["endpoint"])))
    rows, colour = data["verifications"], colours(data["lob"])
    form = _filter_form([("cluster", "cluster", ctx["clusters"]), ("endpoint", "endpoint", None),
                         ("since", "since", None)], f)
    out = [form, f'<h2><span class="swatch" style="background:{colour}"></span>{escape(data["cluster"])} · '
                 f'{escape(data["endpoint"])} <small>{escape(data["lob"] or "")} · '
                 f'{escape(data["instance_type"] or "instance type not recorded")}</small></h2>']
    if not rows:
        return "".join([*out, f'<p class="empty">No verification of this endpoint in the last {escape(f.since)}.</p>'])
    timed = [(t, r) for r in rows if (t := _ts(r["at"])) is not None]
    out.append(xy_chart([Series("hit ratio", colour, [(t, r["hit_ratio"]) for t, r in timed
                                                       if r["hit_ratio"] is not None])],
                        title="Cross-pod L2 hit ratio over time", x=Axis("time (UTC)", time=True),
                        y=Axis("hit ratio", lo=0.0, hi=1.05, fmt="{:.2f}"), chart_id="plot-hit-ratio"))
    out.append(xy_chart([Series("measured speedup", colour, [(t, r["speedup"]) for t, r in timed
                                                              if r["speedup"] is not None]),
                         Series("expected (published)", PUBLISHED_COLOUR,
                                [(t, r["expected_speedup"]) for t, r in timed if r["expected_speedup"] is not None],
                                dashed=True, marker="none")],
                        title="TTFT speedup over time (cold on pod A / warm on pod B)", x=Axis("time (UTC)", time=True),
                        y=Axis("speedup ×", lo=0.0, fmt="{:.2f}"), chart_id="plot-speedup-time"))
    pub = data["published"]
    older = [(float(r["prompt_tokens"]), float(r["speedup"])) for r in rows
             if r["prompt_tokens"] is not None and r["speedup"] is not None]
    out.append(xy_chart([Series("published curve", PUBLISHED_COLOUR, [tuple(p) for p in pub["curve"]],
                                dashed=True, marker="none"),
                         Series("published points", PUBLISHED_COLOUR, [tuple(p) for p in pub["points"]],
                                line=False, marker="square"),
                         Series("all measurements", colour, older, line=False, opacity=0.35),
                         Series("latest per length", colour,
                                [(float(s["prompt_tokens"]), float(s["speedup"])) for s in data["sweep"]])],
                        title=f"Speedup vs prompt length, against the published curve ({pub['instance_type']})",
                        x=Axis("prompt tokens", lo=0.0, fmt="{:,.0f}"), y=Axis("speedup ×", lo=0.0, fmt="{:.2f}"),
                        chart_id="plot-sweep"))
    out.append(f'<p class="source">Published: {escape(pub["source"])}.</p>')
    out.append("<h3>Speedup per prompt length (newest measurement of each length)</h3>")
    out.append(table(data["sweep"], ["prompt_tokens", "speedup", "expected_speedup", "hit_ratio", "verdict", "at",
                                     "run_key"], table_id="trends-sweep"))
    out.append("<h3>Every verification</h3>")
    out.append(table(list(reversed(rows)), ["at", "prompt_tokens", "hit_ratio", "ttft_cold_ms", "ttft_warm_ms",
                                            "speedup", "expected_speedup", "verdict", "diagnosis", "run_key"],
                     table_id="trends-verifications"))
    return "".join(out)


def _arithmetic(lines: Sequence[Any], css: str) -> str:
    return (f'<ol class="{css}">' + "".join(f"<li>{escape(str(x))}</li>" for x in lines) + "</ol>") if lines else ""


def _render_advised_endpoint(c: Mapping[str, Any], e: Mapping[str, Any], payoff: float, colours: LobColours) -> str:
    name, colour = f'{c["cluster"]}-{e["endpoint"]}', colours(e.get("lob"))
    out = [f'<section class="advice" data-cluster="{escape(c["cluster"])}" data-endpoint="{escape(e["endpoint"])}" '
           f'data-verdict="{escape(str(e.get("verdict")))}"><h3><span class="swatch" style="background:{colour}">'
           f'</span>{escape(e["endpoint"])} <small>{escape(e.get("lob") or "")}</small> · '
           f'<span class="v-{escape(str(e.get("verdict")))}">{escape(str(e.get("verdict")))}</span></h3>']
    if e["lengths"]:
        out.append(length_histogram([Bucket(b["tokens"], b["requests"]) for b in e["lengths"]],
                                    title=f"Prompt lengths of {e['endpoint']} on {c['cluster']}", threshold=payoff,
                                    colour=colour, chart_id=f"plot-lengths-{name}"))
        below = [{**b, "below_payoff": b["tokens"] < payoff} for b in e["lengths"]]
        out.append(table(below, ["tokens", "requests", "share", "below_payoff"], table_id=f"lengths-{name}"))
    else:
        out.append('<p class="note">This advise step recorded no prompt-length distribution for the endpoint (its '
                   "verdict only).</p>")
    out.append(_arithmetic(e.get("arithmetic") or [], "arithmetic"))
    if e.get("assumptions"):
        out.append('<p class="source">Assumptions:</p>' + _arithmetic(e["assumptions"], "assumptions"))
    out.append("</section>")
    return "".join(out)


def render_advisor(data: dict[str, Any], f: Filters, colours: LobColours, base: str, ctx: Mapping[str, Any]) -> str:
    form = _filter_form([("cluster", "cluster", ctx["clusters"]), ("lob", "LOB", ctx["lobs"]),
                         ("endpoint", "endpoint contains", None), ("since", "since", None)], f)
    payoff = float(data["payoff_tokens"])
    out = [form, f'<p class="source">Does the shared L2 pay off per endpoint, from its observed prompt lengths and the '
                 f"speedup curve (below about {payoff:,.0f} tokens it does not), and is Curvine big enough per "
                 "cluster: the newest report of kvfleet_hit_verification's advise task (the same model as "
                 "<code>kvfleet advise --json</code>).</p>"]
    if not data["clusters"]:
        return "".join([*out, f'<p class="empty">No advisor report in the last {escape(f.since)}: '
                              "kvfleet_hit_verification records one per cluster.</p>"])
    for c in data["clusters"]:
        cap = c.get("capacity") or {}
        out.append(f'<h2>{escape(c["cluster"])} <small>newest report {escape(cell(c["at"]))} · run '
                   f'<code>{escape(c["run_key"])}</code> (each endpoint shows its newest advice)</small></h2>')
        if cap:
            add = f' (+{cap.get("add_workers")} workers)' if cap.get("add_workers") else ""
            out.append(f'<p class="summary" id="capacity-{escape(c["cluster"])}" data-recommendation='
                       f'"{escape(str(cap.get("recommendation")))}">Curvine capacity: '
                       f'<strong>{escape(str(cap.get("recommendation")))}</strong>{escape(add)}</p>'
                       + _arithmetic(cap.get("arithmetic") or [], "arithmetic"))
        for err in c["errors"]:
            out.append(f'<p class="note red">could not read: {escape(str(err))}</p>')
        cols = ["endpoint", "lob", *[k for k in ("verdict", "requests_per_hour", "mean_prompt_tokens",
                                                  "share_below_payoff", "saved_ms_per_request", "saved_fraction",
                                                  "working_set_gib", "curve")
                                     if any(k in e for e in c["endpoints"])], "reported_at", "run_key"]
        out.append(table(c["endpoints"], cols, table_id=f'advisor-{c["cluster"]}', colours=colours,
                         data={"cluster": c["cluster"]}))
        out.extend(_render_advised_endpoint(c, e, payoff, colours) for e in c["endpoints"])
    return "".join(out)


def _drift_nav(data: dict[str, Any], f: Filters, base: str, nav_id: str) -> str:
    """Where this page of findings sits, and links to the first and the next page (a GET link each, no JS)."""
    total = sum(c["seen"] for c in data["per_cluster"].values())
    keep = {"cluster": f.get("cluster"), "since": f.since,
            "limit": None if data["limit"] == catalog.DEFAULT_LIMIT else data["limit"]}
    links = []
    if data["after"]:
        links.append(f'<a class="first" href="{escape(_href(base, "drift", **keep))}">first page</a>')
    if data["next"]:
        href = _href(base, "drift", **keep, after=data["next"])
        links.append(f'<a class="next" rel="next" href="{escape(href)}">next {data["limit"]:,} →</a>')
    where = "a later page" if data["after"] else "the first page"
    return (f'<p class="summary" id="{nav_id}" data-shown="{len(data["findings"])}" data-total="{total}">'
            f'{len(data["findings"]):,} of the {total:,} findings seen in the last {escape(f.since)}, newest first '
            f'({where}, up to {data["limit"]:,} per page){" · " if links else ""}{" · ".join(links)}</p>')


def render_drift(data: dict[str, Any], f: Filters, colours: LobColours, base: str, ctx: Mapping[str, Any]) -> str:
    form = _filter_form([("cluster", "cluster", ctx["clusters"]), ("since", "since", None)], f)
    rows = data["findings"]
    per = [{"cluster": c, **v} for c, v in sorted(data["per_cluster"].items())]
    out = [form, "<h2>Findings per cluster</h2>",
           table(per, ["cluster", *DRIFT_COUNTS], table_id="drift-per-cluster")]
    bars = []
    for r in sorted(rows, key=lambda r: (r["cluster"], _ts(r["first_seen"]) or 0.0)):
        start = _ts(r["first_seen"])
        if start is None:
            continue
        outcome = (r.get("remediation") or {}).get("outcome")
        bars.append(Bar(row=f'{r["cluster"]} · {r["endpoint"] or r["object_ref"]} · {r["kind"]}', start=start,
                        end=_ts(r["resolved_at"]), colour=colours(r["lob"]),
                        label=f'{r["kind"]} ({r["severity"]}) {r["field"] or ""}'.strip(),
                        hatched=outcome in ("refused", "failed"),
                        extra={"kind": r["kind"], "cluster": r["cluster"], "remediation": outcome or ""}))
    if bars:
        shown = "" if not data["after"] and not data["next"] else f"; the {len(rows):,} findings of this page"
        out.append(timeline(bars, title=f"Drift findings opened and resolved (last {f.since}{shown})",
                            now=datetime.now(UTC).timestamp(), chart_id="plot-drift"))
    for r in rows:
        rem = r.get("remediation") or {}
        r["remediation_outcome"] = rem.get("outcome")
        r["remediation_action"] = rem.get("action")
        r["runbook"] = f"what to do: {r['kind']}" if red_finding(r) else None
    out.append("<h2>Findings</h2>")
    out.append(_drift_nav(data, f, base, "drift-paging"))
    out.append(table(rows, ["cluster", "lob", "endpoint", "kind", "severity", "field", "expected", "actual",
                            "first_seen", "resolved_at", "remediation_action", "remediation_outcome", "runbook"],
                     table_id="drift-findings", colours=colours,
                     links={"runbook": lambda r: runbook.href(base, runbook.DRIFT_TOPIC)}))
    if data["next"]:
        out.append(_drift_nav(data, f, base, "drift-paging-end"))
    return "".join(out)


def render_curvine(data: dict[str, Any], f: Filters, colours: LobColours, base: str, ctx: Mapping[str, Any]) -> str:
    out = [_filter_form([("cluster", "cluster", data["clusters"])], f)]
    gib = 2 ** 30
    for c in data["curvine"]:
        out.append(f'<h2>{escape(c["cluster"])}</h2>')
        caps = c["capacity"]
        points = [(t, r["capacity_bytes"] / gib) for r in caps
                  if (t := _ts(r["at"])) is not None and r["capacity_bytes"] is not None]
        used = [(t, r["fs_used_bytes"] / gib) for r in caps
                if (t := _ts(r["at"])) is not None and r["fs_used_bytes"] is not None]
        if points:
            out.append(xy_chart([Series("capacity GiB", "#0072B2", points), Series("used GiB", "#E69F00", used)],
                                title=f"Curvine capacity on {c['cluster']}", x=Axis("time (UTC)", time=True),
                                y=Axis("GiB", lo=0.0, fmt="{:,.0f}"), chart_id=f"plot-capacity-{c['cluster']}"))
        out.append("<h3>Release revisions and their format flags</h3>")
        out.append(table(c["releases"], ["release", "revision", "chart_version", "status", "format_master",
                                         "format_worker", "format_journal", "recorded_at", "run_key"],
                         table_id=f"curvine-releases-{c['cluster']}"))
        for r in caps:
            r["capacity_gib"] = None if r["capacity_bytes"] is None else r["capacity_bytes"] / gib
            r["fs_used_gib"] = None if r["fs_used_bytes"] is None else r["fs_used_bytes"] / gib
        out.append("<h3>Capacity snapshots</h3>")
        out.append(table(caps, ["at", "step", "phase", "capacity_gib", "fs_used_gib", "live_workers", "lost_workers",
                                "files_total", "run_key"], table_id=f"curvine-capacity-{c['cluster']}"))
    return "".join(out)


def _airflow_base(base: str) -> str:
    """Airflow's UI base from the page's mount point (``<airflow>/kvfleet``)."""
    return base[: -len("/kvfleet")] if base.endswith("/kvfleet") else ""


def render_pending(pending: Sequence[Mapping[str, Any]], base: str) -> str:
    if not pending:
        return '<h2>Waiting for a human</h2><p class="empty" id="pending-gates">No gate is waiting.</p>'
    out = [f'<h2>Waiting for a human ({len(pending)})</h2><div id="pending-gates">']
    for g in pending:
        answer = _airflow_base(base) + str(g["required_actions"])
        index = f' [{int(g["map_index"])}]' if g["map_index"] >= 0 else ""
        out.append(
            f'<section class="gate" data-run-key="{escape(g["run_key"])}" data-task-id="{escape(g["task_id"])}" '
            f'data-map-index="{int(g["map_index"])}"><h3>{escape(g["subject"])}</h3>'
            f'<p><a class="answer" href="{escape(answer)}" target="_top">Answer in Airflow (Required actions)</a> · '
            f'options: {escape(", ".join(g["options"]))} · run <code>{escape(g["run_key"])}</code> · task '
            f'<code>{escape(g["task_id"])}</code>{index}</p>'
            f'<div class="gate-body">{runbook.render(g["body"] or "")}</div>'
            f'<details open><summary>Evidence from the history</summary>{runbook.render(g["evidence"])}</details>'
            f'<p class="source">What the options do and when to abort: <a href="'
            f'{escape(runbook.href(base, "verification"))}" target="_blank" rel="noopener">runbook</a>.</p>'
            "</section>")
    out.append("</div>")
    return "".join(out)


def render_gates(data: dict[str, Any], f: Filters, colours: LobColours, base: str, ctx: Mapping[str, Any]) -> str:
    rows = [{**r, "runbook": "what to do" if red_decision(r) else None} for r in data["rows"]]
    cols = [*data["rows"][0], "runbook"] if rows else []
    note = f'<p class="note">{escape(data["note"])}</p>' if data["note"] else ""
    to_runbook = {"runbook": lambda r: runbook.href(base, "verification")}
    out = [_filter_form([("since", "since", None)], f), note]
    if "pending" in data:
        out.append(render_pending(data["pending"], base))
    if data.get("pending_error"):
        out.append(f'<p class="note red">{escape(data["pending_error"])}</p>')
    out += [f'<h2>Human decisions</h2><p class="source">Named query: <code>{escape(data["source"])}</code></p>',
            table(rows, cols, table_id="gates", links=to_runbook)]
    if data["steps"]:
        steps = [{**r, "runbook": "what to do" if red_decision(r) else None} for r in data["steps"]]
        out.append("<h2>Every gate step</h2><p class=\"source\">Automatic gates after each wave (kvfleet decides) "
                   "and human answers; named query <code>ui_gate_steps</code>.</p>")
        out.append(table(steps, [*data["steps"][0], "runbook"], table_id="gate-steps", links=to_runbook))
    return "".join(out)


def render_runs(data: dict[str, Any], f: Filters, colours: LobColours, base: str, ctx: Mapping[str, Any]) -> str:
    form = _filter_form([("dag_id", "DAG", None), ("status", "status", sorted(data["statuses"])),
                         ("since", "since", None)], f)
    summary = ", ".join(f"{n} {escape(s)}" for s, n in sorted(data["statuses"].items())) or "none"
    rows = [{**r, "runbook": "what to do" if r.get("status") in RED_RUN_STATUSES else None} for r in data["runs"]]
    return (form + f'<p class="summary">{len(data["runs"])} runs: {summary}.</p>'
            + table(rows, ["started_at", "ended_at", "dag_id", "run_id", "trigger", "triggered_by", "status",
                           "reason", "changed", "unchanged", "failed", "planned", "runbook"], table_id="runs",
                    links={"runbook": lambda r: runbook.href(base, runbook.TOPIC_OF_DAG.get(r["dag_id"], "rollout"))}))


RENDERERS: dict[str, Callable[[dict[str, Any], Filters, LobColours, str, Mapping[str, Any]], str]] = {
    "fleet": render_fleet, "trends": render_trends, "advisor": render_advisor, "drift": render_drift,
    "curvine": render_curvine, "gates": render_gates, "runs": render_runs}

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#1a1a1a;background:#fafafa}
header{background:#017cee;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center;flex-wrap:wrap}
header a{color:#fff;text-decoration:none;padding:4px 8px;border-radius:4px}
header a.active{background:rgba(255,255,255,.25);font-weight:600}
main{padding:12px 16px;max-width:1400px}
table.data{border-collapse:collapse;font-size:12px;margin:6px 0 16px;background:#fff}
table.data th,table.data td{border:1px solid #ddd;padding:3px 6px;text-align:left;white-space:nowrap}
table.data th{background:#f0f0f0}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px}
.legend{margin:4px 0 8px;font-size:12px}.legend .lob{margin-right:12px}
.v-pass,.v-applied,.v-success{color:#0a7a2f}.v-fail,.v-failed,.v-drifted{color:#b00020;font-weight:600}
.v-degraded,.v-unverifiable,.v-not\\ applied,.v-completed_with_failures{color:#a15c00}
form.filters{display:flex;gap:10px;flex-wrap:wrap;align-items:center;margin:6px 0;font-size:13px}
svg.chart{display:block;margin:8px 0;max-width:100%;height:auto;background:#fff;border:1px solid #e4e4e4}
p.note{background:#fff7e0;border:1px solid #f0d890;padding:6px 8px;font-size:13px}
p.note.red{background:#fdecee;border-color:#f0a0a8}
section.gate{background:#fff;border:1px solid #e4e4e4;border-left:4px solid #a15c00;padding:4px 12px;margin:8px 0}
section.gate table{border-collapse:collapse;font-size:12px}section.gate td,section.gate th{border:1px solid #ddd;
padding:2px 6px}a.answer{font-weight:600}
p.source,p.summary{font-size:13px;color:#444}
section.advice{background:#fff;border:1px solid #e4e4e4;padding:4px 12px;margin:8px 0}
ol.arithmetic,ol.assumptions{font-size:12px;font-family:ui-monospace,monospace;color:#333}
.v-pays_off{color:#0a7a2f;font-weight:600}.v-does_not_pay_off{color:#b00020;font-weight:600}
.v-marginal,.v-insufficient_data{color:#a15c00}.user{margin-left:auto;font-size:12px}
"""


def page(view: str, body: str, *, base: str, user: str, colours: LobColours) -> str:
    tabs = "".join(f'<a href="{base}/{v}"{" class=active" if v == view else ""}>{escape(TITLES[v])}</a>'
                   for v in VIEWS)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>kvfleet · {escape(TITLES[view])}'
            f'</title><meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
            f'<body data-view="{view}"><header><strong>kvfleet</strong>{tabs}'
            f'<a href="{escape(runbook.href(base, ""))}" target="_blank" rel="noopener">Runbook</a>'
            '<span class="user">signed in as '
            f'{escape(user)} · <a href="{base}/api/{view}">JSON</a></span></header><main>'
            f"<h1>{escape(TITLES[view])}</h1>{colours.legend_html()}{body}</main></body></html>")
