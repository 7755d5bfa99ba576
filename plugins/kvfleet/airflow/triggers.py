"""Triggers: kvfleet's waits and its drift watch run in Airflow's triggerer, not in a worker slot (issue 19,
ARCHITECTURE principle 9).

Called from the operators and task bodies that ``self.defer()`` (``LeaseFreeTrigger``, ``ClusterReadyTrigger``,
``KubeReadyTrigger``)
and from ``dags/kvfleet_drift_watch.py`` (``KubeWatchTrigger`` inside an ``AssetWatcher``). The bake needs no
trigger of ours: it is Airflow's own ``DateTimeTrigger``.

Shapes follow the real sources installed here (apache-airflow-core 3.3.2, apache-airflow-providers-amazon
9.39.0, -cncf-kubernetes 10.25.0, -standard 1.21.0):
- ``airflow/triggers/base.py``: ``serialize()`` returns ``(classpath, kwargs)`` that re-create the trigger;
  ``run()`` is an async generator of ``TriggerEvent``; a ``BaseEventTrigger`` (event-driven scheduling) is
  identified by the hash of its classpath and kwargs, so its kwargs must not change while it runs, and the
  triggerer injects ``asset_state_store`` (``AssetStateStoreAccessors``) before ``run()`` — the place a watcher
  keeps its watermark across triggerer restarts (``airflow/jobs/triggerer_job_runner.py``). An event becomes an
  asset event with ``extra={"from_trigger": True, "payload": ...}`` (``airflow/models/trigger.py``).
- ``airflow/providers/amazon/aws/triggers/base.py`` (``AwsBaseWaiterTrigger``) and
  ``airflow/providers/cncf/kubernetes/triggers/pod.py`` (``KubernetesPodTrigger``): poll with ``asyncio.sleep``
  between checks, yield one event carrying ``status`` (``success`` / ``error``) and a message, and let the
  operator's resume method turn ``error`` into a failure.
- ``airflow/providers/standard/triggers/temporal.py`` (``DateTimeTrigger``): the bake waits on it unchanged.
- ``kubernetes/watch/watch.py`` (kubernetes 36.0.3): with ``timeout_seconds`` set, a 410 in the stream raises
  ``ApiException(410)`` instead of retrying, so the re-list is ours.

Blocking clients (SQLAlchemy, boto3, the official kubernetes client) run in threads (``asyncio.to_thread`` or a
daemon thread feeding an ``asyncio.Queue``), never on the triggerer's event loop. Heavy modules are imported
inside ``run()`` only: the DAG file that builds a ``KubeWatchTrigger`` stays lean at parse time.

Terminal-state algebra as in ``kvfleet.clients.hyperpod``: a state that can never become the target ends the
wait at once with an ``error`` event naming the state and the service's own message.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

log = logging.getLogger(__name__)
T = TypeVar("T")

SUCCESS: Final = "success"
ERROR: Final = "error"
CHANGED: Final = "changed"


def _event(payload: dict[str, Any]) -> TriggerEvent:
    return TriggerEvent(payload)  # type: ignore[no-untyped-call]


def _classpath(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


# ---- the lease ----------------------------------------------------------------------------------------------
class LeaseFreeTrigger(BaseTrigger):
    """Waits until ``cluster``'s lease (``cluster_locks``, rules in ``kvfleet.history.leases``) is free, ours
    (``holder``'s run), or held by the dead (expired ttl). The waiting task then takes it with ``try_take``: the
    trigger only says when trying is worth it, so two waiters racing stay safe.

    Fails fast: a history database that refuses us for good (the table is missing: migrations not applied; the
    role lacks SELECT) is an ``error`` event, as is ``timeout_s`` running out (the user's patience, named with the
    holder). A connection error is transient: it is logged and polled again."""

    def __init__(self, cluster: str, holder: str, *, history_url: str | None = None, poll_s: float = 5.0,
                 timeout_s: float | None = None, started_at: float | None = None,
                 names: list[str] | None = None, exact_holder: bool = False,
                 recheck_s: float | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.cluster, self.holder, self.history_url = cluster, holder, history_url
        self.poll_s, self.timeout_s = float(poll_s), timeout_s
        # Wall clock, so the deadline survives a triggerer restart (re-created from serialize()).
        self.started_at = float(started_at) if started_at is not None else time.time()
        # Several leases, any one of which will do (a run's parallelism slots ``slot:<run key>:<i>``); the
        # slots of one run are held by its other clusters, so "ours" then means this exact holder.
        self.names = [str(n) for n in names] if names else None
        self.exact_holder = bool(exact_holder)
        # The triggerer cannot ask Airflow whether the holder's run still runs (a finished run's lease is free at
        # once, ``kvfleet.history.leases``): after ``recheck_s`` the trigger fires ``recheck`` and the task, which
        # can ask, tries again (and defers again while the holder lives).
        self.recheck_s = float(recheck_s) if recheck_s is not None else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return _classpath(self), {"cluster": self.cluster, "holder": self.holder, "history_url": self.history_url,
                                  "poll_s": self.poll_s, "timeout_s": self.timeout_s,
                                  "started_at": self.started_at, "names": self.names,
                                  "exact_holder": self.exact_holder, "recheck_s": self.recheck_s}

    def _check(self) -> tuple[str | None, str]:
        """(status or None: keep waiting, message). Runs in a thread."""
        from sqlalchemy.exc import OperationalError, ProgrammingError

        from kvfleet.history.db import get_engine

        try:
            leases = _leases(get_engine(self.history_url))
            waiting = [self._check_one(leases, name) for name in (self.names or [self.cluster])]
        except ProgrammingError as exc:  # undefined table, permission denied: waiting cannot fix it
            return ERROR, f"lease table unreadable for {self.cluster}: {exc.orig}"
        except OperationalError as exc:
            log.warning("[%s] history database unreachable, polling again: %s", self.cluster, exc.orig)
            return None, "history database unreachable"
        free = [message for status, message in waiting if status is not None]
        return (SUCCESS, free[0]) if free else (None, "; ".join(message for _, message in waiting))

    def _check_one(self, leases: Any, name: str) -> tuple[str | None, str]:
        from kvfleet.history.leases import judge, run_key_of, utcnow

        row = leases.get(name)
        if row is None:
            return SUCCESS, f"no lease on {name}"
        ours = str(row["holder"]) == self.holder if self.exact_holder else \
            run_key_of(str(row["holder"])) == run_key_of(self.holder)
        if ours:
            return SUCCESS, f"the lease on {name} is held by our own run ({row['holder']})"
        verdict = judge(row, utcnow())
        if not verdict.alive:
            return SUCCESS, f"the lease on {name} held by {row['holder']} is dead: {verdict.reason}"
        return None, (f"{name} is locked by {row['holder']} ({row.get('purpose')}), {verdict.reason}")

    async def run(self) -> AsyncIterator[TriggerEvent]:
        began = time.monotonic()
        while True:
            status, message = await asyncio.to_thread(self._check)
            if status is not None:
                yield _event({"status": status, "cluster": self.cluster, "message": message})
                return
            if self.recheck_s is not None and time.monotonic() - began >= self.recheck_s:
                yield _event({"status": SUCCESS, "cluster": self.cluster, "reason": "recheck",
                              "message": f"{message}; is its run still running? the task checks"})
                return
            waited = time.time() - self.started_at
            if self.timeout_s is not None and waited >= self.timeout_s:
                yield _event({"status": ERROR, "cluster": self.cluster, "reason": "timeout",
                                    "message": f"{message}; waited {waited:.0f}s of {self.timeout_s:.0f}s. Wait "
                                               "for that run to finish, or stop it (a stopped run's lease is "
                                               "free at once)."})
                return
            self.log.info("[%s] %s; waited %.0fs", self.cluster, message, waited)
            await asyncio.sleep(self.poll_s)


def _leases(engine: Any) -> Any:
    from kvfleet.history.leases import Leases

    return Leases(engine)


# ---- cluster readiness ----------------------------------------------------------------------------------------
def _transient(exc: BaseException) -> bool:
    """Worth waiting on: kvfleet's ``TemporaryError`` (throttling, 5xx, 409, network, as ``classify`` says), a
    timeout or a dropped connection (the standard library's, botocore's, urllib3's)."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError
    from urllib3.exceptions import HTTPError as Urllib3Error

    from kvfleet.errors import TemporaryError

    return isinstance(exc, (TemporaryError, TimeoutError, ConnectionError, BotoConnectionError, HTTPClientError,
                            Urllib3Error))


class ClusterReadyTrigger(BaseTrigger):
    """Waits until the HyperPod cluster is ``InService`` (SageMaker DescribeCluster) or, with ``addon``, until
    that EKS add-on of the cluster's EKS cluster is ``ACTIVE``: a failed
    state, or a cluster or add-on that does not exist, is an ``error`` event at once with the service's
    FailureMessage or health issues. The states are judged by kvfleet's botocore waiter models
    (``kvfleet.clients.waiters``: SageMaker has no cluster waiter in botocore, and EKS's ``AddonActive`` lacks two
    failure states), and the trigger polls as the amazon provider's ``AwsBaseWaiterTrigger`` does (sleep between
    attempts, one event)."""

    def __init__(self, cluster: str, region: str, *, aws_conn_id: str | None = "aws_default",
                 addon: str | None = None, poll_s: float = 10.0, timeout_s: float | None = None,
                 started_at: float | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.cluster, self.region, self.aws_conn_id, self.addon = cluster, region, aws_conn_id, addon
        self.poll_s, self.timeout_s = float(poll_s), timeout_s
        self.started_at = float(started_at) if started_at is not None else time.time()
        self._client: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return _classpath(self), {"cluster": self.cluster, "region": self.region, "aws_conn_id": self.aws_conn_id,
                                  "addon": self.addon, "poll_s": self.poll_s, "timeout_s": self.timeout_s,
                                  "started_at": self.started_at}

    def _hyperpod(self) -> Any:
        if self._client is None:
            from kvfleet.clients.hyperpod import HyperPodClient

            self._client = HyperPodClient(self.region, self.aws_conn_id)
        return self._client

    def _check(self) -> tuple[str | None, str]:
        """(status or None: keep waiting, message). Runs in a thread. The verdicts are the waiter models'
        (``kvfleet.clients.waiters``), the same the in-worker waits use."""
        from kvfleet.clients.hyperpod import health_issues

        hp = self._hyperpod()
        verdict, cluster = hp.cluster_wait_state(self.cluster)
        if cluster is None:
            return ERROR, f"HyperPod cluster {self.cluster!r} not found in {self.region}"
        if verdict == "failure":
            return ERROR, (f"HyperPod cluster {self.cluster} is {cluster.status}: "
                           f"{cluster.failure_message or 'no FailureMessage'}")
        if self.addon is None:
            return (SUCCESS if verdict == "success" else None), f"HyperPod cluster {self.cluster} is {cluster.status}"
        # An add-on is judged by itself: a cluster update in flight does not hold it (as ``wait_addon``).
        verdict, state = hp.addon_wait_state(cluster.eks_cluster_name, self.addon)
        status = (state or {}).get("status", "MISSING")
        where = f"EKS add-on {self.addon} on {cluster.eks_cluster_name}"
        if verdict == "success":
            return SUCCESS, f"{where} is {status}"
        if verdict == "failure":
            return ERROR, f"{where} is {status}: {health_issues(state)}"
        return None, f"{where} is {status}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                status, message = await asyncio.to_thread(self._check)
            except Exception as exc:  # a transient error (kvfleet's classify(), a dropped connection) waits on;
                # anything else (PermanentError, no credentials, a bad check) ends the wait at once, as in a worker
                if _transient(exc):
                    status, message = None, f"transient: {exc}"
                else:
                    status, message = ERROR, f"{type(exc).__name__}: {exc}"
            if status is not None:
                yield _event({"status": status, "cluster": self.cluster, "addon": self.addon,
                                    "message": message})
                return
            waited = time.time() - self.started_at
            if self.timeout_s is not None and waited >= self.timeout_s:
                yield _event({"status": ERROR, "cluster": self.cluster, "addon": self.addon,
                                    "reason": "timeout", "message": f"{message} after {waited:.0f}s"})
                return
            self.log.info("[%s] %s; waiting (%.0fs)", self.cluster, message, waited)
            await asyncio.sleep(self.poll_s)


class KubeReadyTrigger(ClusterReadyTrigger):
    """Waits until a named Kubernetes readiness check of the cluster holds (``kvfleet.stages.readiness``: the
    ai-toolkit daemon after a tiered storage change, the operator's controller after its add-on), polled as
    ``ClusterReadyTrigger`` polls, through kvfleet's Kubernetes client for the cluster (built in a thread from
    the HyperPod cluster's EKS endpoint, as ``KubeWatchTrigger`` builds it). A ``PermanentError`` from the check
    is an ``error`` event; anything else (an API server that does not answer yet) keeps waiting."""

    def __init__(self, cluster: str, region: str, *, check: str, args: Mapping[str, Any] | None = None,
                 aws_conn_id: str | None = "aws_default", poll_s: float = 10.0, timeout_s: float | None = None,
                 started_at: float | None = None) -> None:
        super().__init__(cluster, region, aws_conn_id=aws_conn_id, poll_s=poll_s, timeout_s=timeout_s,
                         started_at=started_at)
        self.check, self.args = check, dict(args or {})
        self._access: Any = None
        self._ended = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        path, kwargs = super().serialize()
        kwargs.pop("addon")
        return path, {**kwargs, "check": self.check, "args": self.args}

    def _check(self) -> tuple[str | None, str]:
        from kvfleet.clients.kube import ClusterAccess
        from kvfleet.stages import readiness

        if self._access is None:
            access = ClusterAccess.from_hyperpod(self._hyperpod(), self.cluster)
            if self._ended:  # cancelled while this thread was connecting: nobody else will close it
                access.close()
                return None, "cancelled"
            self._access = access
        ready, state = readiness.check(self._access, self.check, self.args)
        return (SUCCESS if ready else None), f"{readiness.WHAT[self.check]}: {state}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            async for event in super().run():
                yield event
        finally:
            self._ended = True
            if self._access is not None:
                await asyncio.to_thread(self._access.close)


# ---- the drift watch ----------------------------------------------------------------------------------------
# kvfleet's own writes: the field manager kvfleet's clients declare (the API server records the manager in
# managedFields; on a real API server with no fieldManager set it is the User-Agent's product token), or a
# change id kvfleet writes with every change (annotation, or a label on Helm's release Secret via
# ``helm upgrade --labels``). A change is kvfleet's when the newest managedFields entry is kvfleet's, or when the
# change id is new in this version of the object.
OWN_FIELD_MANAGER_PREFIX: Final = "kvfleet"
OWN_CHANGE_ANNOTATION: Final = "kvfleet.io/change-id"
# Annotations controllers rewrite on their own (Deployment revision): not a change of the desired state.
_NOISY_ANNOTATION_PREFIXES: Final = ("deployment.kubernetes.io/",)


@dataclass(frozen=True)
class Stream:
    """One watched collection: ``kind`` names it in events; ``api``/``method`` the client call; ``selector``
    the label selector sent to the API server; ``keep`` a filter the server cannot express (a name prefix)."""

    kind: str
    api: str
    method: str
    selector: str | None = None
    args: tuple[str, ...] = ()
    fingerprint_of: tuple[str, ...] = ("spec",)
    keep: Callable[[Mapping[str, Any]], bool] = field(default=lambda _obj: True)
    events: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED"})


def _managed(selector_label: str) -> str:
    return f"{selector_label}=kvfleet"


def _is_curvine_release(obj: Mapping[str, Any]) -> bool:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get("name", "")).startswith("curvine")


def _is_watched_deployment(obj: Mapping[str, Any]) -> bool:
    from kvfleet.fleet.constants import MANAGED_BY_LABEL, OPERATOR_DEPLOYMENTS, OPERATOR_NAMESPACE

    meta = obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == "kvfleet":
        return True
    return meta.get("namespace") == OPERATOR_NAMESPACE and meta.get("name") in OPERATOR_DEPLOYMENTS


def streams(curvine_namespace: str = "curvine") -> tuple[Stream, ...]:
    """What the drift watch watches, per cluster: the collections the drift check observes (``stages.drift``)."""
    from kvfleet.fleet.constants import IEC_GROUP, IEC_PLURAL, IEC_VERSION, MANAGED_BY_LABEL

    return (
        Stream("InferenceEndpointConfig", "custom", "list_cluster_custom_object", _managed(MANAGED_BY_LABEL),
               (IEC_GROUP, IEC_VERSION, IEC_PLURAL)),
        # Every Deployment: the endpoints' (managed-by label) and the operator's controller (by name).
        Stream("Deployment", "apps", "list_deployment_for_all_namespaces", keep=_is_watched_deployment),
        # Pods come and go with every rollout and node loss (the Deployment shows what was asked); a Pod counts
        # when its labels or annotations are changed by hand.
        Stream("Pod", "core", "list_pod_for_all_namespaces", _managed(MANAGED_BY_LABEL), fingerprint_of=(),
               events=frozenset({"MODIFIED"})),
        # Helm's release records: a new revision (an upgrade or rollback by hand) is a new Secret; deleting an
        # old one is Helm's own history pruning.
        Stream("Secret", "core", "list_namespaced_secret", "owner=helm", (curvine_namespace,),
               fingerprint_of=("data",), keep=_is_curvine_release, events=frozenset({"ADDED", "MODIFIED"})),
    )


# The grants the watch needs beyond the drift check's LISTs (k8s/rbac): ``watch`` on the same collections; the
# Helm release Secrets are watched in Curvine's namespace only (kvfleet:curvine-namespace), never cluster-wide.
RBAC_CLUSTER_RULES: Final = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["watch"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["watch"]},
    {"apiGroups": ["inference.sagemaker.aws.amazon.com"], "resources": ["inferenceendpointconfigs"],
     "verbs": ["watch"]},
)
RBAC_CURVINE_NAMESPACE_RULES: Final = ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["watch"]},)


