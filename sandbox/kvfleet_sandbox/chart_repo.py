"""An HTTP Helm chart repository on 127.0.0.1 serving the sandbox's stand-in Curvine and Kyverno charts.

Started by the Curvine simulation (``kvfleet_sandbox.controllers.curvine``) once per process and shared by every
cluster twin; its URL is published as ``twin.services["chart_repo_url"]``. kvfleet's inventory points the chart
reference at it in the sandbox (production points at ``https://curvineio.github.io/helm-charts``), so the real
``helm`` runs the same commands against both:

    helm install curvine curvine --repo http://127.0.0.1:PORT --version 0.3.2-alpha -n curvine ...

Each chart has one source directory under ``sandbox/charts/<chart>/``. Every published version is packaged from it
at start-up with its ``version`` and ``appVersion`` stamped into ``Chart.yaml`` (the image tag follows appVersion,
so an upgrade to a newer version really rolls the pods), plus optional default-value overrides per version. Tests
can publish more versions (``publish``), e.g. a chart whose new defaults would bring a format flag back.
"""

from __future__ import annotations

import copy
import datetime as dt
import gzip
import hashlib
import io
import re
import tarfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

CHARTS_DIR = Path(__file__).resolve().parent / "charts"

# The versions the repository publishes at start-up: the blog's 0.3.2-alpha and a newer one to upgrade to.
# Chart-level differences are deliberately trivial (appVersion, hence the image tag and the version label); the
# value keys never change between them.
DEFAULT_VERSIONS: dict[str, tuple[str, ...]] = {
    "curvine": ("0.3.2-alpha", "0.3.3-alpha"),
    "curvine-csi": ("0.3.2-alpha",),
    # The Kyverno chart version kvfleet pins (kvfleet.stages.kyverno.CHART_VERSION; upstream tag
    # kyverno-chart-3.9.0, tests/conformance/facts/kyverno_chart.yaml).
    "kyverno": ("3.9.0",),
}
# appVersion where it is not the chart version (upstream Chart.yaml at that version).
APP_VERSIONS: dict[tuple[str, str], str] = {("kyverno", "3.9.0"): "v1.19.0"}

# Default-value overrides for a "broken release": its worker pods crash at start-up and never become Ready
# (the Curvine simulation's fault hook), e.g. ``repo.publish("curvine", "0.3.4-alpha",
# value_overrides=CRASHLOOP_WORKER)`` to drive a failed upgrade and its rollback.
CRASHLOOP_WORKER: dict[str, Any] = {"worker": {"extraEnv": [{"name": "CURVINE_SANDBOX_FAULT", "value": "crashloop"}]}}

_FIXED_MTIME = 1_700_000_000  # reproducible archives: the same version always has the same digest


