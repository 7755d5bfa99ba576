"""The text of kvfleet's human gates: a subject a platform engineer reads at a glance, and a markdown body with
the evidence and what each option does.

Pure: every function takes the data (the wave's result, the verification rows, the open drift rows, the
preflight results) and returns text; nothing here reads the history or Airflow. Used by

- the wave gate of ``kvfleet_rollout`` (``kvfleet.airflow.operators.WaveGateOperator``), for its ``subject``
  and ``body`` when it asks a human (review of an inconclusive verification, or an approval);
- the approval of ``kvfleet_curvine_upgrade``;
- the kvfleet page (``/kvfleet/gates``), which shows a pending gate with the same evidence and links to
  Airflow's own Required Actions page for the answer.

``load_wave_evidence`` (the only function that reads) fetches a wave's rows from the history through the same
named queries as the CLI (``verifications``, ``open_drift``).

Airflow renders the HITL body as markdown; a subject is one line of plain text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

from kvfleet.settings import ConfigError, Settings, load_settings

log = logging.getLogger(__name__)
SUBJECT_MAX = 200
# kvfleet.stages.verify's pass rule, repeated here so the page does not import the kube client (a unit test
# checks that they agree).
PASS_HIT_RATIO = 0.99
SPEEDUP_TOLERANCE = 0.25
RUNBOOK_PATH = "docs/runbook.md"
# The runbook's sections an operator needs at a gate (GitHub-style anchors of its headings).
RUNBOOK_ANCHORS = {
    "rollout": "1-first-rollout-to-a-new-cluster",
    "drift": "3-drift-what-each-kind-means-and-what-to-do",
    "curvine_upgrade": "4-curvine-upgrade-kvfleet_curvine_upgrade-on-demand",
    "operator_paused": "7-recovering-from-an-operator-left-paused",
    "verification": "8-verifying-cross-pod-hits-on-demand-kvfleet_hit_verification-hourly",
    "freeze": "9-freeze-and-emergency-stop",
}
# Plain text and a sign every font has (no emoji: a browser or mail client without an emoji font shows boxes).
VERDICT_MARK = {"pass": "pass", "fail": "**FAIL**", "degraded": "⚠ degraded", "unverifiable": "⚠ unverifiable"}
REVIEW_OPTION_TEXT = {
    "Approve": "go on: this cluster's next wave starts; the inconclusive endpoints keep the tiered cache.",
    "Skip endpoint": "go on as with Approve, and record the inconclusive endpoints listed above as skipped by "
                     "review (they keep what they have; nothing is rolled back).",
    "Abort": "stop this cluster: its later waves are recorded `aborted` and the run ends aborted. Endpoints "
             "that already moved stay moved; the operator is restored by the teardown.",
}
APPROVAL_OPTION_TEXT = {
    "Approve": "go on: this cluster's next wave starts.",
    "Reject": "stop this cluster: its later waves are recorded `aborted` and the run ends aborted. Endpoints "
              "that already moved stay moved; the operator is restored by the teardown.",
}
CURVINE_OPTION_TEXT = {
    "Approve": "run the upgrade on every cluster listed, with every format flag forced false, snapshots before "
               "and after, post-checks, and (if asked) a rollback only to a revision with every flag false.",
    "Reject": "change nothing: the upgrade tasks are skipped and the run ends without touching Curvine.",
}


@dataclass(frozen=True)
class GateText:
    subject: str
    body: str


@dataclass(frozen=True)
class Links:
    """Where the body's links point. ``page`` is the kvfleet page (e.g. ``https://airflow.example.com/kvfleet``),
    ``runbook`` the runbook's URL (e.g. the repository's ``docs/runbook.md``); either may be empty (no link)."""

    page: str = ""
    runbook: str = ""

    def view(self, view: str, **params: Any) -> str:
        if not self.page:
            return ""
        query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
        return f"{self.page.rstrip('/')}/{view}" + (f"?{query}" if query else "")

    def runbook_section(self, topic: str) -> str:
        if not self.runbook:
            return ""
        anchor = RUNBOOK_ANCHORS.get(topic, "")
        return self.runbook + (f"#{anchor}" if anchor and "#" not in self.runbook else "")


def required_actions_url(airflow_base: str, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """Airflow 3.3's UI page where a human answers one gate (Required Actions of that task instance)."""
    mapped = f"/mapped/{map_index}" if map_index is not None and map_index >= 0 else ""
    return (f"{airflow_base.rstrip('/')}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
            f"/tasks/{quote(task_id, safe='')}{mapped}/required_actions")