def fingerprint(obj: Mapping[str, Any], parts: tuple[str, ...]) -> str:
    """What a change of the desired state changes: labels, annotations (without controller noise), ``parts``."""
    meta = obj.get("metadata") or {}
    notes = {k: v for k, v in (meta.get("annotations") or {}).items()
             if not k.startswith(_NOISY_ANNOTATION_PREFIXES)}
    body = {"labels": meta.get("labels") or {}, "annotations": notes, **{p: obj.get(p) for p in parts}}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _change_id(obj: Mapping[str, Any] | None) -> str | None:
    meta = (obj or {}).get("metadata") or {}
    value = (meta.get("annotations") or {}).get(OWN_CHANGE_ANNOTATION) or \
        (meta.get("labels") or {}).get(OWN_CHANGE_ANNOTATION.replace("/", "."))
    return str(value) if value else None


def newest_manager(obj: Mapping[str, Any]) -> str | None:
    entries = ((obj.get("metadata") or {}).get("managedFields")) or []
    if not entries:
        return None
    newest = max(entries, key=lambda e: str(e.get("time") or ""))
    return str(newest.get("manager") or "") or None


def is_own_change(prev: Mapping[str, Any] | None, obj: Mapping[str, Any]) -> bool:
    """Did a kvfleet run make this change? Its field manager wrote last, or it carries a new change id."""
    manager = newest_manager(obj)
    if manager is not None and manager.startswith(OWN_FIELD_MANAGER_PREFIX):
        return True
    change = _change_id(obj)
    return change is not None and change != _change_id(prev)


