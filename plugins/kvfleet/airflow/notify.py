"""kvfleet's notifications: a gate is waiting, a run ended ``failed`` or ``completed_with_failures``, drift was
found (or a remediation refused). Sent to an SNS topic (through Airflow's AWS connection and the amazon
provider's ``SnsHook``: boto3 ``sns.publish``) and/or a generic webhook (one HTTP POST of JSON).

Settings (environment, read through ``kvfleet.settings`` when a notification is sent; see docs/notifications.md
and docs/settings.md):

- ``KVFLEET_NOTIFY_SNS_TOPIC_ARN``: the topic; ``KVFLEET_NOTIFY_AWS_CONN_ID`` (default ``aws_default``) and
  ``KVFLEET_NOTIFY_REGION`` (default: the topic ARN's region);
- ``KVFLEET_NOTIFY_WEBHOOK_URL``: an ``http(s)://`` URL that receives ``POST`` ``application/json``;
- ``KVFLEET_NOTIFY_TIMEOUT_S``: per attempt, 1–60 (default 5);
- ``KVFLEET_AIRFLOW_URL`` (default Airflow's ``[api] base_url``): for the links to the gate and the kvfleet page;
  ``KVFLEET_RUNBOOK_URL``: the runbook's URL, linked from the messages.

Per LOB: a LOB of the inventory may name its own destinations (``lobs[].notify.sns_topic_arn``,
``lobs[].notify.webhook_url``). An event is routed to the LOBs it concerns (a gate: its wave's endpoints; a
run: the LOBs of its scope; drift: the LOBs of the new findings, or of the cluster's endpoints for a finding on
the cluster itself): each of them gets it at its own destinations, or at the global ones above when it names
none; an event that concerns no LOB (or whose inventory cannot be read) goes to the global ones. With
``KVFLEET_NOTIFY_GLOBAL=always`` the global destinations get every event as well (default ``fallback``).

No destination set: nothing is sent. A notification never fails a run: every error (a refused publish,
an unreachable webhook, a bad setting) is logged and the callback returns. There is no retry loop: the webhook
gets one attempt, SNS at most two (botocore ``standard`` mode, ``total_max_attempts=2``), each bounded by the
timeout.

Wiring: the DAG files put ``kvfleet.airflow.callbacks.gate_waiting_notifier()`` in a HITL operator's
``notifiers`` (it imports this module and calls ``gate_waiting_notifier()`` only when the gate starts waiting, so
that parsing a DAG file does not import this module); ``callbacks.on_dag_success``/``on_dag_failure`` call
``run_end_notifier()`` after the run-status callback; ``notify_drift(result, run_key)`` runs at the end of a
drift check of one cluster. Importing this module imports ``airflow.sdk``, ``urllib.request`` and
``kvfleet.airflow.gates`` only; boto3 and the history load when a notification is sent.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseNotifier

from kvfleet.airflow.gates import Links, airflow_base_url, required_actions_url
from kvfleet.fleet.shared_rules import NOT_A_URL, redact_url
from kvfleet.history.clusters import filter_values
from kvfleet.settings import ConfigError, Settings, load_settings

if TYPE_CHECKING:
    from kvfleet.history.repos import HistoryRepos

log = logging.getLogger(__name__)
SNS_SUBJECT_MAX = 99  # SNS: fewer than 100 characters, no line breaks
SNS_MESSAGE_MAX = 200_000  # SNS allows 256 KiB
RUN_END_STATUSES = frozenset({"failed", "completed_with_failures"})
GATE_WAITING, RUN_ENDED, DRIFT_FOUND = "gate_waiting", "run_ended", "drift_found"


@dataclass(frozen=True)
class NotifySettings:
    sns_topic_arn: str = ""
    aws_conn_id: str | None = "aws_default"
    region: str | None = None
    webhook_url: str = ""
    timeout_s: float = 5.0
    airflow_url: str = ""
    runbook_url: str = ""
    global_always: bool = False  # the global destinations get every event, not only those no LOB takes
    label: str = ""  # "" for the global destinations, else the LOB whose destinations these are

    @classmethod
    def from_settings(cls, s: Settings) -> NotifySettings:
        """The notification part of kvfleet's settings (``kvfleet.settings``, validated there)."""
        topic = s.notify_sns_topic_arn
        return cls(sns_topic_arn=topic, aws_conn_id=s.notify_aws_conn_id or "aws_default",
                   region=s.notify_region or (topic.split(":")[3] if topic else "") or None,
                   webhook_url=s.notify_webhook_url, timeout_s=s.notify_timeout_s, airflow_url=airflow_base_url(s),
                   runbook_url=s.runbook_url, global_always=s.notify_global == "always")

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> NotifySettings:
        """Read now from ``env`` (default: the environment); raises ConfigError naming the variable, value and fix."""
        return cls.from_settings(load_settings(env))

    @property
    def enabled(self) -> bool:
        """The global destinations are set (a LOB of the inventory may name its own either way)."""
        return bool(self.sns_topic_arn or self.webhook_url)

    @property
    def links(self) -> Links:
        return Links(page=f"{self.airflow_url}/kvfleet" if self.airflow_url else "", runbook=self.runbook_url)