# ---- formatting -----------------------------------------------------------------------------------------------


def md(value: Any) -> str:
    """A value as one markdown table cell: no pipe or newline breaks the table."""
    if value is None or value == "":
        return "–"
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def number(value: Any, fmt: str = "{:.2f}") -> str:
    if value is None:
        return "–"
    try:
        return fmt.format(float(value))
    except (TypeError, ValueError):
        return md(value)


def _waves_text(waves: Any) -> str:
    if isinstance(waves, list | tuple):
        items = [str(w) for w in waves]
        if not items:
            return "wave ?"
        return f"wave {items[0]}" if len(items) == 1 else f"waves {', '.join(items)}"
    return f"wave {waves}" if waves not in (None, "") else "wave ?"


def _wave_kind(waves: Any, slot: int | None) -> str:
    first = waves[0] if isinstance(waves, list | tuple) and waves else waves
    return " (canary)" if slot == 0 or first == 0 else ""


def _short_run(run_key: str) -> str:
    """``kvfleet_rollout/manual__2026-12-01T10:00:00+00:00`` -> ``manual 2026-12-01 10:00``."""
    run_id = run_key.split("/", 1)[-1]
    kind, _, when = run_id.partition("__")
    if not when:
        return run_id[:40]
    try:
        at = datetime.fromisoformat(when).astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        at = when[:16]
    return f"{kind} {at}"