def _what_changed(prev: Mapping[str, Any] | None, obj: Mapping[str, Any]) -> str:
    """For the log: which top-level parts differ from the version seen before."""
    if prev is None:
        return ""
    meta, old = obj.get("metadata") or {}, prev.get("metadata") or {}
    parts = [k for k in ("labels", "annotations") if meta.get(k) != old.get(k)]
    parts += [k for k in ("spec", "data") if obj.get(k) != prev.get(k)]
    return f": {', '.join(parts)} changed" if parts else ""


def _ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or '-'}/{meta.get('name')}"


async def next_or_none(queue: asyncio.Queue[T], timeout_s: float) -> T | None:
    """The queue's next item, or None after ``timeout_s``. Not ``asyncio.wait_for``: on Python 3.11 it swallows a
    cancellation that arrives in the loop iteration in which the item does (CPython gh-86296, fixed in 3.12 by
    building ``wait_for`` on ``asyncio.timeout``). A watch's queue fills with every pod and bookmark event, so the
    triggerer's cancellation of a busy watch was lost now and then, and the watch ran on after its trigger was
    gone (``tests/unit/test_watch_queue.py``). ``asyncio.timeout`` tells its own timeout from a cancellation."""
    try:
        async with asyncio.timeout(timeout_s):
            return await queue.get()
    except TimeoutError:
        return None


