"""The master's HTTP API of the simulated Curvine (``model``), on its web port through the API server's pod
proxy: ``/api/overview``, ``/api/workers``, ``/api/browse``, ``/api/config`` (JSON, the field names of
docs/reference/curvine.md#master-api), ``/metrics`` (Prometheus text) and ``/report`` (the ``cv report`` text). Routing
and rendering only: the bodies come from the model.

Attached with the model by ``kvfleet_sandbox.controllers.curvine.attach``.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from typing import Any

import kvfleet.fleet.constants as C
from kvfleet_sandbox.controllers.curvine.model import POD_NAME, CurvineSimulation, component_of, config_of, pod_running
from kvfleet_sandbox.kube.store import ProxyResponse


class CurvineMasterApi:
    """The pod-proxy handler of one cluster's Curvine master."""

    def __init__(self, sim: CurvineSimulation) -> None:
        self.sim = sim
        sim.store.register_pod_proxy(self._proxy)

    def _proxy(self, namespace: str, pod: str, port: int, method: str, path: str, query: str,
               headers: dict[str, str], body: bytes, *, received: float | None = None) -> ProxyResponse | None:
        """``received`` (when the API server read the request) is accepted for the pod-proxy contract and unused:
        the master's answers are not timed."""
        if port != C.CURVINE_MASTER_WEB_PORT or not POD_NAME.match(pod) or "-master-" not in pod:
            return None
        obj = self.sim.store.get("", "pods", pod, namespace)
        if obj is None or component_of(obj) != "master":
            return None
        if not pod_running(obj):
            return ProxyResponse(503, {"Content-Type": "text/plain"},
                                 f"dial tcp :{port}: connect: connection refused (pod {pod} not running)\n".encode())
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"method {method} not allowed"})
        params = {k: v[-1] for k, v in urllib.parse.parse_qs(query or "", keep_blank_values=True).items()}
        routes: dict[str, Callable[[], ProxyResponse]] = {
            "/api/overview": lambda: _json(200, self.sim.overview()),
            "/api/workers": lambda: _json(200, self.sim.workers()),
            "/api/browse": lambda: self._browse(params.get("path", "/")),
            "/api/config": lambda: _json(200, config_of(obj)),
            "/metrics": lambda: ProxyResponse(200, {"Content-Type": "text/plain; version=0.0.4"},
                                              self._metrics().encode()),
            "/report": lambda: ProxyResponse(200, {"Content-Type": "text/plain"}, self._report().encode()),
        }
        handler = routes.get(path.rstrip("/") or "/")
        if handler is None:
            return _json(404, {"error": f"no route {path}"})
        return handler()

    def _browse(self, path: str) -> ProxyResponse:
        if not self.sim.master_running():
            return _json(503, {"error": "master is not ready"})
        listing = self.sim.listing(path)
        if listing is None:
            return _json(404, {"error": f"File not found: {'/' + path.strip('/')}"})
        return _json(200, listing)

    def _metrics(self) -> str:
        ov = self.sim.overview()
        live, _lost = self.sim.worker_infos()
        blocks = sum(w["block_num"] for w in live)
        gauges = {
            "capacity": ov["capacity"], "available": ov["available"], "fs_used": ov["fs_used"],
            "num_blocks": blocks, "blocks_size_avg": (ov["fs_used"] // blocks) if blocks else 0,
            "allocatable_capacity": ov["capacity"], "allocatable_available": ov["available"],
            "inode_dir_num": ov["dir_total"], "inode_file_num": ov["files_total"],
        }
        lines = []
        for name, value in gauges.items():
            lines += [f"# TYPE {name} gauge", f"{name} {value}"]
        lines.append("# TYPE worker_num gauge")
        for tag, n in (("live", ov["live_workers"]), ("lost", ov["lost_workers"]), ("blacklist", 0),
                       ("decommission", 0)):
            lines.append(f'worker_num{{tag="{tag}"}} {n}')
        return "\n".join(lines) + "\n"

    def _report(self) -> str:
        ov = self.sim.overview()
        live, _ = self.sim.worker_infos()
        cap = ov["capacity"] or 1
        rows = [("active_master", ov["master_addr"]), ("capacity", ov["capacity"]),
                ("available", f"{ov['available']} ({ov['available'] * 100 // cap}%)"),
                ("fs_used", f"{ov['fs_used']} ({ov['fs_used'] * 100 // cap}%)"),
                ("live_worker_num", ov["live_workers"]), ("lost_worker_num", ov["lost_workers"]),
                ("inode_dir_num", ov["dir_total"]), ("inode_file_num", ov["files_total"]),
                ("block_num", sum(w["block_num"] for w in live))]
        text = "".join(f"{k:>20}: {v}\n" for k, v in rows)
        return text + "".join(f"{'':>20}  {w['address']['hostname']}:{w['address']['rpc_port']}\n" for w in live)


def _json(status: int, body: Any) -> ProxyResponse:
    return ProxyResponse(status, {"Content-Type": "application/json"}, json.dumps(body).encode())
