"""The real `helm` CLI, against one cluster, with a private kubeconfig and a private helm home.

Called by the Curvine stage, the Curvine upgrade and scale-out workflows, and the drift check. Charts come
from a repository URL (``--repo``): the inventory's ``curvine.repo_url``, which the connection-level setting
``KVFLEET_HELM_REPO_CURVINE`` may override (an internal mirror in production, the stand-in chart repository in
the sandbox). Every command kvfleet would run can be rendered as text for dry runs (``render``).

Values reach helm only as YAML files kvfleet writes (``-f``, ``values_file``), never ``--set``: helm's strvals
parser splits a ``--set`` value on commas and reads backslash escapes (docs/reference/kubernetes.md#helm-set-parsing),
so a user's value ``INFO,cluster.formatMaster=true`` would set a second key. A YAML string stays one string.
``set_args`` remains only to print kvfleet's own constant flag flips in messages a person may copy.

What an upgrade would deploy is rendered with the same command and ``--dry-run=server -o json``
(``upgrade_render``: the manifest and the hooks, with helm's own value merge); what a rollback would deploy is the
target revision's stored manifest and hooks (``revision_manifest``).

Errors and results are typed, so no caller reads helm's text again. Helm speaks only through its exit code and
stderr, so this module is the one place that reads that text (``classify``):
- ``ReleaseNotFound`` (a ``HelmPermanent``): the release does not exist, or has no deployed revision (helm's
  storage driver's ``release: not found``; an upgrade's ``has no deployed releases``). ``status`` and
  ``deployed`` turn it into ``None``, as the amazon provider's hooks turn "not found" into a state;
- ``HelmConflict`` (a ``TemporaryError``): another helm operation on the release is in progress, or the API
  server answered 409 (``the object has been modified``): retry later;
- ``HelmPermanent`` (a ``PermanentError``): helm says the input is wrong (schema, unknown chart version, an
  unknown flag, a name already in use);
- anything else (an API timeout, a 5xx, helm over its own timeout) is a plain ``TemporaryError``.
Reads return typed results: ``ReleaseStatus`` (``status``) and ``Revision`` (``revisions``).

Once a stop is requested (SIGTERM, ``clients.stop``), ``run`` refuses install, upgrade, rollback and uninstall with
``StopRequested`` before helm starts (an upgrade with ``--dry-run`` is a read); the undo a sequence owes (the format
flags flipped false after a first install) runs inside ``stop.allow_after_stop``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvfleet.clients.stop import refuse_if_stopped
from kvfleet.errors import PermanentError, TemporaryError
from kvfleet.paths import project_root
from kvfleet.settings import load_settings

log = logging.getLogger(__name__)
# helm's own words (helm v3/v4: pkg/storage/driver ``ErrReleaseNotFound``, pkg/action ``errPending``, and the
# API server's 409 text), matched once, here.
_RELEASE_NOT_FOUND_HINTS = ("release: not found", "has no deployed releases")
_CONFLICT_HINTS = ("another operation (install/upgrade/rollback) is in progress", "the object has been modified",
                   "operation cannot be fulfilled")
# The helm commands that change a release (with their aliases); after a stop none starts (``clients.stop``).
_CHANGING_COMMANDS = frozenset({"install", "upgrade", "rollback", "uninstall", "delete", "del", "un"})
_PERMANENT_HINTS = ("not found", "values don't meet the specifications", "invalid", "cannot re-use a name",
                    "unknown flag", "chart requires", "no such")


class HelmPermanent(PermanentError):
    """helm refused the command for a reason retrying cannot fix (the input, the chart, the release's state)."""


class ReleaseNotFound(HelmPermanent):
    """The release does not exist (or has no deployed revision) in that namespace."""


class HelmConflict(TemporaryError):
    """Another operation holds the release, or the API server answered 409: retry later."""


@dataclass(frozen=True)
class ReleaseStatus:
    """``helm status -o json``, the parts kvfleet reads."""

    name: str
    namespace: str
    revision: int
    status: str  # deployed | failed | pending-upgrade | ...

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> ReleaseStatus:
        info = doc.get("info") or {}
        return cls(name=str(doc.get("name") or ""), namespace=str(doc.get("namespace") or ""),
                   revision=int(doc.get("version") or 0), status=str(info.get("status") or ""))


@dataclass(frozen=True)
class Revision:
    """One row of ``helm history -o json``."""

    revision: int
    status: str
    chart: str  # name-version, e.g. curvine-0.3.3-alpha
    updated: str | None = None
    app_version: str | None = None
    description: str | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Revision:
        updated = row.get("updated")
        return cls(revision=int(row["revision"]), status=str(row.get("status") or ""),
                   chart=str(row.get("chart") or ""), updated=str(updated) if updated else None,
                   app_version=row.get("app_version"), description=row.get("description"))


def classify(err: str, text: str) -> TemporaryError | PermanentError:
    """The typed error of a failed helm command: ``err`` is helm's stderr, ``text`` the message to raise with."""
    lowered = err.lower()
    if any(h in lowered for h in _RELEASE_NOT_FOUND_HINTS):
        return ReleaseNotFound(text)
    if any(h in lowered for h in _CONFLICT_HINTS):
        return HelmConflict(text, delay=15)
    if any(h in lowered for h in _PERMANENT_HINTS):
        return HelmPermanent(text)
    return TemporaryError(text, delay=10)


def helm_binary() -> str:
    found = load_settings().helm or shutil.which("helm")
    if not found:  # the pinned binary `make tools` unpacks beside a source checkout
        local = project_root() / ".tools" / "bin" / "helm"
        found = str(local) if local.exists() else None
    if not found:
        raise PermanentError("helm not found on PATH (set KVFLEET_HELM, or run `make tools` for .tools/bin/helm)")
    return found


def set_args(values: Mapping[str, Any]) -> list[str]:
    """``--set key=value`` pairs in a stable order; booleans as true/false. For messages only (kvfleet's own
    constant flag flips, which contain no comma or escape): kvfleet itself passes values as files."""
    out: list[str] = []
    for key in sorted(values):
        value = values[key]
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += ["--set", f"{key}={text}"]
    return out


def render(argv: Sequence[str]) -> str:
    """The command line as a user would type it (no kubeconfig path; a values file by its name)."""
    shown = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--kubeconfig":
            skip = True
            continue
        shown.append(Path(arg).name if _is_own_values_file(arg) else arg)
    return " ".join(shlex.quote(a) for a in ["helm", *shown[1:]])


_HOME_PREFIX = "kvfleet-helm-"


def _is_own_values_file(arg: str) -> bool:
    path = Path(arg)
    return arg.endswith(".yaml") and path.parent.name == "values" and path.parent.parent.name.startswith(_HOME_PREFIX)


def nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys (``a.b[0].c``, ``\\.`` for a literal dot) as a nested mapping (a values file's shape)."""
    from kvfleet.fleet.curvine_values import nested

    return nested(values)


def split_manifest(text: str) -> list[dict[str, Any]]:
    """A rendered multi-document manifest as objects (empty documents dropped)."""
    import yaml

    return [d for d in yaml.safe_load_all(text or "") if isinstance(d, dict)]


class Helm:
    def __init__(self, access: Any, *, timeout_s: float = 300) -> None:
        self.access = access
        self.timeout_s = timeout_s
        self._home = Path(tempfile.mkdtemp(prefix=_HOME_PREFIX))
        self._files = itertools.count(1)
        self.files: dict[str, str] = {}  # values file path -> its YAML, for plans and records

    def values_file(self, values: Mapping[str, Any], name: str = "values") -> str:
        """Write ``values`` (dotted or nested keys) as a YAML values file in the private helm home (0600)."""
        import yaml

        folder = self._home / "values"
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"{name}-{next(self._files):03d}.yaml"
        text = yaml.safe_dump(nest(values), sort_keys=True, default_flow_style=False, width=120)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        self.files[str(path)] = text
        return str(path)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
            env[var] = str(self._home / sub)
        return env

    def argv(self, *args: str) -> list[str]:
        return [helm_binary(), *args]

    def run(self, *args: str, what: str) -> str:
        if args and args[0] in _CHANGING_COMMANDS and not any(a.startswith("--dry-run") for a in args):
            # After SIGTERM no new change starts (``clients.stop``): refused before helm runs.
            refuse_if_stopped(f"{what} (helm {args[0]})")
        # The token reaches helm through a file renewed while it runs (``ClusterAccess.fresh_credential``): an
        # upgrade that outlasts the token, or the assumed role's credentials, keeps going.
        with self.access.fresh_credential(self._home) as credential:
            kubeconfig = self.access.write_kubeconfig(self._home, credential_file=credential)
            argv = [helm_binary(), *args, "--kubeconfig", str(kubeconfig)]
            log.info("$ %s", render(argv))
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, env=self._env(), timeout=self.timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise TemporaryError(f"{what}: helm timed out after {self.timeout_s:.0f}s") from exc
            finally:
                kubeconfig.unlink(missing_ok=True)
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip()
            raise classify(err, f"{what}: {render(argv)} failed: {err}")
        return proc.stdout

    # ---- reads -----------------------------------------------------------------------------------------------
    def status(self, release: str, namespace: str) -> ReleaseStatus | None:
        """The release's status; None when it does not exist."""
        try:
            out = self.run("status", release, "-n", namespace, "-o", "json", what="helm status")
        except ReleaseNotFound:
            return None
        return ReleaseStatus.of(json.loads(out))

    def values(self, release: str, namespace: str, *, revision: int | None = None,
               all_values: bool = True) -> dict[str, Any]:
        args = ["get", "values", release, "-n", namespace, "-o", "json"]
        if all_values:
            args.append("--all")
        if revision is not None:
            args += ["--revision", str(revision)]
        return dict(json.loads(self.run(*args, what="helm get values") or "{}") or {})

    def history(self, release: str, namespace: str) -> list[dict[str, Any]]:
        """``helm history -o json`` as helm prints it (raises ``ReleaseNotFound``). Stages use ``revisions``."""
        out = self.run("history", release, "-n", namespace, "-o", "json", "--max", "256", what="helm history")
        return list(json.loads(out or "[]"))

    def revisions(self, release: str, namespace: str) -> list[Revision] | None:
        """Every revision in the release history, oldest first; None when the release does not exist."""
        try:
            return [Revision.of(row) for row in self.history(release, namespace)]
        except ReleaseNotFound:
            return None

    def chart_exists(self, chart: str, repo: str, version: str) -> bool:
        try:
            self.run("show", "chart", chart, "--repo", repo, "--version", version, what="helm show chart")
        except HelmPermanent:
            return False
        return True

    def revision_manifest(self, release: str, namespace: str, revision: int | None = None) -> list[dict[str, Any]]:
        """What ``helm rollback`` to ``revision`` re-deploys: that revision's stored manifest and its hooks (the
        current release's when ``revision`` is None)."""
        at = ["--revision", str(revision)] if revision is not None else []
        manifest = self.run("get", "manifest", release, "-n", namespace, *at, what="helm get manifest")
        hooks = self.run("get", "hooks", release, "-n", namespace, *at, what="helm get hooks")
        return split_manifest(manifest) + split_manifest(hooks)

    def upgrade_render(self, args: Sequence[str]) -> list[dict[str, Any]]:
        """What ``helm <args>`` (an upgrade) would deploy: the same command with ``--dry-run=server -o json``,
        so helm merges the values exactly as the real run will; the manifest and the hooks' manifests."""
        if not args or args[0] != "upgrade":
            raise PermanentError(f"upgrade_render needs a helm upgrade command, got {render(['helm', *args])}")
        out = self.run(*args, "--dry-run=server", "-o", "json", what="helm upgrade --dry-run=server")
        try:
            rel = json.loads(out)
        except json.JSONDecodeError as exc:
            raise PermanentError(f"helm upgrade --dry-run=server printed no release JSON: {out[:300]!r}") from exc
        docs = split_manifest(str(rel.get("manifest") or ""))
        for hook in rel.get("hooks") or []:
            docs += split_manifest(str(hook.get("manifest") or ""))
        return docs

    def chart_defaults(self, chart: str, repo: str, version: str) -> dict[str, Any]:
        import yaml

        out = self.run("show", "values", chart, "--repo", repo, "--version", version, what="helm show values")
        return dict(yaml.safe_load(out) or {})

    # ---- writes ----------------------------------------------------------------------------------------------
    def install_args(self, release: str, chart: str, namespace: str, *, repo: str, version: str,
                     values: Mapping[str, Any]) -> list[str]:
        # no --create-namespace: the namespace comes with the kvfleet-bootstrap bundle (k8s/rbac/README.md)
        return ["install", release, chart, "--repo", repo, "--version", version, "-n", namespace,
                "-f", self.values_file(values, "install")]

    def upgrade_args(self, release: str, chart: str, namespace: str, *, repo: str, version: str,
                     values: Mapping[str, Any], reuse_values: bool = True) -> list[str]:
        args = ["upgrade", release, chart, "--repo", repo, "--version", version, "-n", namespace]
        if reuse_values:
            args.append("--reuse-values")
        return [*args, "-f", self.values_file(values, "upgrade")] if values else args

    def install(self, release: str, chart: str, namespace: str, **kw: Any) -> str:
        return self.run(*self.install_args(release, chart, namespace, **kw), what=f"helm install {release}")

    def upgrade(self, release: str, chart: str, namespace: str, **kw: Any) -> str:
        return self.run(*self.upgrade_args(release, chart, namespace, **kw), what=f"helm upgrade {release}")

    def rollback(self, release: str, namespace: str, revision: int) -> str:
        return self.run("rollback", release, str(revision), "-n", namespace, what=f"helm rollback {release}")

    def close(self) -> None:
        shutil.rmtree(self._home, ignore_errors=True)