def _safe_url(url: str) -> str:
    """A URL for the log: scheme, host and port only (``kvfleet.fleet.shared_rules.redact_url``)."""
    return redact_url(url) or NOT_A_URL


@dataclass(frozen=True)
class Event:
    kind: str  # gate_waiting | run_ended | drift_found
    subject: str
    text: str  # markdown
    link: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        """The webhook's JSON body."""
        return {"source": "kvfleet", "kind": self.kind, "subject": self.subject, "text": self.text,
                "link": self.link or None, "attributes": dict(self.attributes)}

    def message(self) -> str:
        text = f"{self.text}\n\n{self.link}" if self.link else self.text
        return text[:SNS_MESSAGE_MAX]


# ---- sending ---------------------------------------------------------------------------------------------------


def send(event: Event, settings: NotifySettings) -> dict[str, str]:
    """Send ``event`` to every configured destination; returns ``{destination: "sent" | "failed: …"}``. Never
    raises."""
    results: dict[str, str] = {}
    tag = f"[{settings.label}]" if settings.label else ""
    if settings.sns_topic_arn:
        results[f"sns{tag}"] = _guard(f"sns{tag}", event, lambda: _publish_sns(event, settings))
    if settings.webhook_url:
        results[f"webhook{tag}"] = _guard(f"webhook{tag} {_safe_url(settings.webhook_url)}", event,
                                          lambda: _post_webhook(event, settings))
    return results


# ---- routing per LOB -------------------------------------------------------------------------------------------


def _lob_destinations(inventory: Any, lob: str) -> tuple[str, str]:
    """(topic ARN, webhook URL) a LOB of the inventory names; ("", "") when it names none or is unknown.
    Read with getattr: an inventory without the fields (an older one) has no LOB destinations."""
    for item in getattr(inventory, "lobs", None) or ():
        if getattr(item, "name", None) == lob:
            to = getattr(item, "notify", None)
            return (str(getattr(to, "sns_topic_arn", None) or "").strip(),
                    str(getattr(to, "webhook_url", None) or "").strip())
    return "", ""


def route(settings: NotifySettings, lobs: Iterable[str | None], inventory: Any | None) -> list[NotifySettings]:
    """The destinations of an event that concerns ``lobs``: each LOB's own (from the inventory), and the global
    ones for the LOBs that name none, for an event that concerns no LOB, or always with ``global_always``. One
    entry per distinct destination; a LOB's topic is published in its own ARN's region."""
    out: list[NotifySettings] = []
    seen: set[tuple[str, str]] = set()
    need_global = settings.global_always
    concerned = sorted({lob for lob in lobs if lob})
    for lob in concerned:
        topic, url = _lob_destinations(inventory, lob) if inventory is not None else ("", "")
        dest = (topic, url)
        if not (topic or url):
            need_global = True
        elif dest not in seen:
            seen.add(dest)
            region = topic.split(":")[3] if topic.count(":") >= 5 else settings.region
            out.append(replace(settings, sns_topic_arn=topic, webhook_url=url, region=region or settings.region,
                               label=lob))
    if (need_global or not concerned) and settings.enabled \
            and (settings.sns_topic_arn, settings.webhook_url) not in seen:
        out.insert(0, settings)
    return out