@dataclass
class Burst:
    """Changes seen since the last event; emitted once the watch has been quiet for ``quiet_s`` (or the burst
    has lasted ``max_burst_s``: steady churn still reports)."""

    first_at: float = 0.0
    last_at: float = 0.0
    changes: list[dict[str, str]] = field(default_factory=list)

    def add(self, change: dict[str, str], now: float) -> None:
        if not self.changes:
            self.first_at = now
        self.last_at = now
        self.changes.append(change)

    def due(self, now: float, quiet_s: float, max_burst_s: float) -> bool:
        return bool(self.changes) and (now - self.last_at >= quiet_s or now - self.first_at >= max_burst_s)


# A stream's first list: an API server that accepts and never answers fails the start. Per try: the client's
# urllib3 retries a timed-out GET up to 3 times (its default), so a stalled server fails it after about 4 minutes.
LIST_TIMEOUT_S = 60.0


class _Watcher:
    """One stream: its first list (``first_list``, called by the trigger's start), then its watch loop in a daemon
    thread (the official client's watch is blocking), feeding ``(kind, type, object)`` items to the trigger's
    queue. Resumes from ``rv``; a 410 Gone re-lists, in the thread."""

    def __init__(self, stream: Stream, access: Any, rv: str | None, put: Callable[[tuple[str, str, Any]], None],
                 timeout_s: int) -> None:
        self.stream, self.access, self.rv, self.put, self.timeout_s = stream, access, rv, put, timeout_s
        self.stop = threading.Event()
        self.refused = False  # its first list was refused (401/403): a FAILED item is queued
        self.watch: Any = None
        self.thread = threading.Thread(target=self._run, name=f"kvfleet-watch-{stream.kind}", daemon=True)

    def _fn(self) -> Callable[..., Any]:
        return getattr(getattr(self.access, self.stream.api), self.stream.method)  # type: ignore[no-any-return]

    def _kwargs(self) -> dict[str, Any]:
        return {"label_selector": self.stream.selector} if self.stream.selector else {}

    def relist(self, timeout_s: float | None = None) -> None:
        timeout = {} if timeout_s is None else {"_request_timeout": (min(10.0, timeout_s), timeout_s)}
        resp = self._fn()(*self.stream.args, _preload_content=False, **timeout, **self._kwargs())
        try:
            raw = json.loads(resp.data or b"{}")
        finally:
            resp.release_conn()
        for obj in raw.get("items") or []:
            self.put((self.stream.kind, "LISTED", obj))
        self.rv = str((raw.get("metadata") or {}).get("resourceVersion") or "") or None

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        while not self.stop.is_set():
            try:
                if self.rv is None:
                    self.relist()
                self.watch = watch.Watch()
                for event in self.watch.stream(self._fn(), *self.stream.args, resource_version=self.rv,
                                               allow_watch_bookmarks=True, timeout_seconds=self.timeout_s,
                                               **self._kwargs()):
                    # raw_object: the dict as sent. (deserialize=False would skip building models, but the
                    # client's own 410 handling then reads a "raw_object" key that plain JSON lacks: KeyError.)
                    obj = event.get("raw_object") or {}
                    self.rv = str((obj.get("metadata") or {}).get("resourceVersion") or self.rv)
                    self.put((self.stream.kind, str(event.get("type")), obj))
                    if self.stop.is_set():
                        break
            except ApiException as exc:
                if self._failed(exc):
                    return
            except Exception as exc:  # network: back off, resume from self.rv
                log.warning("[%s] watch interrupted (%s), resuming from %s", self.stream.kind, exc, self.rv)
                self.stop.wait(1.0)

    def first_list(self) -> bool:
        """The stream's list before its watch thread starts, fresh or resumed, ``LIST_TIMEOUT_S`` a try: False
        when the stream is not to be watched (404: not served; 401/403: refused, reported as a ``FAILED`` item,
        and ``refused`` set). Any other failure (5xx, network, an API server that does not answer) raises, so that
        the watch's start fails and the fleet watch reports it and starts it again later, rather than a thread
        retrying unseen."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.relist(timeout_s=LIST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status in (401, 403):
                self.refused = True
            if exc.status in (401, 403, 404):
                self._failed(exc)
                return False
            raise
        return True

    def _failed(self, exc: Any) -> bool:
        if exc.status == 410:  # too old resource version: the history moved on; re-list
            log.info("[%s] 410 Gone at resourceVersion %s: re-listing", self.stream.kind, self.rv)
            self.rv = None
            self.put((self.stream.kind, "RESYNC", {}))
            return False
        if exc.status == 404:  # the type is not served (the operator's CRD not installed yet): nothing to watch
            log.warning("[%s] not served by this cluster: not watched (the drift check reports it)",
                        self.stream.kind)
            self.stop.set()
            return True
        if exc.status in (401, 403):
            try:
                detail = str(json.loads(exc.body or "{}").get("message") or exc.reason)
            except (TypeError, ValueError):
                detail = str(exc.reason)
            self.put((self.stream.kind, "FAILED", {"status": exc.status, "reason": detail}))
            return True
        log.warning("[%s] watch error %s, retrying", self.stream.kind, exc.status)
        self.stop.wait(1.0)
        return False


class KubeWatchTrigger(BaseEventTrigger):
    """A Kubernetes watch on one cluster for the drift check (issue 19, "Event-driven drift").

    Watches the InferenceEndpointConfigs, Deployments and Pods kvfleet manages (``managed-by=kvfleet``), the
    Inference Operator's controller Deployment and Curvine's Helm release Secrets (``owner=helm``, release name
    ``curvine*``), each with ``resourceVersion`` and ``allowWatchBookmarks``: a bookmark advances the version
    without an object, a 410 Gone re-lists (and reports a ``resync``: changes may have been missed). A change
    counts when it changes what the desired state covers (``fingerprint``: labels, annotations, spec / data; a
    status update does not), and when kvfleet's own runs did not make it (``is_own_change``).

    One ``TriggerEvent`` per burst: after ``quiet_s`` without a further change (or ``max_burst_s`` of steady
    churn). Its payload names the cluster, so the DAG scheduled on the asset checks that cluster only.

    Restart: Airflow identifies an event trigger by its classpath and kwargs, so ``serialize()`` returns the
    constructor's kwargs. The watermark (each stream's last resourceVersion) goes to the asset's state store after
    every event (``asset_state_store``, injected by the triggerer); a restarted trigger resumes each watch from it
    (or from ``resource_versions`` passed in). A resumed watch compares replayed versions with a fresh list, so a
    change made while no triggerer ran still fires."""

    def __init__(self, cluster: str, region: str, *, aws_conn_id: str | None = "aws_default",
                 curvine_namespace: str = "curvine", quiet_s: float = 15.0, max_burst_s: float = 120.0,
                 watch_timeout_s: int = 300, resource_versions: Mapping[str, str] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.cluster, self.region, self.aws_conn_id = cluster, region, aws_conn_id
        self.curvine_namespace = curvine_namespace
        self.quiet_s, self.max_burst_s, self.watch_timeout_s = float(quiet_s), float(max_burst_s), watch_timeout_s
        self.resource_versions: dict[str, str] = dict(resource_versions or {})
        self._watchers: list[_Watcher] = []
        self._access: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return _classpath(self), {"cluster": self.cluster, "region": self.region, "aws_conn_id": self.aws_conn_id,
                                  "curvine_namespace": self.curvine_namespace, "quiet_s": self.quiet_s,
                                  "max_burst_s": self.max_burst_s,
                                  "watch_timeout_s": self.watch_timeout_s,
                                  "resource_versions": dict(self.resource_versions)}

    def ready(self) -> bool:
        """Every stream listed (or resumed) and watching: a change from now on is seen."""
        return len(self._watchers) == len(streams(self.curvine_namespace)) and \
            all(w.rv or w.stop.is_set() for w in self._watchers)

    def checkpoint(self) -> tuple[str, dict[str, Any]]:
        """``serialize()`` with the watermark reached so far: a trigger re-created from it resumes there."""
        path, kwargs = self.serialize()
        kwargs["resource_versions"] = {w.stream.kind: w.rv for w in self._watchers if w.rv} or \
            kwargs["resource_versions"]
        return path, kwargs

    def _connect(self) -> Any:
        from kvfleet.clients.hyperpod import HyperPodClient
        from kvfleet.clients.kube import ClusterAccess

        return ClusterAccess.from_hyperpod(HyperPodClient(self.region, self.aws_conn_id), self.cluster)

    async def _saved_versions(self) -> dict[str, str]:
        store = getattr(self, "asset_state_store", None)
        if store is not None:
            try:
                saved = await store.aget("resource_versions")
                if isinstance(saved, dict):
                    return {str(k): str(v) for k, v in saved.items()}
            except Exception as exc:  # the store is an optimisation: a fresh list is always correct
                self.log.warning("[%s] no saved resourceVersions: %s", self.cluster, exc)
        return dict(self.resource_versions)

    async def _save_versions(self, versions: dict[str, str]) -> None:
        self.resource_versions = versions
        store = getattr(self, "asset_state_store", None)
        if store is not None:
            try:
                await store.aset("resource_versions", versions)
            except Exception as exc:
                self.log.warning("[%s] resourceVersions not saved: %s", self.cluster, exc)

    async def _start(self, queue: asyncio.Queue[tuple[str, str, Any]]) -> None:
        loop = asyncio.get_running_loop()
        saved = await self._saved_versions()
        self._access = await asyncio.to_thread(self._connect)

        def put(item: tuple[str, str, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: this trigger has ended
                loop.call_soon_threadsafe(queue.put_nowait, item)

        for stream in streams(self.curvine_namespace):
            watcher = _Watcher(stream, self._access, saved.get(stream.kind), put, self.watch_timeout_s)
            self._watchers.append(watcher)
            # The current state first: the watch starts from the list's version, or, resuming, from the saved
            # one, its replayed versions compared with the list.
            if await asyncio.to_thread(watcher.first_list):
                if stream.kind in saved:
                    watcher.rv = saved[stream.kind]
                watcher.thread.start()
            elif watcher.refused:  # the FAILED item ends the run: the other streams are not started
                return

    async def run(self) -> AsyncIterator[TriggerEvent]:
        queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue()
        seen: dict[tuple[str, str], tuple[str, Mapping[str, Any]]] = {}
        kinds = {s.kind: s for s in streams(self.curvine_namespace)}
        burst = Burst()
        try:
            await self._start(queue)
            while True:
                item = await next_or_none(queue, min(self.quiet_s, 1.0))
                if item is not None:
                    failure = self._judge(item, kinds, seen, burst)
                    if failure is not None:
                        yield failure
                        return
                if burst.due(time.monotonic(), self.quiet_s, self.max_burst_s):
                    yield await self._emit(burst)
                    burst = Burst()
        finally:
            await self.cleanup()

    def _judge(self, item: tuple[str, str, Any], kinds: Mapping[str, Stream],
               seen: dict[tuple[str, str], tuple[str, Mapping[str, Any]]], burst: Burst) -> TriggerEvent | None:
        kind, etype, obj = item
        if etype == "FAILED":
            return _event({"status": ERROR, "cluster": self.cluster, "kind": kind, "http_status": obj["status"],
                                 "message": f"watching {kind} on {self.cluster} refused: HTTP {obj['status']} "
                                            f"{obj['reason']}; check kvfleet's RBAC (k8s/rbac) for list/watch"})
        if etype == "RESYNC":
            burst.add({"kind": kind, "type": "resync", "object": "*"}, time.monotonic())
            return None
        change = self._change(kinds[kind], etype, obj, seen)
        if change is not None:
            burst.add(change, time.monotonic())
        return None

    def _change(self, stream: Stream, etype: str, obj: Mapping[str, Any],
                seen: dict[tuple[str, str], tuple[str, Mapping[str, Any]]]) -> dict[str, str] | None:
        if etype not in ("LISTED", "ADDED", "MODIFIED", "DELETED") or not stream.keep(obj):
            return None  # BOOKMARK: only the version moves (taken by the watcher)
        key = (stream.kind, _ref(obj))
        prev = seen.get(key)
        print_ = fingerprint(obj, stream.fingerprint_of)
        if etype == "DELETED":
            seen.pop(key, None)
        else:
            seen[key] = (print_, obj)
        if etype == "LISTED" or etype not in stream.events:
            return None
        if etype == "MODIFIED" and prev is not None and prev[0] == print_:
            return None  # status, resourceVersion or controller noise only
        if etype != "DELETED" and is_own_change(prev[1] if prev else None, obj):
            return None
        self.log.info("[%s] %s %s %s (rv %s)%s", self.cluster, stream.kind, etype.lower(), _ref(obj),
                      (obj.get("metadata") or {}).get("resourceVersion"), _what_changed(prev[1] if prev else None, obj))
        return {"kind": stream.kind, "type": etype.lower(), "object": _ref(obj),
                "resource_version": str((obj.get("metadata") or {}).get("resourceVersion") or "")}

    async def _emit(self, burst: Burst) -> TriggerEvent:
        versions = {w.stream.kind: w.rv for w in self._watchers if w.rv}
        await self._save_versions(versions)
        objects = sorted({f"{c['kind']}:{c['object']}" for c in burst.changes})
        return _event({"status": CHANGED, "cluster": self.cluster, "changes": len(burst.changes),
                             "objects": objects[:50], "burst_s": round(burst.last_at - burst.first_at, 3),
                             "emitted_at": datetime.now(UTC).isoformat(), "resource_versions": versions})

    async def cleanup(self) -> None:
        for watcher in self._watchers:
            watcher.stop.set()
            if watcher.watch is not None:
                watcher.watch.stop()
        self._watchers = []
        if self._access is not None:
            access, self._access = self._access, None
            await asyncio.to_thread(access.close)


def _payloads(events: Mapping[Any, Any] | None) -> Iterator[Mapping[str, Any]]:
    """The trigger payloads of a run's ``triggering_asset_events`` (asset -> asset events). An asset event made
    from a trigger event carries ``extra = {"from_trigger": True, "payload": <TriggerEvent.payload>}``
    (``airflow/models/trigger.py``, ``Trigger.submit_event``)."""
    for asset_events in (events or {}).values():
        for event in asset_events or []:
            extra = getattr(event, "extra", None) or (event.get("extra") if isinstance(event, Mapping) else None)
            payload = (extra or {}).get("payload") if isinstance(extra, Mapping) else None
            if isinstance(payload, Mapping):
                yield payload


def clusters_of_events(events: Mapping[Any, Any] | None) -> list[str]:
    """The clusters named by the watch events that triggered a ``kvfleet_drift_watch`` run. An ``error``
    payload (a watch refused or failed) names its cluster too: the run checks it, and records the watch's
    failure (``watch_errors_of_events``)."""
    return sorted({str(p["cluster"]) for p in _payloads(events) if p.get("cluster")})


def watch_errors_of_events(events: Mapping[Any, Any] | None) -> list[dict[str, str]]:
    """The ``error`` payloads among a run's triggering events: the cluster, what failed and why, each once."""
    found: dict[tuple[str, str, str], dict[str, str]] = {}
    for p in _payloads(events):
        if p.get("status") == ERROR and p.get("cluster"):
            error = {"cluster": str(p["cluster"])[:200], "kind": str(p.get("kind") or "watch")[:100],
                     "message": str(p.get("message") or "no message")[:1000]}
            found.setdefault((error["cluster"], error["kind"], error["message"]), error)
    return sorted(found.values(), key=lambda e: (e["cluster"], e["kind"], e["message"]))


