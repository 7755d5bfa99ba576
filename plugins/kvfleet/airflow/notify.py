"""kvfleet's notifications: a gate is waiting, a run ended ``failed`` or ``completed_with_failures``, drift was
found (or a remediation refused). Sent to an SNS topic (through Airflow's AWS connection and the amazon
provider's ``SnsHook``: boto3 ``sns.publish``) and/or a generic webhook (one HTTP POST of JSON).

Settings (environment; see docs/notifications.md):

- ``KVFLEET_NOTIFY_SNS_TOPIC_ARN``: the topic; ``KVFLEET_NOTIFY_AWS_CONN_ID`` (default ``aws_default``) and
  ``KVFLEET_NOTIFY_REGION`` (default: the topic ARN's region);
- ``KVFLEET_NOTIFY_WEBHOOK_URL``: an ``http(s)://`` URL that receives ``POST`` ``application/json``;
- ``KVFLEET_NOTIFY_TIMEOUT_S``: per attempt, 1–60 (default 5);
- ``KVFLEET_AIRFLOW_URL`` (default Airflow's ``[api] base_url``): for the links to the gate and the kvfleet page;
  ``KVFLEET_RUNBOOK_URL``: the runbook's URL, linked from the messages.

Neither destination set: nothing is sent. A notification never fails a run: every error (a refused publish,
an unreachable webhook, a bad setting) is logged and the callback returns. There is no retry loop: the webhook
gets one attempt, SNS at most two (botocore ``standard`` mode, ``total_max_attempts=2``), each bounded by the
timeout.

Wiring (the DAG files own it): ``gate_waiting_notifier()`` goes in a HITL operator's ``notifiers``;
``run_end_notifier()`` after the run-status callback in a DAG's ``on_failure_callback``/``on_success_callback``
lists; ``notify_drift(result, run_key)`` at the end of a drift check of one cluster. Parsing a DAG file that
imports this module imports ``airflow.sdk`` only; boto3 and the history load when a notification is sent.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseNotifier

from kvfleet.airflow.gates import Links, airflow_base_url, required_actions_url

log = logging.getLogger(__name__)
SNS_SUBJECT_MAX = 99  # SNS: fewer than 100 characters, no line breaks
SNS_MESSAGE_MAX = 200_000  # SNS allows 256 KiB
RUN_END_STATUSES = frozenset({"failed", "completed_with_failures"})
GATE_WAITING, RUN_ENDED, DRIFT_FOUND = "gate_waiting", "run_ended", "drift_found"


class SettingError(ValueError):
    pass


@dataclass(frozen=True)
class NotifySettings:
    sns_topic_arn: str = ""
    aws_conn_id: str | None = "aws_default"
    region: str | None = None
    webhook_url: str = ""
    timeout_s: float = 5.0
    airflow_url: str = ""
    runbook_url: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NotifySettings:
        """The settings from the environment; raises SettingError naming the variable, value and fix."""
        env = os.environ if env is None else env
        topic = env.get("KVFLEET_NOTIFY_SNS_TOPIC_ARN", "").strip()
        if topic and not (topic.startswith("arn:") and topic.count(":") >= 5):
            raise SettingError(f"KVFLEET_NOTIFY_SNS_TOPIC_ARN: {topic[:120]!r} is not an SNS topic ARN; use "
                               "arn:aws:sns:<region>:<account>:<topic>")
        url = env.get("KVFLEET_NOTIFY_WEBHOOK_URL", "").strip()
        if url and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname):
            raise SettingError(f"KVFLEET_NOTIFY_WEBHOOK_URL: {_safe_url(url)!r} is not an http(s) URL; use "
                               "https://host/path")
        raw = env.get("KVFLEET_NOTIFY_TIMEOUT_S", "").strip() or "5"
        try:
            timeout = float(raw)
        except ValueError:
            timeout = -1.0
        if not 1 <= timeout <= 60:
            raise SettingError(f"KVFLEET_NOTIFY_TIMEOUT_S: {raw[:20]!r} is not a number of seconds from 1 to 60; "
                               "pick one in range (default 5)")
        region = env.get("KVFLEET_NOTIFY_REGION", "").strip() or (topic.split(":")[3] if topic else "") or None
        return cls(sns_topic_arn=topic, aws_conn_id=env.get("KVFLEET_NOTIFY_AWS_CONN_ID", "").strip() or "aws_default",
                   region=region, webhook_url=url, timeout_s=timeout,
                   airflow_url=airflow_base_url(env),
                   runbook_url=env.get("KVFLEET_RUNBOOK_URL", "").strip())

    @property
    def enabled(self) -> bool:
        return bool(self.sns_topic_arn or self.webhook_url)

    @property
    def links(self) -> Links:
        return Links(page=f"{self.airflow_url}/kvfleet" if self.airflow_url else "", runbook=self.runbook_url)


def _safe_url(url: str) -> str:
    """A URL for the log: scheme, host and port only (a webhook's path or query often carries its secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}{f':{parts.port}' if parts.port else ''}/…"


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
    if settings.sns_topic_arn:
        results["sns"] = _guard("sns", event, lambda: _publish_sns(event, settings))
    if settings.webhook_url:
        results["webhook"] = _guard(f"webhook {_safe_url(settings.webhook_url)}", event,
                                    lambda: _post_webhook(event, settings))
    return results


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


def _post_webhook(event: Event, settings: NotifySettings) -> None:
    body = json.dumps(event.payload(), default=str).encode()
    request = urllib.request.Request(settings.webhook_url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "kvfleet-notify"})
    with urllib.request.urlopen(request, timeout=settings.timeout_s) as response:
        status = int(response.status)
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