def send_routed(event: Event, settings: NotifySettings, lobs: Iterable[str | None],
                inventory: Any | None) -> dict[str, str]:
    """Send ``event`` to its LOBs' destinations (``route``); the event's attributes name the LOBs. Never raises."""
    concerned = sorted({lob for lob in lobs if lob})
    if concerned:
        event = replace(event, attributes={**event.attributes, "lobs": ",".join(concerned)[:250]})
    results: dict[str, str] = {}
    for dest in route(settings, concerned, inventory):
        results.update(send(event, dest))
    return results


def load_fleet(run_key: str | None, history: Any | None = None) -> Any | None:
    """The inventory the run pinned when it started (``kvfleet.fleet.pinning``; never the file as it is now), or
    None (logged) when the run has none or it cannot be read: the event then goes to the global destinations."""
    if not run_key:
        return None
    try:
        from kvfleet.fleet.pinning import Pinned, inventory_of

        pinned = (history if history is not None else _history()).runs.pinned(run_key)
        if pinned is None:
            log.warning("kvfleet: notification routing reads no LOB destinations: run %s has no pinned inventory",
                        run_key[:200])
            return None
        return inventory_of(Pinned(**pinned))
    except Exception as exc:
        log.warning("kvfleet: notification routing reads no LOB destinations: the inventory of run %s could not "
                    "be read (%s: %s)", run_key[:200], type(exc).__name__, str(exc)[:200])
        return None


def lobs_of(inventory: Any | None, *, clusters: Iterable[str] = (), endpoints: Iterable[str] = (),
            lobs: Iterable[str] = ()) -> set[str]:
    """The LOBs an event concerns: ``lobs`` as given, the LOBs of ``endpoints`` (``namespace/name`` or
    ``cluster:namespace/name``; within ``clusters`` when given), or else of every endpoint on ``clusters``."""
    out = {lob for lob in lobs if lob}
    if inventory is None:
        return out
    from kvfleet.fleet.cluster_ref import candidates

    named = [c for c in clusters if c]  # a cluster's key, or a name (of every cluster that has it)
    chosen = [cl for c in named for cl in candidates(c, getattr(inventory, "clusters", None) or ())]
    wanted = {e for e in endpoints if e}
    all_eps = tuple(getattr(inventory, "endpoints", None) or ())
    if wanted:
        for ep in all_eps:
            if (ep.ref in wanted or ep.key in wanted) and (not named or any(ep.on(cl) for cl in chosen)):
                out.add(ep.lob)
    elif named and not out:
        out |= {ep.lob for ep in all_eps if any(ep.on(cl) for cl in chosen)}
    return {lob for lob in out if lob}


def _guard(where: str, event: Event, call: Any) -> str:
    try:
        call()
    except Exception as exc:
        log.error("kvfleet: %s notification %r to %s failed (%s: %s); the run goes on", event.kind,
                  event.subject, where, type(exc).__name__, str(exc)[:300])
        return f"failed: {type(exc).__name__}"
    log.info("kvfleet: %s notification sent to %s: %s", event.kind, where, event.subject)
    return "sent"