@dataclass(frozen=True)
class ChartPackage:
    name: str
    version: str
    app_version: str
    description: str
    data: bytes  # the .tgz
    created: str

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}.tgz"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def package_chart(name: str, version: str, *, app_version: str | None = None,
                  value_overrides: dict[str, Any] | None = None, source: Path | None = None) -> ChartPackage:
    """Build the ``<name>-<version>.tgz`` helm expects (every file under a top-level ``<name>/`` directory)."""
    src = source or CHARTS_DIR / name
    if not (src / "Chart.yaml").is_file():
        raise FileNotFoundError(f"no chart source at {src}")
    app_version = app_version or version
    chart_yaml = (src / "Chart.yaml").read_text()
    chart_yaml = re.sub(r"(?m)^version:.*$", f"version: {version}", chart_yaml)
    chart_yaml = re.sub(r"(?m)^appVersion:.*$", f"appVersion: {app_version}", chart_yaml)
    description = str((yaml.safe_load(chart_yaml) or {}).get("description", ""))
    files: dict[str, bytes] = {}
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src).as_posix()
        if rel.startswith(".") or "/." in rel or rel.endswith((".pyc", "~")):
            continue
        files[rel] = path.read_bytes()
    files["Chart.yaml"] = chart_yaml.encode()
    if value_overrides:
        values = _deep_merge(yaml.safe_load(files["values.yaml"]) or {}, value_overrides)
        files["values.yaml"] = yaml.safe_dump(values, sort_keys=False).encode()

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, content in sorted(files.items()):
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size = len(content)
            info.mtime = _FIXED_MTIME
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    data = gzip.compress(raw.getvalue(), mtime=_FIXED_MTIME)
    created = dt.datetime.fromtimestamp(_FIXED_MTIME, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return ChartPackage(name, version, app_version, description, data, created)


@dataclass
class ChartRepository:
    """A Helm repository (``index.yaml`` + packaged charts) over HTTP on 127.0.0.1."""

    host: str = "127.0.0.1"
    port: int = 0
    versions: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_VERSIONS))
    _packages: dict[str, ChartPackage] = field(default_factory=dict, init=False)
    _server: ThreadingHTTPServer | None = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        if self.host != "127.0.0.1":
            raise ValueError(f"the chart repository binds 127.0.0.1 only, not {self.host}")
        for name, versions in self.versions.items():
            for version in versions:
                self.publish(name, version)

    # --- content ---------------------------------------------------------------------------------------

    def publish(self, name: str, version: str, *, app_version: str | None = None,
                value_overrides: dict[str, Any] | None = None) -> ChartPackage:
        """Package and serve one more version (replacing a package of the same name and version)."""
        pkg = package_chart(name, version, app_version=app_version or APP_VERSIONS.get((name, version)),
                            value_overrides=value_overrides)
        with self._lock:
            self._packages[pkg.filename] = pkg
        return pkg

    def index_yaml(self) -> str:
        with self._lock:
            packages = list(self._packages.values())
        entries: dict[str, list[dict[str, Any]]] = {}
        for pkg in packages:
            entries.setdefault(pkg.name, []).append({
                "apiVersion": "v2", "name": pkg.name, "version": pkg.version, "appVersion": pkg.app_version,
                "description": pkg.description, "type": "application", "created": pkg.created,
                "digest": pkg.digest, "urls": [pkg.filename],
            })
        for items in entries.values():  # newest first, as `helm repo index` writes them
            items.sort(key=lambda e: _semver_key(e["version"]), reverse=True)
        generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return str(yaml.safe_dump({"apiVersion": "v1", "entries": entries, "generated": generated}, sort_keys=False))

    def package(self, filename: str) -> ChartPackage | None:
        with self._lock:
            return self._packages.get(filename)

    # --- server ----------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("chart repository not started")
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> ChartRepository:
        if self._server is not None:
            return self
        repo = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve(body=True)

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def _serve(self, *, body: bool) -> None:
                path = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "index.yaml"
                if path == "index.yaml":
                    data, ctype = repo.index_yaml().encode(), "application/x-yaml"
                else:
                    pkg = repo.package(path)
                    if pkg is None:
                        data, ctype = f"404 chart {path} not found\n".encode(), "text/plain"
                        self.send_response(404)
                        self._finish(data, ctype, body)
                        return
                    data, ctype = pkg.data, "application/gzip"
                self.send_response(200)
                self._finish(data, ctype, body)

            def _finish(self, data: bytes, ctype: str, body: bool) -> None:
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

        server = ThreadingHTTPServer((self.host, self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="chart-repo", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def _semver_key(version: str) -> tuple[Any, ...]:
    core, _, pre = version.partition("-")
    nums = tuple(int(x) if x.isdigit() else 0 for x in core.split("."))
    # A release sorts after its pre-releases (1.0.0 > 1.0.0-alpha).
    return (*nums, 1 if not pre else 0, pre)


# --- the one repository of this process ---------------------------------------------------------------

_shared: ChartRepository | None = None
_users = 0
_last_port = 0
_shared_lock = threading.Lock()


def acquire_shared() -> ChartRepository:
    """The process-wide repository, started on first use; pair every call with ``release_shared``.

    A restart reuses the previous port when it is free, so a URL a process exported earlier
    (``KVFLEET_HELM_REPO_CURVINE``) keeps working across sandboxes started one after another."""
    global _shared, _users, _last_port
    with _shared_lock:
        if _shared is None:
            try:
                _shared = ChartRepository(port=_last_port).start()
            except OSError:
                _shared = ChartRepository().start()
            _last_port = int(_shared.url.rsplit(":", 1)[1])
        _users += 1
        return _shared


def release_shared() -> None:
    """Stop the shared repository when its last user lets go."""
    global _shared, _users
    with _shared_lock:
        _users = max(0, _users - 1)
        if _users == 0 and _shared is not None:
            _shared.stop()
            _shared = None