def drift_event(result: Mapping[str, Any], run_key: str, settings: NotifySettings) -> Event | None:
    """The drift check of one cluster (``stages.drift.DriftResult.as_dict()``): an event when it opened new
    findings, found the cluster unreachable, or a remediation was refused or failed; None otherwise."""
    cluster = str(result.get("cluster") or "?")
    opened = int((result.get("sync") or {}).get("opened") or 0)
    not_done = [r for r in result.get("remediations") or [] if r.get("outcome") in ("refused", "failed")]
    unreachable = result.get("reachable") is False
    if not (opened or not_done or unreachable):
        return None
    findings = list(result.get("findings") or [])
    parts = [f"{opened} new finding(s)" if opened else "", "unreachable" if unreachable else "",
             f"{len(not_done)} remediation(s) refused or failed" if not_done else ""]
    subject = f"kvfleet drift on {cluster}: " + ", ".join(p for p in parts if p)
    lines = [f"Drift check `{run_key}` on **{cluster}**: {len(findings)} open finding(s)."]
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
    return Event(DRIFT_FOUND, subject, "\n".join(x for x in lines if x), page,
                 {"kind": DRIFT_FOUND, "cluster": cluster, "run_key": run_key})


# ---- entry points for the DAGs ---------------------------------------------------------------------------------


def _settings(settings: NotifySettings | None) -> NotifySettings | None:
    if settings is not None:
        return settings
    try:
        return NotifySettings.from_env()
    except SettingError as exc:
        log.error("kvfleet: notifications are off: %s", exc)
        return None


def notify_drift(result: Mapping[str, Any], run_key: str, settings: NotifySettings | None = None) -> dict[str, str]:
    """Call at the end of one cluster's drift check; never raises."""
    try:
        chosen = _settings(settings)
        event = drift_event(result, run_key, chosen) if chosen and chosen.enabled else None
        return send(event, chosen) if event and chosen else {}
    except Exception:
        log.exception("kvfleet: the drift notification could not be built")
        return {}


class KvfleetNotifier(BaseNotifier):
    """An Airflow notifier (``airflow.sdk.BaseNotifier``) for kvfleet's events; ``kind`` is ``gate_waiting``
    (in a HITL operator's ``notifiers``) or ``run_ended`` (a DAG callback, after the run-status callback).
    Its texts are never rendered as Jinja templates (``template_fields`` is empty)."""

    template_fields: Sequence[str] = ()

    def __init__(self, kind: str, settings: NotifySettings | None = None,
                 statuses: frozenset[str] = RUN_END_STATUSES) -> None:
        super().__init__()
        if kind not in (GATE_WAITING, RUN_ENDED):
            raise ValueError(f"kind: {kind!r} is not one of {GATE_WAITING}, {RUN_ENDED}")
        self.kind, self.settings, self.statuses = kind, settings, statuses
        self.last_results: dict[str, str] = {}

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Nothing to render (a gate's text may contain ``{{``): no Jinja environment is built."""

    def notify(self, context: Any) -> None:
        try:
            settings = _settings(self.settings)
            if settings is None or not settings.enabled:
                return
            event = self._gate(context, settings) if self.kind == GATE_WAITING else self._run_end(context, settings)
            self.last_results = send(event, settings) if event is not None else {}
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
        from kvfleet.history.repo import History

        facts = dag_run_facts(context)
        run = History().run(facts["run_key"]) or {"dag_id": facts["dag_id"], "run_id": facts["run_id"],
                                                  "status": "failed", "reason": context.get("reason")}
        return run_end_event(run, settings, self.statuses)


def gate_waiting_notifier(settings: NotifySettings | None = None) -> KvfleetNotifier:
    return KvfleetNotifier(GATE_WAITING, settings)


def run_end_notifier(settings: NotifySettings | None = None,
                     statuses: frozenset[str] = RUN_END_STATUSES) -> KvfleetNotifier:
    return KvfleetNotifier(RUN_ENDED, settings, statuses)