def _publish_sns(event: Event, settings: NotifySettings) -> None:
    from airflow.providers.amazon.aws.hooks.sns import SnsHook
    from botocore.config import Config

    config = Config(connect_timeout=settings.timeout_s, read_timeout=settings.timeout_s,
                    retries={"total_max_attempts": 2, "mode": "standard"})
    hook = SnsHook(aws_conn_id=settings.aws_conn_id, region_name=settings.region,  # type: ignore[no-untyped-call]
                   config=config)
    subject = " ".join(event.subject.split())
    if len(subject) > SNS_SUBJECT_MAX:
        subject = subject[:SNS_SUBJECT_MAX - 1] + "…"
    hook.publish_to_target(target_arn=settings.sns_topic_arn, message=event.message(), subject=subject,
                           message_attributes={k: v for k, v in event.attributes.items() if v})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook's redirect is never followed (it could point the POST, or a GET after it, at an internal
    address): the 3xx is the answer, and a failure."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _post_webhook(event: Event, settings: NotifySettings) -> None:
    body = json.dumps(event.payload(), default=str).encode()
    request = urllib.request.Request(settings.webhook_url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "kvfleet-notify"})
    try:
        with _OPENER.open(request, timeout=settings.timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        if 300 <= exc.code < 400:
            raise RuntimeError(f"{_safe_url(settings.webhook_url)} answered HTTP {exc.code}, a redirect: not "
                               "followed (point the webhook at its final URL)") from None
        raise
    if not 200 <= status < 300:
        raise RuntimeError(f"{_safe_url(settings.webhook_url)} answered HTTP {status}, not 2xx")


# ---- events ----------------------------------------------------------------------------------------------------


def gate_event(*, dag_id: str, run_id: str, task_id: str, map_index: int, subject: str, body: str | None,
               options: Sequence[str], settings: NotifySettings) -> Event:
    """A gate is waiting for a human: its subject, its evidence, and the link where it is answered."""
    link = required_actions_url(settings.airflow_url, dag_id, run_id, task_id, map_index) \
        if settings.airflow_url else ""
    text = f"{body or ''}\n\nOptions: {', '.join(options)}.".strip()
    return Event(GATE_WAITING, f"kvfleet gate waiting: {subject}", text, link,
                 {"kind": GATE_WAITING, "dag_id": dag_id, "run_id": run_id, "task_id": task_id})


def run_end_event(run: Mapping[str, Any], settings: NotifySettings,
                  statuses: frozenset[str] = RUN_END_STATUSES) -> Event | None:
    """A run that ended with one of ``statuses`` (its row in the history's ``runs``); None for any other."""
    status = str(run.get("status") or "")
    if status not in statuses:
        return None
    dag_id, run_id = str(run.get("dag_id") or "?"), str(run.get("run_id") or "?")
    summary = run.get("summary") or {}
    reason = run.get("reason") or (summary.get("reason") if isinstance(summary, Mapping) else None)
    lines = [f"**{dag_id}** run `{run_id}` ended **{status}**."]
    if reason:
        lines.append(f"Reason: {reason}")
    if isinstance(summary, Mapping):
        for key in ("changed", "unchanged", "failed", "planned", "remediations_not_done", "aborted"):
            if summary.get(key):
                lines.append(f"- {key}: {json.dumps(summary[key], default=str)[:500]}")
    links = settings.links
    page = links.view("runs", dag_id=dag_id)
    book = links.runbook_section("rollout" if dag_id == "kvfleet_rollout" else "drift"
                                 if dag_id == "kvfleet_drift_check" else "curvine_upgrade"
                                 if dag_id.startswith("kvfleet_curvine") else "verification")
    lines += [f"Runs on the kvfleet page: {page}" if page else "", f"Runbook: {book}" if book else ""]
    link = f"{settings.airflow_url}/dags/{dag_id}/runs/{run_id}" if settings.airflow_url else ""
    return Event(RUN_ENDED, f"kvfleet {dag_id}: run {status}", "\n".join(x for x in lines if x), link,
                 {"kind": RUN_ENDED, "dag_id": dag_id, "run_id": run_id, "status": status})


SEVERITY_ORDER = ("critical", "high", "medium", "low")


def _worst(findings: Sequence[Mapping[str, Any]]) -> str:
    present = {str(f.get("severity") or "") for f in findings}
    return next((s for s in SEVERITY_ORDER if s in present), "")


def drift_event(result: Mapping[str, Any], run_key: str, settings: NotifySettings,
                opened: Sequence[Mapping[str, Any]] | None = None) -> Event | None:
    """The drift check of one cluster (``stages.drift.DriftResult.as_dict()``): an event when it opened new
    findings, found the cluster unreachable, or a remediation was refused or failed; None otherwise.
    ``opened``: the findings this check opened (read from the history), named in the subject by kind, worst
    first, so that an operator paused past its threshold or a Curvine data loss reads as such."""
    cluster = str(result.get("cluster") or "?")
    count = int((result.get("sync") or {}).get("opened") or 0)
    not_done = [r for r in result.get("remediations") or [] if r.get("outcome") in ("refused", "failed")]
    unreachable = result.get("reachable") is False
    if not (count or not_done or unreachable):
        return None
    findings = list(result.get("findings") or [])
    new = sorted(opened or [], key=lambda f: (SEVERITY_ORDER.index(f.get("severity"))
                                              if f.get("severity") in SEVERITY_ORDER else 9, str(f.get("kind"))))
    kinds = list(dict.fromkeys(str(f.get("kind")) for f in new))
    parts = [(f"{count} new finding(s)" + (f" ({', '.join(kinds)})" if kinds else "")) if count else "",
             "unreachable" if unreachable else "",
             f"{len(not_done)} remediation(s) refused or failed" if not_done else ""]
    subject = f"kvfleet drift on {cluster}: " + ", ".join(p for p in parts if p)
    lines = [f"Drift check `{run_key}` on **{cluster}**: {len(findings)} open finding(s)."]
    if new:
        named = ", ".join(f"{f.get('kind')} ({f.get('severity')})" for f in new[:10])
        lines.append(f"New in this check: {named}.")
    for f in findings[:20]:
        lines.append(f"- {f.get('severity')} {f.get('kind')} {f.get('object_ref') or f.get('endpoint') or ''} "
                     f"{f.get('field') or ''}: expected {f.get('expected')!r}, found {f.get('actual')!r}")
    if len(findings) > 20:
        lines.append(f"- …and {len(findings) - 20} more")
    for r in not_done:
        detail = r.get("detail") or {}
        lines.append(f"- remediation {r.get('action')} {r.get('outcome')}: "
                     f"{str(detail.get('reason') or detail.get('error') or '')[:300]}")
    links = settings.links
    page, book = links.view("drift", cluster=cluster), links.runbook_section("drift")
    lines += [f"Drift on the kvfleet page: {page}" if page else "", f"Runbook: {book}" if book else ""]
    worst = _worst(new) or ("critical" if unreachable else "") or _worst(findings)
    return Event(DRIFT_FOUND, subject, "\n".join(x for x in lines if x), page,
                 {"kind": DRIFT_FOUND, "cluster": cluster, "run_key": run_key, "severity": worst})


# ---- entry points for the DAGs ---------------------------------------------------------------------------------


def _settings(settings: NotifySettings | None) -> NotifySettings | None:
    if settings is not None:
        return settings
    try:
        return NotifySettings.load()
    except ConfigError as exc:
        log.error("kvfleet: notifications are off: %s", exc)
        return None


def _history() -> HistoryRepos:
    from kvfleet.history.repos import HistoryRepos

    return HistoryRepos.on()


def _drift_lobs(result: Mapping[str, Any], opened: Sequence[Mapping[str, Any]] | None,
                inventory: Any | None) -> set[str]:
    """The LOBs a drift event concerns: those of the findings it reports as new (all findings when which are new
    is unknown) and of the findings a refused or failed remediation covered; a finding on the cluster itself
    (no LOB) concerns every LOB with endpoints on the cluster."""
    cluster = str(result.get("cluster") or "")
    findings = list(result.get("findings") or [])
    by_fp = {f.get("fingerprint"): f for f in findings}
    chosen = list(opened) if opened is not None else findings
    for r in result.get("remediations") or []:
        if r.get("outcome") in ("refused", "failed"):
            chosen += [by_fp[fp] for fp in r.get("findings") or [] if fp in by_fp]
    lobs = {str(f["lob"]) for f in chosen if f.get("lob")}
    if any(not f.get("lob") for f in chosen) or result.get("reachable") is False or not chosen:
        lobs |= lobs_of(inventory, clusters=[cluster])
    return lobs


def notify_drift(result: Mapping[str, Any], run_key: str, settings: NotifySettings | None = None, *,
                 inventory: Any | None = None, history: Any | None = None) -> dict[str, str]:
    """Call at the end of one cluster's drift check; never raises. The findings this check opened and the
    inventory (the one the run pinned) are read from the history when not given."""
    try:
        chosen = _settings(settings)
        if chosen is None:
            return {}
        count = int((result.get("sync") or {}).get("opened") or 0)
        quiet = not (count or result.get("reachable") is False
                     or any(r.get("outcome") in ("refused", "failed") for r in result.get("remediations") or []))
        if quiet:
            return {}
        opened: list[dict[str, Any]] | None = None
        try:
            history = history if history is not None else _history()
            if count:
                asked = filter_values(history.engine, str(result.get("cluster") or "")) or []
                opened = list(history.queries.rows("ui_findings_opened", clusters=asked, run_key=run_key))
            if inventory is None:
                inventory = load_fleet(run_key, history)
        except Exception as exc:
            log.warning("kvfleet: the drift notification reads no history (%s: %s); it names every finding",
                        type(exc).__name__, str(exc)[:200])
        event = drift_event(result, run_key, chosen, opened)
        return send_routed(event, chosen, _drift_lobs(result, opened, inventory), inventory) if event else {}
    except Exception:
        log.exception("kvfleet: the drift notification could not be built")
        return {}


class KvfleetNotifier(BaseNotifier):
    """An Airflow notifier (``airflow.sdk.BaseNotifier``) for kvfleet's events; ``kind`` is ``gate_waiting``
    (in a HITL operator's ``notifiers``) or ``run_ended`` (a DAG callback, after the run-status callback).
    Its texts are never rendered as Jinja templates (``template_fields`` is empty). The event goes to the LOBs
    it concerns (``route``), read from the inventory the run pinned when it started."""

    template_fields: Sequence[str] = ()

    def __init__(self, kind: str, settings: NotifySettings | None = None,
                 statuses: frozenset[str] = RUN_END_STATUSES) -> None:
        super().__init__()
        if kind not in (GATE_WAITING, RUN_ENDED):
            raise ValueError(f"kind: {kind!r} is not one of {GATE_WAITING}, {RUN_ENDED}")
        self.kind, self.settings, self.statuses = kind, settings, statuses
        self.last_results: dict[str, str] = {}
        self.last_lobs: set[str] = set()

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Nothing to render (a gate's text may contain ``{{``): no Jinja environment is built."""

    def notify(self, context: Any) -> None:
        try:
            settings = _settings(self.settings)
            if settings is None:
                return
            params = _params(context)
            inventory = load_fleet(_run_key(context))
            if not settings.enabled and not _any_lob_destination(inventory):
                return
            if self.kind == GATE_WAITING:
                event: Event | None = self._gate(context, settings)
                self.last_lobs = _gate_lobs(context, params, inventory)
            else:
                event = self._run_end(context, settings)
                self.last_lobs = _run_lobs(params, inventory)
            self.last_results = send_routed(event, settings, self.last_lobs, inventory) if event else {}
        except Exception:
            log.exception("kvfleet: the %s notification could not be built", self.kind)

    @staticmethod
    def _gate(context: Any, settings: NotifySettings) -> Event:
        task, ti = context["task"], context["ti"]
        map_index = getattr(ti, "map_index", -1)
        return gate_event(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                          map_index=-1 if map_index is None else int(map_index), subject=str(task.subject),
                          body=task.body, options=list(task.options), settings=settings)

    def _run_end(self, context: Any, settings: NotifySettings) -> Event | None:
        from kvfleet.airflow.context import dag_run_facts

        facts = dag_run_facts(context)
        run = _history().runs.get(facts["run_key"]) or {"dag_id": facts["dag_id"], "run_id": facts["run_id"],
                                                   "status": "failed", "reason": context.get("reason")}
        return run_end_event(run, settings, self.statuses)


def _run_key(context: Any) -> str | None:
    """The run a notification is about: its DAG run's, else its task instance's (a HITL notifier's context)."""
    from kvfleet.airflow.context import dag_run_facts

    facts = dag_run_facts(context)
    ti = context.get("ti")
    dag_id = facts["dag_id"] if facts["dag_id"] != "unknown" else getattr(ti, "dag_id", None)
    run_id = facts["run_id"] if facts["run_id"] != "unknown" else getattr(ti, "run_id", None)
    return f"{dag_id}/{run_id}" if dag_id and run_id else None


def _params(context: Any) -> dict[str, Any]:
    params = context.get("params") or getattr(context.get("dag_run"), "conf", None) or {}
    try:
        return dict(params)
    except (TypeError, ValueError):
        return {}


def _any_lob_destination(inventory: Any | None) -> bool:
    return any(getattr(to := getattr(lob, "notify", None), "sns_topic_arn", None) or getattr(to, "webhook_url", None)
               for lob in getattr(inventory, "lobs", None) or ())


def _listed(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list | tuple) else []


def _gate_lobs(context: Any, params: Mapping[str, Any], inventory: Any | None) -> set[str]:
    """A wave gate concerns its wave's endpoints (the wave task's XCom: ``cluster``, ``endpoints``); another gate
    (the Curvine approval) every LOB on the run's clusters."""
    task, ti = context.get("task"), context.get("ti")
    wave: Mapping[str, Any] = {}
    wave_task = getattr(task, "wave_task_id", None)
    if wave_task and ti is not None and hasattr(ti, "xcom_pull"):
        try:
            wave = dict(ti.xcom_pull(task_ids=wave_task, map_indexes=ti.map_index) or {})
        except Exception as exc:
            log.warning("kvfleet: the gate's wave could not be read for routing (%s)", type(exc).__name__)
    if wave.get("cluster"):
        eps = [*(wave.get("endpoints") or {}), *_listed(wave.get("review"))]
        return lobs_of(inventory, clusters=[str(wave["cluster"])], endpoints=eps)
    clusters = _listed(params.get("clusters")) or [c.key for c in getattr(inventory, "clusters", None) or ()]
    return lobs_of(inventory, clusters=clusters, lobs=_listed(params.get("lobs")))


def _run_lobs(params: Mapping[str, Any], inventory: Any | None) -> set[str]:
    """A run concerns the LOBs of its scope: its ``lobs`` Param, else the LOBs of its endpoints or clusters, else
    every LOB of the inventory."""
    if lobs := _listed(params.get("lobs")):
        return set(lobs)
    if eps := _listed(params.get("endpoints")):
        return lobs_of(inventory, endpoints=eps)
    clusters = _listed(params.get("clusters")) or [c.key for c in getattr(inventory, "clusters", None) or ()]
    return lobs_of(inventory, clusters=clusters)


def gate_waiting_notifier(settings: NotifySettings | None = None) -> KvfleetNotifier:
    return KvfleetNotifier(GATE_WAITING, settings)


def run_end_notifier(settings: NotifySettings | None = None,
                     statuses: frozenset[str] = RUN_END_STATUSES) -> KvfleetNotifier:
    return KvfleetNotifier(RUN_ENDED, settings, statuses)
