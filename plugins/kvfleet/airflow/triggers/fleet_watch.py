"""``FleetWatchTrigger``: the drift watch of every inventory cluster, for the ``AssetWatcher`` of
``dags/kvfleet_drift_watch.py``; and the readers of its events for that DAG's runs (``clusters_of_events``,
``watch_errors_of_events``).

Light at import: the DAG file builds the trigger at parse time, so the inventory, the clients and the per-cluster
watch (``kube_watch``) load inside ``run()``, in the triggerer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from kvfleet.airflow.triggers.events import ERROR, classpath, event

if TYPE_CHECKING:
    from kvfleet.airflow.triggers.kube_watch import KubeWatchTrigger
    from kvfleet.clients.identity import Identity
    from kvfleet.fleet.inventory import Cluster

# The watch belongs to no DAG run: its sessions in the clusters' accounts are named after the watch itself.
WATCH_RUN = ("kvfleet_drift_watch", "watch")


def inventory_path(fleet: str) -> Path:
    """The inventory file at ``fleet``: a relative path is the working directory's, else the checkout's (the
    triggerer may run elsewhere than the workers)."""
    from kvfleet.paths import project_root

    path = Path(fleet)
    if not path.is_absolute() and not path.exists():
        return project_root() / fleet
    return path


def watched(fleet: str, conn_id: str | None) -> list[tuple[Cluster, Identity]]:
    """The clusters of the inventory at ``fleet``, read by kvfleet's validator (``load_inventory``: its limits, its
    defaults, a ``clusters:`` list or mapping alike), each with the identity the watch reaches it as: its account's
    role assumed from the base identity ``conn_id``, in a session named after the watch (it belongs to no run). An
    invalid inventory raises ``InventoryError`` listing every problem; it is never watched as an empty fleet."""
    from kvfleet.clients.identity import identity_for
    from kvfleet.fleet.inventory import load_inventory

    inv = load_inventory(inventory_path(fleet))
    return [(c, identity_for(inv, c, conn_id=conn_id, run=WATCH_RUN)) for c in inv.clusters]


def _payloads(events: Mapping[Any, Any] | None) -> Iterator[Mapping[str, Any]]:
    """The trigger payloads of a run's ``triggering_asset_events`` (asset -> asset events). An asset event made
    from a trigger event carries ``extra = {"from_trigger": True, "payload": <TriggerEvent.payload>}``
    (``airflow/models/trigger.py``, ``Trigger.submit_event``)."""
    for asset_events in (events or {}).values():
        for asset_event in asset_events or []:
            extra = getattr(asset_event, "extra", None) or (
                asset_event.get("extra") if isinstance(asset_event, Mapping) else None)
            payload = (extra or {}).get("payload") if isinstance(extra, Mapping) else None
            if isinstance(payload, Mapping):
                yield payload


def clusters_of_events(events: Mapping[Any, Any] | None) -> list[str]:
    """The clusters named by the watch events that triggered a ``kvfleet_drift_watch`` run. An ``error``
    payload (a watch refused or failed) names its cluster too: the run checks it, and records the watch's
    failure (``watch_errors_of_events``). An invalid inventory's event names no cluster: the run then checks the
    Params' scope, whose inventory read fails the run with the same problems."""
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


def cause_key(exc: BaseException) -> str:
    """What makes two failures the same trouble: the exception's type and, for an API error, its status class (a
    500 and a 503 of an API server that is down are one outage)."""
    status = getattr(exc, "status", None)
    return f"{type(exc).__name__}: HTTP {status // 100}xx" if isinstance(status, int) else type(exc).__name__


