"""Curvine, simulated: the master and workers that the stand-in ``curvine`` chart deploys.

Attached to every cluster twin by ``kvfleet_sandbox.runtime`` (``attach(twin)``). The workloads controller turns
the chart's StatefulSets into pods; this module gives those pods Curvine's behaviour:

- **Format flags bite at pod start** (docs/reference/curvine.md#format-flags). A pod acts on the flags *it was created
  with*: the ``CURVINE_FORMAT_MASTER`` / ``CURVINE_FORMAT_JOURNAL`` / ``CURVINE_FORMAT_WORKER`` env of its container,
  which the chart renders from ``cluster.format*`` at the time the pod's template was written, not the release's current
  values. A master that starts with formatMaster or formatJournal deletes its metadata, so every L2 file of the cluster
  is gone; a worker that starts with formatWorker deletes its data dir, so the files whose blocks it held are gone.
  Flags false: a restart keeps everything. This is what makes a ``helm rollback`` to the install revision (flags true)
  dangerous, and what kvfleet's gates must prevent.
- **L2 availability**: once Curvine is installed, ``twin.l2.available`` follows "master pod Running and Ready".
- **Master HTTP API** on the web port (9000) through the API server's pod proxy: ``/api/overview``,
  ``/api/workers``, ``/api/browse``, ``/api/config``, ``/metrics``, ``/report`` with the field names of
  docs/reference/curvine.md#master-api. Capacity is the sum of the LIVE workers' data dir sizes; ``fs_used`` the
  bytes of L2 files. This module is the model and holds no HTTP code: it gives the bodies (``overview``,
  ``workers``, ``listing``, ``config_of``, ``worker_infos``); ``master_http`` serves them.
- **Pod logs** with start-up lines, including ``Delete(format) ...`` when a format happened.
- The **chart repository** serving the stand-in charts (``kvfleet_sandbox.chart_repo``), one per process.
- **Fault injection**: a Curvine pod whose container env has ``CURVINE_SANDBOX_FAULT=crashloop`` (e.g. through
  ``worker.extraEnv``, or a published chart version whose defaults carry it: ``chart_repo.CRASHLOOP_WORKER``)
  starts, exits and is restarted forever (``CrashLoopBackOff``): Running but never Ready, so a rollout stalls
  the way a broken image does on a real cluster. It never acts on its format flags (it never gets that far).

Block placement: each L2 file is assigned to one worker (round-robin over the live workers, in write order) when
the simulation first sees it, within a tick of its write; that is what a worker format drops.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import kvfleet.fleet.constants as C
from kvfleet_sandbox import chart_repo
from kvfleet_sandbox.twin import ClusterTwin, L2Entry, L2Namespace

log = logging.getLogger(__name__)

BLOCK_SIZE = 64 * 1024**2  # chart default config.client.blockSizeStr: 64MB
MASTER_RPC_PORT = 8995
WORKER_RPC_PORT = 8997
TICK_S = 0.05  # real seconds between placement/availability syncs
ENV_FORMAT_MASTER = "CURVINE_FORMAT_MASTER"
ENV_FORMAT_WORKER = "CURVINE_FORMAT_WORKER"
ENV_FORMAT_JOURNAL = "CURVINE_FORMAT_JOURNAL"
ENV_CLUSTER_ID = "CURVINE_CLUSTER_ID"
ENV_DATA_DIRS = "CURVINE_WORKER_DATA_DIRS"
ENV_FAULT = "CURVINE_SANDBOX_FAULT"  # "crashloop": the pod never becomes Ready (see the module docstring)
POD_NAME = re.compile(r"^(?:.*-)?curvine-(master|worker)-(\d+)$")
_DATA_DIR = re.compile(r"\[(?P<type>[A-Za-z_]+):(?P<size>[0-9.]+)\s*(?P<unit>[KMGTP]i?B?|B)?\](?P<path>\S+)")
_TOML_DATA_DIR = re.compile(r'"(\[[^"\]]+\][^"]+)"')
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def size_bytes(size: str) -> int:
    """``100GB`` / ``100Gi`` / ``512MB`` -> bytes. Curvine's units are binary, like the chart's Gi -> GB."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGTP]?)(i?B?|B?)\s*", size)
    if not m:
        raise ValueError(f"not a Curvine size: {size!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def data_dir_sizes(spec: str) -> list[tuple[str, int, str]]:
    """``[SSD:100GB]/data/data1,[HDD:1TB]/data/d2`` -> [(type, bytes, path), ...]."""
    out = []
    for m in _DATA_DIR.finditer(spec):
        out.append((m.group("type"), size_bytes(m.group("size") + (m.group("unit") or "")), m.group("path")))
    return out


def _env(pod: dict[str, Any]) -> dict[str, str]:
    containers = (pod.get("spec") or {}).get("containers") or []
    return {e["name"]: str(e.get("value", "")) for e in (containers[0].get("env") or [] if containers else [])
            if "name" in e}


def _flag(env: dict[str, str], name: str) -> bool:
    return env.get(name, "false").strip().lower() == "true"


def pod_running(pod: dict[str, Any] | None) -> bool:
    return pod is not None and bool(pod) and (pod.get("status") or {}).get("phase") == "Running"


def _l2_files(l2: L2Namespace) -> list[tuple[str, L2Entry]]:
    """Every L2 file with its entry, in write order. L2Namespace has no read-only iterator over its entries; a
    ``drop_where`` predicate that records each one and keeps it is one."""
    files: list[tuple[str, L2Entry]] = []

    def keep(path: str, entry: L2Entry) -> bool:
        files.append((path, entry))
        return False
    l2.drop_where(keep)
    return files


def _ready(pod: dict[str, Any] | None) -> bool:
    if not pod_running(pod):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []  # type: ignore[union-attr]
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def component_of(pod: dict[str, Any]) -> str | None:
    """"master" / "worker" for a Curvine server pod (by the chart's labels, else by name), else None."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get("app.kubernetes.io/name") == "curvine":
        comp = labels.get("app.kubernetes.io/component")
        if comp in ("master", "worker"):
            return str(comp)
    m = POD_NAME.match(meta.get("name", ""))
    return m.group(1) if m else None


def _ordinal(name: str) -> int:
    m = re.search(r"-(\d+)$", name)
    return int(m.group(1)) if m else 0


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


@dataclass
class _PodLog:
    uid: str
    lines: list[tuple[dt.datetime, str]] = field(default_factory=list)


class CurvineSimulation:
    """One cluster's Curvine. Registered as ``twin.services["curvine"]``; see the module docstring."""

    def __init__(self, twin: ClusterTwin) -> None:
        self.twin = twin
        self.store = twin.store
        self._lock = threading.RLock()
        self._started: dict[str, str] = {}  # pod uid -> pod name, for pods whose start has been acted on
        # Pod uids whose start-up finished (formats done, registered with the master). A pod is Ready in the API
        # a moment before the simulation has acted on it; only registered pods count as live, as in Curvine,
        # where a worker is live once it has registered, after any format.
        self._registered: set[str] = set()
        self._registrations = 0  # bumped when a pod registers or goes away: part of what a tick compares
        self._placement: dict[str, str] = {}  # L2 path -> worker pod name holding its blocks
        self._rr = 0
        self._known_workers: dict[str, dict[str, Any]] = {}  # worker name -> last WorkerInfo seen live
        self._worker_nodes: dict[str, str] = {}  # worker name -> node its data dir lives on
        self._logs: dict[tuple[str, str], _PodLog] = {}
        self._installed = False  # once a Curvine master StatefulSet is seen, L2 availability follows the master
        self._master_start = twin.clock.now()
        self._inode_seq = 1000  # Curvine's inode ids; reset by a master format
        # Every data loss that happened: {"pod", "kind": master|worker|node-change, "files_lost", "at"}.
        self.formats: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._repo = chart_repo.acquire_shared()
        twin.services["chart_repo_url"] = self._repo.url
        twin.services["chart_repo"] = self._repo
        twin.services["curvine"] = self
        # Pods already running when we attach started before we watched: they are not re-formatted.
        for pod in self.store.list("", "pods"):
            if component_of(pod) and pod_running(pod):
                self._started[pod["metadata"]["uid"]] = pod["metadata"]["name"]
                self._registered.add(pod["metadata"]["uid"])
        self.store.subscribe(self._on_event)
        self.store.register_log_source(self._pod_log)
        self._thread = threading.Thread(target=self._tick, name=f"curvine-{twin.name}", daemon=True)
        self._thread.start()

    # --- services API -------------------------------------------------------------------------------------

    def namespace(self) -> str | None:
        """The namespace of the ``curvine-master`` StatefulSet (None while Curvine is not installed)."""
        for sts in self.store.list("apps", "statefulsets"):
            if sts["metadata"]["name"] == C.CURVINE_MASTER_STS:
                return str(sts["metadata"]["namespace"])
        return None

    def master_pod(self) -> dict[str, Any] | None:
        ns = self.namespace()
        return self.store.get("", "pods", f"{C.CURVINE_MASTER_STS}-0", ns) if ns else None

    def master_running(self) -> bool:
        """``curvine-master-0`` is Ready and has finished starting: the metadata service answers."""
        return self._live(self.master_pod())

    def _live(self, pod: dict[str, Any] | None) -> bool:
        if pod is None or not _ready(pod):
            return False
        with self._lock:
            return str(pod["metadata"].get("uid", "")) in self._registered

    def restart_master(self) -> bool:
        """Delete the master pod (the workloads controller recreates it); False when there is none."""
        ns = self.namespace()
        return bool(ns and self.store.delete("", "pods", f"{C.CURVINE_MASTER_STS}-0", ns))

    def restart_worker(self, ordinal: int) -> bool:
        ns = self.namespace()
        return bool(ns and self.store.delete("", "pods", f"{C.CURVINE_WORKER_STS}-{ordinal}", ns))

    def overview(self) -> dict[str, Any]:
        """The body of ``GET /api/overview``."""
        self._sync()
        live, lost = self.worker_infos()
        master = self.master_pod()
        ns = self.namespace() or C.CURVINE_NAMESPACE
        env = _env(master) if master else {}
        capacity = sum(w["capacity"] for w in live)
        fs_used = self.twin.l2.total_bytes()
        return {
            "cluster_id": env.get(ENV_CLUSTER_ID, "curvine"),
            "master_addr": f"{C.CURVINE_MASTER_STS}-0.{C.CURVINE_MASTER_STS}.{ns}.svc.cluster.local:"
                           f"{MASTER_RPC_PORT}",
            "start_time": _ms(self._master_start),
            "live_workers": len(live),
            "lost_workers": len(lost),
            "available": max(0, capacity - fs_used),
            "capacity": capacity,
            "fs_used": fs_used,
            "reserved_bytes": 0,
            "files_total": self.twin.l2.file_count(),
            "dir_total": self._dir_count(),
            "master_state": "Leader" if self.master_running() else "Starting",
        }

    def workers(self) -> dict[str, list[dict[str, Any]]]:
        """The body of ``GET /api/workers``: WorkerInfo lists (docs/reference/curvine.md#master-api)."""
        self._sync()
        live, lost = self.worker_infos()
        return {"live_workers": live, "lost_workers": lost}

    def placement(self) -> dict[str, str]:
        """L2 path -> worker pod name holding its blocks (a copy)."""
        self._sync()
        with self._lock:
            return dict(self._placement)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for key in ("curvine", "chart_repo", "chart_repo_url"):
            self.twin.services.pop(key, None)
        chart_repo.release_shared()

    # --- pod life cycle -----------------------------------------------------------------------------------

    def _on_event(self, kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
        if group == "apps" and resource == "statefulsets":
            if obj["metadata"]["name"] == C.CURVINE_MASTER_STS:
                self._refresh_availability()
            return
        if group != "" or resource != "pods":
            return
        component = component_of(obj)
        if component is None:
            return
        try:
            self._on_pod(kind, component, obj)
        except Exception:  # a broken simulation must not break the API write that triggered it
            log.exception("curvine: handling %s of pod %s failed", kind, obj["metadata"].get("name"))
        self._refresh_availability()

    def _on_pod(self, kind: str, component: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid, name = meta.get("uid", ""), meta["name"]
        if kind == "DELETED":
            with self._lock:
                self._started.pop(uid, None)
                self._registered.discard(uid)
                self._registrations += 1
            self._log(pod, f"received SIGTERM, {component} {name} stopping")
            return
        if not pod_running(pod):
            return
        with self._lock:
            if uid in self._started:
                return
            self._started[uid] = name
        if _env(pod).get(ENV_FAULT, "").strip().lower() == "crashloop":
            self._crashloop(pod, component)
            return
        if component == "master":
            self._master_started(pod)
        else:
            self._worker_started(pod)
        with self._lock:
            if uid in self._started:  # not deleted meanwhile
                self._registered.add(uid)
                self._registrations += 1

    def _crashloop(self, pod: dict[str, Any], component: str) -> None:
        """The container exits at start-up; the kubelet restarts it with back-off: Running, never Ready."""
        self._log(pod, f"Starting curvine {component} {pod['metadata']['name']}")
        self._log(pod, f"panic: {ENV_FAULT}=crashloop: {component} exited during start-up (sandbox fault)")

        def crash(p: dict[str, Any]) -> dict[str, Any] | None:
            status = p.setdefault("status", {})
            if status.get("phase") != "Running":
                return None
            for cond in status.get("conditions") or []:
                if cond.get("type") in ("Ready", "ContainersReady"):
                    cond.update(status="False", reason="ContainersNotReady",
                                message=f"containers with unready status: [{component}]")
            for cs in status.get("containerStatuses") or []:
                cs.update(ready=False, started=False, restartCount=int(cs.get("restartCount") or 0) + 1,
                          state={"waiting": {"reason": "CrashLoopBackOff",
                                             "message": f"back-off restarting failed container {component}"}},
                          lastState={"terminated": {"exitCode": 101, "reason": "Error"}})
            return p

        meta = pod["metadata"]
        self.store.mutate("", "pods", meta["name"], meta.get("namespace"), crash)

    def _master_started(self, pod: dict[str, Any]) -> None:
        env = _env(pod)
        fmt_master, fmt_journal = _flag(env, ENV_FORMAT_MASTER), _flag(env, ENV_FORMAT_JOURNAL)
        self._log(pod, f"Starting curvine master {pod['metadata']['name']}, cluster_id="
                       f"{env.get(ENV_CLUSTER_ID, 'curvine')}, rpc_port={MASTER_RPC_PORT}, "
                       f"web_port={C.CURVINE_MASTER_WEB_PORT}")
        self._log(pod, f"format_master={str(fmt_master).lower()} format_journal={str(fmt_journal).lower()}")
        if _ordinal(pod["metadata"]["name"]) != 0:
            self._log(pod, "joined the journal group as a follower")
            return
        self._sync()
        with self._lock:
            self._master_start = self.twin.clock.now()
            # The master's worker registry is in memory: a restarted master knows only workers that register.
            self._known_workers.clear()
            if fmt_master or fmt_journal:
                # Curvine deletes the RocksDB meta and journal dirs: the inodes naming every block are gone.
                lost = self.twin.l2.delete_prefix("/")
                self._placement.clear()
                self._inode_seq = 1000
                self.formats.append({"pod": pod["metadata"]["name"], "kind": "master", "files_lost": lost,
                                     "at": self.twin.clock.now()})
                self._log(pod, 'Delete(format) exists db path "/opt/curvine/data/meta"')
                self._log(pod, 'Delete(format) exists db path "/opt/curvine/data/journal"')
                self._log(pod, f"master formatted: {lost} files dropped from the namespace")
            else:
                files = self.twin.l2.file_count()
                self._log(pod, f"loaded existing metadata from /opt/curvine/data/meta: {files} files, "
                               f"{self._dir_count()} dirs")
        self._log(pod, "master started, state Leader")

    def _worker_started(self, pod: dict[str, Any]) -> None:
        env = _env(pod)
        name = pod["metadata"]["name"]
        dirs = env.get(ENV_DATA_DIRS, "")
        self._log(pod, f"Starting curvine worker {name}, rpc_port={WORKER_RPC_PORT}, data_dir={dirs}")
        self._sync()
        node = (pod.get("spec") or {}).get("nodeName", "")
        with self._lock:
            previous_node = self._worker_nodes.get(name)
            self._worker_nodes[name] = node
        moved = bool(previous_node and node and previous_node != node and _host_path_data(pod))
        if _flag(env, ENV_FORMAT_WORKER):
            lost = self._drop_blocks_of(name, "worker")
            for _type, _size, path in data_dir_sizes(dirs) or [("SSD", 0, "/data/data1")]:
                self._log(pod, f"Delete(format) data dir {path}")
            self._log(pod, f"worker formatted: blocks of {lost} files dropped")
        elif moved:
            # hostPath data stays on the node it was written to: a worker rescheduled elsewhere starts empty.
            lost = self._drop_blocks_of(name, "node-change")
            self._log(pod, f"data dir empty on node {node} (was {previous_node}): blocks of {lost} files lost")
        else:
            with self._lock:
                held = sum(1 for w in self._placement.values() if w == name)
            self._log(pod, f"loaded existing blocks of {held} files")
        self._log(pod, "worker registered with the master")

    def _drop_blocks_of(self, worker: str, reason: str) -> int:
        with self._lock:
            doomed = {p for p, w in self._placement.items() if w == worker}
            lost = self.twin.l2.drop_where(lambda path, _e: path in doomed)
            for path in doomed:
                self._placement.pop(path, None)
            self.formats.append({"pod": worker, "kind": reason, "files_lost": lost, "at": self.twin.clock.now()})
        return lost

    def _refresh_availability(self) -> None:
        if self.namespace() is not None:
            self._installed = True
        if self._installed:
            self.twin.l2.available = self.master_running()

    def _tick(self) -> None:
        ticks = 0
        seen: tuple[int, int, int] | None = None
        while not self._stop.wait(TICK_S):
            ticks += 1
            # Everything a tick derives comes from the API objects, the L2 files and which pods have registered:
            # with none of them changed since the last full tick there is nothing to do (ten idle clusters in
            # one interpreter stay cheap).
            state = (self.store.resource_version, self.twin.l2.version, self._registrations)
            if state == seen and ticks % 4:
                continue
            try:
                self._sync()
                self._refresh_availability()
                if ticks % 4 == 0:  # the master notices live workers (and so, later, lost ones) by heartbeat
                    self.worker_infos()
                seen = state
            except Exception:
                log.exception("curvine: periodic sync failed")

    # --- workers, placement --------------------------------------------------------------------------------

    def _worker_pods(self) -> list[dict[str, Any]]:
        ns = self.namespace()
        if ns is None:
            return []
        pods = [p for p in self.store.list("", "pods", ns) if component_of(p) == "worker"]
        return sorted(pods, key=lambda p: _ordinal(p["metadata"]["name"]))

    def _capacity_of(self, pod: dict[str, Any]) -> int:
        spec = _env(pod).get(ENV_DATA_DIRS)
        if spec is None:  # a pod without the env: read the data dirs from the config it mounts
            cm = self.store.get("", "configmaps", "curvine-config", pod["metadata"].get("namespace"))
            toml = ((cm or {}).get("data") or {}).get("curvine-cluster.toml", "")
            spec = ",".join(_TOML_DATA_DIR.findall(toml))
        return sum(size for _t, size, _p in data_dir_sizes(spec))

    def _sync(self) -> None:
        """Assign every L2 file not yet placed to a worker, round-robin over the live workers in write order."""
        entries = _l2_files(self.twin.l2)
        live = [p["metadata"]["name"] for p in self._worker_pods() if self._live(p)]
        with self._lock:
            present = {path for path, _ in entries}
            for path in [p for p in self._placement if p not in present]:
                del self._placement[path]
            new = sorted((e.written_at, path) for path, e in entries if path not in self._placement)
            if not new:
                return
            targets = live or [f"{C.CURVINE_WORKER_STS}-{i}" for i in range(max(1, self._worker_replicas()))]
            for _, path in new:
                self._placement[path] = targets[self._rr % len(targets)]
                self._rr += 1
                self._inode_seq += 1

    def _worker_replicas(self) -> int:
        ns = self.namespace()
        sts = self.store.get("apps", "statefulsets", C.CURVINE_WORKER_STS, ns) if ns else None
        return int(((sts or {}).get("spec") or {}).get("replicas") or 0)

    def worker_infos(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        entries = {path: entry.size for path, entry in _l2_files(self.twin.l2)}
        with self._lock:
            placement = dict(self._placement)
        now_ms = _ms(self.twin.clock.now())
        live: list[dict[str, Any]] = []
        live_names = set()
        for pod in self._worker_pods():
            if not self._live(pod):
                continue
            name = pod["metadata"]["name"]
            held = [entries[p] for p, w in placement.items() if w == name and p in entries]
            capacity = self._capacity_of(pod)
            fs_used = sum(held)
            info = {
                "address": {"hostname": f"{name}.{C.CURVINE_WORKER_STS}.{pod['metadata']['namespace']}"
                                        ".svc.cluster.local",
                            "ip_addr": (pod.get("status") or {}).get("podIP", ""),
                            "rpc_port": WORKER_RPC_PORT, "web_port": 9001},
                "worker_id": _ordinal(name) + 1,
                "node_name": (pod.get("spec") or {}).get("nodeName", ""),
                "weight": 1,
                "software_version": _image_tag(pod),
                "startup_time_ms": _ms(_started_at(pod, self.twin.clock.now())),
                "capacity": capacity,
                "available": max(0, capacity - fs_used),
                "fs_used": fs_used,
                "non_fs_used": 0,
                "reserved_bytes": 0,
                "last_update": now_ms,
                "block_num": sum(max(1, math.ceil(s / BLOCK_SIZE)) for s in held),
                "storage_map": {path: {"storage_type": t, "capacity": size, "dir_path": path}
                                for t, size, path in data_dir_sizes(_env(pod).get(ENV_DATA_DIRS, ""))},
                "status": "Live",
                "worker_session_id": pod["metadata"].get("uid", ""),
            }
            live.append(info)
            live_names.add(name)
        with self._lock:
            for info in live:
                self._known_workers[info["address"]["hostname"].split(".", 1)[0]] = info
            lost = [dict(info, status="Lost", available=0) for name, info in sorted(self._known_workers.items())
                    if name not in live_names]
        return live, lost

    def listing(self, path: str) -> list[dict[str, Any]] | None:
        """The body of ``GET /api/browse?path=``: the file's own status, or the directory's children (sub
        directories with the newest mtime below them); None if nothing is there. ``/`` is always listed."""
        path = "/" + path.strip("/") if path.strip("/") else "/"
        files = self.entries()
        if path in files:
            return [_file_status(path, files[path])]
        prefix = path.rstrip("/") + "/"
        children: dict[str, dict[str, Any]] = {}
        for p, entry in files.items():
            if not p.startswith(prefix):
                continue
            head, sep, _rest = p[len(prefix):].partition("/")
            child = prefix + head
            if sep:
                children.setdefault(child, {"path": child, "name": head, "is_dir": True, "len": 0,
                                            "mtime": 0, "file_type": "Dir"})
                children[child]["mtime"] = max(children[child]["mtime"], _ms(entry.written_at))
            else:
                children[child] = _file_status(child, entry)
        if not children and path != "/":
            return None
        return [children[k] for k in sorted(children)]

    def entries(self) -> dict[str, L2Entry]:
        """Every L2 file with its entry (a copy)."""
        return dict(_l2_files(self.twin.l2))

    def _dir_count(self) -> int:
        dirs: set[str] = set()
        for d in self.twin.l2.dirs():
            while d and d != "/" and d not in dirs:
                dirs.add(d)
                d = d.rsplit("/", 1)[0]
        return len(dirs)

    # --- pod logs -------------------------------------------------------------------------------------------

    def _log(self, pod: dict[str, Any], line: str) -> None:
        meta = pod["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        now = dt.datetime.now(dt.UTC)
        with self._lock:
            entry = self._logs.get(key)
            if entry is None or entry.uid != meta.get("uid", ""):
                if entry is not None and line.startswith("received SIGTERM"):
                    return
                entry = self._logs[key] = _PodLog(meta.get("uid", ""))
            entry.lines.append((now, f"{now.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} INFO {line}\n"))

    def _pod_log(self, namespace: str, pod: str, container: str | None, since_time: dt.datetime | None,
                 since_seconds: int | None, tail: int | None) -> str | None:
        with self._lock:
            entry = self._logs.get((namespace, pod))
            lines = list(entry.lines) if entry else None
        if lines is None:
            return None
        cutoff = since_time
        if since_seconds is not None:
            by_seconds = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=int(since_seconds))
            cutoff = max(cutoff, by_seconds) if cutoff else by_seconds
        return "".join(text for ts, text in lines if cutoff is None or ts >= cutoff)


def _file_status(path: str, entry: L2Entry) -> dict[str, Any]:
    return {"path": path, "name": path.rsplit("/", 1)[-1], "is_dir": False, "len": entry.size,
            "mtime": _ms(entry.written_at), "block_size": BLOCK_SIZE, "replicas": 1, "file_type": "File"}


def config_of(pod: dict[str, Any]) -> dict[str, Any]:
    """The body of ``GET /api/config`` of a master pod: what it was started with."""
    env = _env(pod)
    return {"cluster_id": env.get(ENV_CLUSTER_ID, "curvine"),
            "format_master": _flag(env, ENV_FORMAT_MASTER),
            "format_worker": _flag(env, ENV_FORMAT_WORKER),
            "format_journal": _flag(env, ENV_FORMAT_JOURNAL),
            "master": {"rpc_port": MASTER_RPC_PORT, "web_port": C.CURVINE_MASTER_WEB_PORT},
            "client": {"block_size": BLOCK_SIZE}}


def _host_path_data(pod: dict[str, Any]) -> bool:
    """Whether the worker's data dirs are hostPath volumes (node-local NVMe), not claims that follow the pod.
    The chart's worker pod has the ``config`` volume and its data dirs, nothing else."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return any("hostPath" in v for v in volumes if v.get("name") != "config")


def _image_tag(pod: dict[str, Any]) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    image = containers[0].get("image", "") if containers else ""
    return image.rsplit(":", 1)[-1] if ":" in image else ""


def _started_at(pod: dict[str, Any], default: float) -> float:
    stamp = (pod.get("status") or {}).get("startTime")
    if not stamp:
        return default
    try:
        return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return default