def _subject(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SUBJECT_MAX else text[:SUBJECT_MAX - 1] + "…"


def bar_of(expected: Any, tolerance: float) -> float | None:
    """The speedup a verification must reach to pass: the published figure less the tolerance."""
    if expected is None:
        return None
    return float(expected) * (1 - tolerance)


# ---- evidence tables ------------------------------------------------------------------------------------------


def latest_per_endpoint(verifications: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The newest row per endpoint (rows with ``at``; without it, the last row given wins)."""
    out: dict[str, Mapping[str, Any]] = {}
    for row in verifications:
        key = str(row.get("endpoint"))
        seen = out.get(key)
        if seen is None or _at(row) >= _at(seen):
            out[key] = row
    return out


def _at(row: Mapping[str, Any]) -> str:
    at = row.get("at")
    return at.isoformat() if isinstance(at, datetime) else str(at or "")


def verification_table(endpoints: Mapping[str, str], verifications: Iterable[Mapping[str, Any]],
                       tolerance: float) -> str:
    """One row per endpoint of the wave: verdict, hit ratio, speedup against the gate's bar, diagnosis.
    ``endpoints`` is the wave's own summary (endpoint -> "verdict — diagnosis"), so an endpoint that failed
    before it could be verified still has its row."""
    latest = latest_per_endpoint(verifications)
    names = sorted(set(endpoints) | set(latest))
    if not names:
        return "_No endpoint was verified in this wave._"
    lines = ["| endpoint | LOB | verdict | hit ratio | speedup | bar to pass | published | diagnosis |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for name in names:
        row = latest.get(name, {})
        summary = endpoints.get(name, "")
        verdict = str(row.get("verdict") or summary.split(" — ", 1)[0].split(" ", 1)[0] or "?")
        diagnosis = row.get("diagnosis") or (summary.split(" — ", 1)[1] if " — " in summary else None)
        expected = row.get("expected_speedup")
        speedup = row.get("speedup")
        bar = bar_of(expected, tolerance)
        below = speedup is not None and bar is not None and float(speedup) < bar
        lines.append(
            f"| `{md(name)}` | {md(row.get('lob'))} | {VERDICT_MARK.get(verdict, md(verdict))} "
            f"| {number(row.get('hit_ratio'))} | {number(speedup, '{:.2f}×')}{' ⬇' if below else ''} "
            f"| {number(bar, '{:.2f}×')} | {number(expected, '{:.2f}×')} | {md(diagnosis)} |")
    return "\n".join(lines)


def drift_table(open_drift: Sequence[Mapping[str, Any]], cluster: str | None = None, limit: int = 20) -> str:
    rows = [r for r in open_drift if cluster is None or r.get("cluster") == cluster]
    if not rows:
        return "_No open drift._"
    lines = ["| kind | severity | endpoint / object | field | expected | actual | open since |",
             "|---|---|---|---|---|---|---|"]
    for r in rows[:limit]:
        first = r.get("first_seen")
        since = first.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if isinstance(first, datetime) else md(first)
        where = md(r.get("endpoint") or r.get("object_ref"))
        lines.append(f"| {md(r.get('kind'))} | {md(r.get('severity'))} | {where} "
                     f"| {md(r.get('field'))} | {md(r.get('expected'))} | {md(r.get('actual'))} | {since} |")
    if len(rows) > limit:
        lines.append(f"\n_…and {len(rows) - limit} more on the kvfleet page._")
    return "\n".join(lines)


def options_text(options: Sequence[str], meaning: Mapping[str, str], default: str | None,
                 timeout: timedelta | None) -> str:
    lines = [f"- **{o}**: {meaning.get(o, '')}".rstrip() for o in options]
    if default:
        after = f" within {_duration(timeout)}" if timeout else ""
        lines.append(f"\nIf nobody answers{after}, the gate takes **{default}**.")
    return "\n".join(lines)


def _duration(td: timedelta) -> str:
    minutes = int(td.total_seconds() // 60)
    if minutes % 60 == 0 and minutes >= 60:
        return f"{minutes // 60} h"
    return f"{minutes} min"


def _links_line(items: Sequence[tuple[str, str]]) -> str:
    shown = [f"[{label}]({url})" for label, url in items if url]
    return " · ".join(shown)


# ---- the gates ------------------------------------------------------------------------------------------------


def wave_gate_text(*, asked: str, run_key: str, wave: Mapping[str, Any], verifications: Iterable[Mapping[str, Any]],
                   open_drift: Sequence[Mapping[str, Any]], reason: str, tolerance: float = SPEEDUP_TOLERANCE,
                   slot: int | None = None,
                   options: Sequence[str] = (), default: str | None = None, timeout: timedelta | None = None,
                   links: Links | None = None) -> GateText:
    """Subject and body of a rollout wave gate. ``asked`` is ``ask_review`` (an inconclusive verification) or
    ``ask_approval`` (``approval=after_canary|every_wave``); ``wave`` is the wave task's result (``cluster``,
    ``waves``, ``endpoints``: endpoint -> summary, ``review``: the inconclusive endpoints)."""
    links = links or Links()
    cluster = str(wave.get("key") or wave.get("cluster") or "?")  # the key, as the history's rows name it
    waves = wave.get("waves")
    endpoints: Mapping[str, str] = wave.get("endpoints") or {}
    where = f"{cluster} {_waves_text(waves)}{_wave_kind(waves, slot)}"
    drift_here = [r for r in open_drift if r.get("cluster") == cluster]
    drift_note = f", {len(drift_here)} open drift" if drift_here else ""
    if asked == "ask_review":
        review = list(wave.get("review") or [])
        count = len(review) or sum(1 for v in endpoints.values() if v.startswith(("degraded", "unverifiable")))
        subject = (f"kvfleet rollout {where}: {count} of {len(endpoints)} endpoints inconclusive{drift_note} — "
                   f"approve, skip them, or abort? ({_short_run(run_key)})")
        meaning, default = REVIEW_OPTION_TEXT, default or "Abort"
        options = options or tuple(REVIEW_OPTION_TEXT)
        question = ("The wave's cross-pod verification was **inconclusive** (degraded or unverifiable): kvfleet "
                    "cannot tell whether the tiered cache works on these endpoints, so it asks before the next wave.")
    else:
        passed = sum(1 for v in endpoints.values() if v.startswith("pass"))
        subject = (f"kvfleet rollout {where}: {passed}/{len(endpoints)} endpoints verified{drift_note} — "
                   f"approve the next wave? ({_short_run(run_key)})")
        meaning, default = APPROVAL_OPTION_TEXT, default or "Reject"
        options = options or tuple(APPROVAL_OPTION_TEXT)
        question = "The `approval` Param asks a human to approve the next wave of this cluster."
    body = [
        f"**Run** `{md(run_key)}` · **cluster** `{md(cluster)}` · **{_waves_text(waves)}{_wave_kind(waves, slot)}**",
        "",
        question,
        f"kvfleet's gate: {md(reason)}.",
        "",
        f"### Verification of this wave (pass: hit ratio ≥ {PASS_HIT_RATIO:g} and speedup ≥ the bar, "
        f"published × {1 - tolerance:.2f})",
        verification_table(endpoints, verifications, tolerance),
        "",
        f"### Open drift on {md(cluster)}",
        drift_table(open_drift, cluster),
        "",
        "### What each option does",
        options_text(options, meaning, default, timeout),
    ]
    more = _links_line([
        ("Fleet view of this cluster", links.view("fleet", cluster=cluster)),
        ("Gate history", links.view("gates", run_key=run_key)),
        ("Drift on this cluster", links.view("drift", cluster=cluster)),
        ("Runbook: verification", links.runbook_section("verification")),
        ("Runbook: drift", links.runbook_section("drift")),
    ])
    if more:
        body += ["", more]
    return GateText(_subject(subject), "\n".join(body))


def curvine_approval_text(*, run_key: str, version: str, clusters: Sequence[str],
                          preflight: Sequence[Mapping[str, Any]], open_drift: Sequence[Mapping[str, Any]] = (),
                          timeout: timedelta | None = None, links: Links | None = None) -> GateText:
    """Subject and body of the Curvine upgrade's approval: per cluster the current revision and chart, the
    preflight outcome, the size of the values diff and the command; the open drift; what each option does."""
    links = links or Links()
    names = list(clusters) or [str(p.get("cluster")) for p in preflight]
    shown = ", ".join(names[:4]) + (f" +{len(names) - 4} more" if len(names) > 4 else "")
    drift_here = [r for r in open_drift if r.get("cluster") in names]
    loss = [r for r in drift_here if "loss" in str(r.get("kind") or "") or "format" in str(r.get("kind") or "")]
    note = f", {len(drift_here)} open drift" if drift_here else ""
    subject = (f"kvfleet Curvine upgrade to {version or '?'} on {shown}{note} — approve? ({_short_run(run_key)})")
    lines = ["| cluster | now (revision · chart) | preflight | values diff | command |", "|---|---|---|---|---|"]
    for p in preflight:
        diff = str(p.get("diff") or "")
        added = sum(1 for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))
        removed = sum(1 for line in diff.splitlines() if line.startswith("-") and not line.startswith("---"))
        lines.append(f"| `{md(p.get('cluster'))}` | {md(p.get('revision'))} · {md(p.get('chart_version'))} "
                     f"| {md(p.get('outcome'))} | +{added} −{removed} lines | `{md(p.get('command'))}` |")
    body = [
        f"**Run** `{md(run_key)}` · **upgrade Curvine to** `{md(version)}` · **clusters** {md(', '.join(names))}",
        "",
        "Every format flag (`cluster.formatMaster`, `formatWorker`, `formatJournal`) stays **false**: approving "
        "does not allow an override that sets one. The preflight task's log has each cluster's full values diff.",
        "",
        "### Preflight per cluster",
        "\n".join(lines) if preflight else "_No preflight result (see the preflight task's log)._",
        "",
        "### Open drift on these clusters",
        drift_table(drift_here) if drift_here else "_No open drift._",
    ]
    if loss:
        body += ["", f"**{len(loss)} open finding(s) about format flags or data loss: read them before approving.**"]
    body += ["", "### What each option does", options_text(tuple(CURVINE_OPTION_TEXT), CURVINE_OPTION_TEXT,
                                                          "Reject", timeout)]
    more = _links_line([("Curvine view", links.view("curvine", cluster=names[0] if len(names) == 1 else None)),
                        ("Drift", links.view("drift")),
                        ("Runbook: Curvine upgrade", links.runbook_section("curvine_upgrade"))])
    if more:
        body += ["", more]
    return GateText(_subject(subject), "\n".join(body))


# ---- reading the evidence (the only I/O here) ------------------------------------------------------------------


def load_wave_evidence(history: Any, run_key: str, cluster: str, endpoints: Iterable[str],
                       window: timedelta = timedelta(days=2)) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(this run's verifications of the wave's endpoints on ``cluster``, the open drift on ``cluster``), through
    the named queries ``verifications`` and ``open_drift``."""
    cutoff = datetime.now(UTC) - window
    rows: list[dict[str, Any]] = []
    for endpoint in sorted(set(endpoints)):
        rows += [r for r in history.queries.rows("verifications", cutoff=cutoff, lob=None, endpoint=endpoint)
                 if r.get("run_key") == run_key and r.get("cluster") == cluster]
    drift = [r for r in history.queries.rows("open_drift") if r.get("cluster") == cluster]
    return rows, drift


# ---- entry points for the operators (read the evidence, build the text; never raise) ---------------------------


def airflow_base_url(settings: Settings) -> str:
    """The UI's public URL: ``KVFLEET_AIRFLOW_URL``, else Airflow's ``[api] base_url``, else empty (no links)."""
    url = settings.airflow_url
    if not url:
        try:
            from airflow.configuration import conf

            url = str(conf.get("api", "base_url", fallback="") or "")
        except Exception:  # no Airflow configuration (a bare CLI)
            url = ""
    return url.rstrip("/")


def links_from_settings(settings: Settings | None = None) -> Links:
    """The links of a gate's text, from ``settings`` (default: read now). Never raises: a bad setting is logged
    and the text has no links."""
    try:
        chosen = settings or load_settings()
    except ConfigError as exc:
        log.error("kvfleet: the gate's text has no links: %s", exc)
        return Links()
    base = airflow_base_url(chosen)
    return Links(page=f"{base}/kvfleet" if base else "", runbook=chosen.runbook_url)


def for_wave_gate(*, asked: str, run_key: str, wave: Mapping[str, Any], reason: str, params: Mapping[str, Any],
                  slot: int | None = None, options: Sequence[str] = (), default: str | None = None,
                  timeout: timedelta | None = None, history: Any = None) -> GateText:
    """The wave gate's text with its evidence read from the history (``history`` or ``HistoryRepos.on()``). When the
    history cannot be read, the text says so and still shows the wave's own summary: a gate is never blocked
    by its text."""
    cluster = str(wave.get("key") or wave.get("cluster") or "")  # the key, as the history's rows name it
    rows: list[dict[str, Any]] = []
    drift: list[dict[str, Any]] = []
    try:
        if history is None:
            from kvfleet.history.repos import HistoryRepos

            history = HistoryRepos.on()
        rows, drift = load_wave_evidence(history, run_key, cluster, (wave.get("endpoints") or {}).keys())
    except Exception as exc:
        log.exception("kvfleet: the gate's evidence could not be read from the history")
        reason = f"{reason} (the history could not be read: {type(exc).__name__}; the figures below are the wave's)"
    tolerance = float(params.get("speedup_tolerance") or SPEEDUP_TOLERANCE)
    return wave_gate_text(asked=asked, run_key=run_key, wave=wave, verifications=rows, open_drift=drift,
                          reason=reason, tolerance=tolerance, slot=slot, options=options, default=default,
                          timeout=timeout, links=links_from_settings())


def for_curvine_approval(*, run_key: str, params: Mapping[str, Any], preflight: Sequence[Mapping[str, Any]],
                         timeout: timedelta | None = None, history: Any = None) -> GateText:
    """The Curvine upgrade approval's text; the open drift is read from the history when it can be."""
    clusters = [str(p.get("cluster")) for p in preflight if p.get("cluster")] or list(params.get("clusters") or [])
    drift: list[dict[str, Any]] = []
    try:
        if history is None:
            from kvfleet.history.repos import HistoryRepos

            history = HistoryRepos.on()
        drift = [r for r in history.queries.rows("open_drift") if r.get("cluster") in clusters]
    except Exception:
        log.exception("kvfleet: the open drift could not be read for the approval's text")
    return curvine_approval_text(run_key=run_key, version=str(params.get("version") or ""), clusters=clusters,
                                 preflight=preflight, open_drift=drift, timeout=timeout, links=links_from_settings())
