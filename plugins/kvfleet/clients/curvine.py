"""Curvine's master web API (``/api/overview``, ``/api/workers``, ``/api/browse``), through the API-server pod
proxy of the master pod, so no Service or port-forward is needed (docs/reference/curvine.md#master-api: web port 9000 in
the chart).

Called by the Curvine stage (capacity verification), the upgrade workflow (snapshots, metadata preserved)
and scale-out (new workers live).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvfleet.fleet import constants as C


@dataclass(frozen=True)
class Overview:
    capacity: int
    available: int
    fs_used: int
    live_workers: int
    lost_workers: int
    files_total: int
    dir_total: int
    raw: dict[str, Any]

    def snapshot(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "available": self.available, "fs_used": self.fs_used,
                "live_workers": self.live_workers, "lost_workers": self.lost_workers,
                "files_total": self.files_total, "dir_total": self.dir_total}


class CurvineMaster:
    def __init__(self, kube: Any, namespace: str = C.CURVINE_NAMESPACE, pod: str = f"{C.CURVINE_MASTER_STS}-0",
                 port: int = C.CURVINE_MASTER_WEB_PORT) -> None:
        self.kube, self.namespace, self.pod, self.port = kube, namespace, pod, port

    def overview(self) -> Overview:
        raw = dict(self.kube.proxy_get_json(self.namespace, self.pod, self.port, "api/overview"))
        return Overview(
            capacity=int(raw.get("capacity") or 0), available=int(raw.get("available") or 0),
            fs_used=int(raw.get("fs_used") or 0), live_workers=int(raw.get("live_workers") or 0),
            lost_workers=int(raw.get("lost_workers") or 0), files_total=int(raw.get("files_total") or 0),
            dir_total=int(raw.get("dir_total") or 0), raw=raw)

    def workers(self) -> dict[str, list[dict[str, Any]]]:
        raw = self.kube.proxy_get_json(self.namespace, self.pod, self.port, "api/workers")
        return {"live_workers": list(raw.get("live_workers") or []),
                "lost_workers": list(raw.get("lost_workers") or [])}

    def browse(self, path: str) -> Any:
        return self.kube.proxy_get_json(self.namespace, self.pod, self.port, f"api/browse?path={path}")