def one_line(exc: BaseException) -> str:
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
    the triggerer (so the DAG file does no I/O at parse time) with kvfleet's validator (``watched``) and
    runs one ``KubeWatchTrigger`` per cluster, passing on each event (its payload names the cluster by its key,
    account/region/name). Each cluster's watermark is kept in the asset's state store under
    ``<key>/resource_versions``.

    An invalid inventory is an ``error`` event (``kind: inventory``, every problem in its message, no cluster)
    and an error in the triggerer's log; the inventory is read again after the back-off below, and the same
    problems are reported once, not once per read. Nothing is watched until it is valid.

    A cluster whose watch ends leaves the others watching, and is watched again after a back-off
    (``RETRY_BASE_S`` doubling up to ``RETRY_MAX_S``): whether it was refused (the child's ``error`` event, say
    RBAC) or its start failed (the cluster unreachable, or its API server answering 5xx to the first list). The
    failure is passed on as an ``error`` event naming the cluster, which the ``kvfleet_drift_watch`` run records
    in the history (``kvfleet.airflow.drift.record_watch_errors``) beside the drift check of that cluster; the
    run's status stays that of its checks. A cause reported already since the watch was last up (the same
    exception type and HTTP status class, or the same refusal: stream and status) is only logged, so a cluster
    that stays down makes one drift run per cause, not one per retry; a watch that stayed up ``RETRY_MAX_S``
    starts both the back-off and the reporting afresh. Once a stream is watching, a dropped connection or a 5xx is
    retried by its thread every second and resumes from its last version (``kube_watch._Watcher``); the 10-minute
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
        self.inventory_reads = 0  # times the inventory was read (again, while it was invalid)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath(self), {"fleet": self.fleet, "aws_conn_id": self.aws_conn_id, "quiet_s": self.quiet_s,
                                 "max_burst_s": self.max_burst_s, "watch_timeout_s": self.watch_timeout_s}

    def ready(self) -> bool:
        return bool(self.children) and all(c.ready() for c in self.children)

    def _delay(self, failures: int) -> float:
        return float(min(self.RETRY_MAX_S, self.RETRY_BASE_S * 2 ** min(failures - 1, 20)))

    async def _clusters(self, found: list[tuple[Cluster, Identity]]) -> AsyncIterator[TriggerEvent]:
        """Read the inventory until it is valid, its clusters into ``found``; yield an ``error`` event for each
        new set of problems meanwhile."""
        from kvfleet.errors import InventoryError

        reported: str | None = None
        while True:
            self.inventory_reads += 1
            try:
                found.extend(await asyncio.to_thread(watched, self.fleet, self.aws_conn_id))
                return
            except InventoryError as exc:
                message = f"the drift watch cannot read the inventory {self.fleet}: {exc}"
                if message != reported:
                    reported = message
                    self.log.error("%s", message)
                    yield event({"status": ERROR, "kind": "inventory", "message": message[:4000]})
                else:
                    self.log.warning("the inventory %s is still invalid (%d problem(s)); reading it again",
                                     self.fleet, len(exc.problems))
            await asyncio.sleep(self._delay(self.inventory_reads))

    def _children(self, clusters: list[tuple[Cluster, Identity]]) -> None:
        from kvfleet.airflow.triggers.kube_watch import KubeWatchTrigger

        store = getattr(self, "asset_state_store", None)
        for cluster, identity in clusters:
            child = KubeWatchTrigger(cluster.name, cluster.region, identity=identity.as_dict(),
                                     curvine_namespace=cluster.curvine.namespace,
                                     quiet_s=self.quiet_s, max_burst_s=self.max_burst_s,
                                     watch_timeout_s=self.watch_timeout_s)
            # Its state and its events name the cluster by its key: two accounts' ml-prod stay apart (a watermark
            # kept under the bare name before is not read again: that cluster's watch starts with a full list).
            child.asset_state_store = _ClusterStore(store, cluster.key) if store is not None else None  # type: ignore[assignment]
            self.children.append(child)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        clusters: list[tuple[Cluster, Identity]] = []
        async for failure in self._clusters(clusters):
            yield failure
        self._children(clusters)
        queue: asyncio.Queue[TriggerEvent] = asyncio.Queue()
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
        key = child.ref.key

        def keyed(item: TriggerEvent) -> TriggerEvent:  # the event names the cluster by its key
            return event({**item.payload, "cluster": key}) if item.payload.get("cluster") else item

        while True:
            started, failed, cause, error = time.monotonic(), None, None, None
            try:
                async for item in child.run():
                    if item.payload.get("status") == ERROR:  # refused: the child ends after it
                        failed = item
                        cause = f"refused: {item.payload.get('kind')} HTTP {item.payload.get('http_status')}"
                    else:
                        await queue.put(keyed(item))
            except Exception as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # cancelled while the watch's cleanup failed: end, as asked
                cause, error = cause_key(exc), exc
                failed = event({"status": ERROR, "cluster": key, "kind": "watch",
                                "message": f"watching {child.cluster} failed: {one_line(exc)}; watching it again "
                                           "after a back-off"})
            if time.monotonic() - started >= self.RETRY_MAX_S:
                failures, reported = 0, set()  # it stayed up: a new run of failures, reported afresh
            message = str((failed.payload if failed is not None else {}).get("message") or "")[:1000]
            if failed is not None and cause not in reported:
                reported.add(cause)
                self.log.error("[%s] %s", key, message, exc_info=error)  # the traceback once
                await queue.put(keyed(failed))
            elif failed is not None:  # the same trouble again: passed on already
                self.log.warning("[%s] %s (again)", child.cluster, message)
            failures += 1
            delay = self._delay(failures)
            self.log.warning("[%s] the drift watch ended; watching it again in %.3g s (attempt %d)",
                             child.cluster, delay, failures + 1)
            await asyncio.sleep(delay)
            self.restarts[key] = self.restarts.get(key, 0) + 1