def inventory_clusters(fleet: str) -> list[tuple[str, str, str]]:
    """(name, region, Curvine namespace) of every cluster of the inventory at ``fleet``, read as plain YAML.
    A relative path is the working directory's, else the checkout's (as ``kvfleet`` resolves it)."""
    from pathlib import Path

    import yaml

    from kvfleet.fleet.constants import CURVINE_NAMESPACE
    from kvfleet.paths import project_root

    path = Path(fleet)
    if not path.is_absolute() and not path.exists():
        path = project_root() / fleet
    doc = yaml.safe_load(path.read_text()) or {}
    return [(str(c["name"]), str(c.get("region") or "us-east-1"),
             str((c.get("curvine") or {}).get("namespace") or CURVINE_NAMESPACE))
            for c in doc.get("clusters") or [] if isinstance(c, dict) and c.get("name")]


def _cause_key(exc: BaseException) -> str:
    """What makes two failures the same trouble: the exception's type and, for an API error, its status class (a
    500 and a 503 of an API server that is down are one outage)."""
    status = getattr(exc, "status", None)
    return f"{type(exc).__name__}: HTTP {status // 100}xx" if isinstance(status, int) else type(exc).__name__


def _failure(exc: BaseException) -> str:
    """An exception in one line: an API error as its status and reason (the client's text carries the headers)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return f"{type(exc).__name__}: HTTP {status} {getattr(exc, 'reason', '') or ''}".rstrip()
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


class _ClusterStore:
    """One cluster's share of the fleet watch's asset state store (its keys prefixed with the cluster)."""

    def __init__(self, store: Any, cluster: str) -> None:
        self.store, self.cluster = store, cluster

    async def aget(self, key: str, default: Any = None) -> Any:
        return await self.store.aget(f"{self.cluster}/{key}", default)

    async def aset(self, key: str, value: Any) -> None:
        await self.store.aset(f"{self.cluster}/{key}", value)


class FleetWatchTrigger(BaseEventTrigger):
    """The drift watch of every inventory cluster, for one ``AssetWatcher``: reads the inventory at ``fleet`` in
    the triggerer (so the DAG file does no I/O at parse time, ARCHITECTURE principle 5) and runs one
    ``KubeWatchTrigger`` per cluster, passing on each event (its payload names the cluster). Each cluster's
    watermark is kept in the asset's state store under ``<cluster>/resource_versions``.

    A cluster whose watch ends leaves the others watching, and is watched again after a back-off
    (``RETRY_BASE_S`` doubling up to ``RETRY_MAX_S``): whether it was refused (the child's ``error`` event, say
    RBAC) or its start failed (the cluster unreachable, or its API server answering 5xx to the first list). The
    failure is passed on as an ``error`` event naming the cluster, which the ``kvfleet_drift_watch`` run records
    in the history (``kvfleet.airflow.drift.record_watch_errors``) beside the drift check of that cluster; the
    run's status stays that of its checks. A cause reported already since the watch was last up (the same
    exception type and HTTP status class, or the same refusal: stream and status) is only logged, so a cluster
    that stays down makes one drift run per cause, not one per retry; a watch that stayed up ``RETRY_MAX_S``
    starts both the back-off and the reporting afresh. Once a stream is watching, a dropped connection or a 5xx is
    retried by its thread every second and resumes from its last version (``_Watcher``); the 10-minute
    ``kvfleet_drift_check`` is the safety net for what a watch misses meanwhile."""

    RETRY_BASE_S: float = 5.0
    RETRY_MAX_S: float = 300.0

    def __init__(self, fleet: str, *, aws_conn_id: str | None = "aws_default", quiet_s: float = 15.0,
                 max_burst_s: float = 120.0, watch_timeout_s: int = 300) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.fleet, self.aws_conn_id = fleet, aws_conn_id
        self.quiet_s, self.max_burst_s, self.watch_timeout_s = float(quiet_s), float(max_burst_s), watch_timeout_s
        self.children: list[KubeWatchTrigger] = []
        self.restarts: dict[str, int] = {}  # cluster -> times its watch was started again after it ended

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return _classpath(self), {"fleet": self.fleet, "aws_conn_id": self.aws_conn_id, "quiet_s": self.quiet_s,
                                  "max_burst_s": self.max_burst_s, "watch_timeout_s": self.watch_timeout_s}

    def ready(self) -> bool:
        return bool(self.children) and all(c.ready() for c in self.children)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        clusters = await asyncio.to_thread(inventory_clusters, self.fleet)
        store = getattr(self, "asset_state_store", None)
        queue: asyncio.Queue[TriggerEvent] = asyncio.Queue()
        for name, region, namespace in clusters:
            child = KubeWatchTrigger(name, region, aws_conn_id=self.aws_conn_id, curvine_namespace=namespace,
                                     quiet_s=self.quiet_s, max_burst_s=self.max_burst_s,
                                     watch_timeout_s=self.watch_timeout_s)
            child.asset_state_store = _ClusterStore(store, name) if store is not None else None  # type: ignore[assignment]
            self.children.append(child)

        tasks = [asyncio.create_task(self._pump(c, queue), name=f"kvfleet-watch-{c.cluster}")
                 for c in self.children]
        try:
            while True:
                yield await queue.get()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _pump(self, child: KubeWatchTrigger, queue: asyncio.Queue[TriggerEvent]) -> None:
        """Pass on one cluster's events; when its watch ends, report why (unless that cause was reported since the
        watch was last up) and watch it again after the back-off. Ends only when cancelled."""
        failures = 0  # attempts failed in a row
        reported: set[str | None] = set()  # the causes passed on as events since the watch was last up
        while True:
            started, failed, cause, error = time.monotonic(), None, None, None
            try:
                async for event in child.run():
                    if event.payload.get("status") == ERROR:  # refused: the child ends after it
                        failed = event
                        cause = f"refused: {event.payload.get('kind')} HTTP {event.payload.get('http_status')}"
                    else:
                        await queue.put(event)
            except Exception as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # cancelled while the watch's cleanup failed: end, as asked
                cause, error = _cause_key(exc), exc
                failed = _event({"status": ERROR, "cluster": child.cluster, "kind": "watch",
                                 "message": f"watching {child.cluster} failed: {_failure(exc)}; watching it again "
                                            "after a back-off"})
            if time.monotonic() - started >= self.RETRY_MAX_S:
                failures, reported = 0, set()  # it stayed up: a new run of failures, reported afresh
            message = str((failed.payload if failed is not None else {}).get("message") or "")[:1000]
            if failed is not None and cause not in reported:
                reported.add(cause)
                self.log.error("[%s] %s", child.cluster, message, exc_info=error)  # the traceback once
                await queue.put(failed)
            elif failed is not None:  # the same trouble again: passed on already
                self.log.warning("[%s] %s (again)", child.cluster, message)
            failures += 1
            delay = min(self.RETRY_MAX_S, self.RETRY_BASE_S * 2 ** min(failures - 1, 20))
            self.log.warning("[%s] the drift watch ended; watching it again in %.3g s (attempt %d)",
                             child.cluster, delay, failures + 1)
            await asyncio.sleep(delay)
            self.restarts[child.cluster] = self.restarts.get(child.cluster, 0) + 1
