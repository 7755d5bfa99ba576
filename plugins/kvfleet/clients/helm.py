"""The real `helm` CLI, against one cluster, with a private kubeconfig and a private helm home.

Called by the Curvine stage, the Curvine upgrade and scale-out workflows, and the drift check. Charts come
from a repository URL (``--repo``): the inventory's ``curvine.repo_url``, which the connection-level setting
``KVFLEET_HELM_REPO_CURVINE`` may override (an internal mirror in production, the stand-in chart repository in
the sandbox). Every command kvfleet would run can be rendered as text for dry runs (``render``).

Errors: a helm failure is a ``PermanentError`` when helm says the input is wrong (schema, not found, no
deployed release) and a ``TemporaryError`` otherwise (API timeouts, conflicts).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvfleet.errors import PermanentError, TemporaryError

log = logging.getLogger(__name__)
_PERMANENT_HINTS = ("not found", "values don't meet the specifications", "invalid", "has no deployed releases",
                    "cannot re-use a name", "unknown flag", "chart requires", "no such")


def helm_binary() -> str:
    found = os.environ.get("KVFLEET_HELM") or shutil.which("helm")
    if not found:  # the pinned binary `make tools` unpacks beside a source checkout
        from kvfleet.history.db import project_root

        local = project_root() / ".tools" / "bin" / "helm"
        found = str(local) if local.exists() else None
    if not found:
        raise PermanentError("helm not found on PATH (set KVFLEET_HELM, or run `make tools` for .tools/bin/helm)")
    return found


def set_args(values: Mapping[str, Any]) -> list[str]:
    """``--set key=value`` pairs in a stable order; booleans as true/false."""
    out: list[str] = []
    for key in sorted(values):
        value = values[key]
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += ["--set", f"{key}={text}"]
    return out


def render(argv: Sequence[str]) -> str:
    """The command line as a user would type it (no kubeconfig path)."""
    shown = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--kubeconfig":
            skip = True
            continue
        shown.append(arg)
    return " ".join(shlex.quote(a) for a in ["helm", *shown[1:]])


class Helm:
    def __init__(self, access: Any, *, timeout_s: float = 300) -> None:
        self.access = access
        self.timeout_s = timeout_s
        self._home = Path(tempfile.mkdtemp(prefix="kvfleet-helm-"))

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
            env[var] = str(self._home / sub)
        return env

    def argv(self, *args: str) -> list[str]:
        return [helm_binary(), *args]

    def run(self, *args: str, what: str) -> str:
        kubeconfig = self.access.write_kubeconfig(self._home)
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
            text = f"{what}: {render(argv)} failed: {err}"
            if any(h in err.lower() for h in _PERMANENT_HINTS):
                raise PermanentError(text)
            raise TemporaryError(text, delay=10)
        return proc.stdout

    # ---- reads -----------------------------------------------------------------------------------------------
    def status(self, release: str, namespace: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.run("status", release, "-n", namespace, "-o", "json", what="helm status")))
        except PermanentError as exc:
            if "not found" in str(exc).lower():
                return None
            raise

    def values(self, release: str, namespace: str, *, revision: int | None = None, all_values: bool = True) -> dict:
        args = ["get", "values", release, "-n", namespace, "-o", "json"]
        if all_values:
            args.append("--all")
        if revision is not None:
            args += ["--revision", str(revision)]
        return dict(json.loads(self.run(*args, what="helm get values") or "{}") or {})

    def history(self, release: str, namespace: str) -> list[dict[str, Any]]:
        out = self.run("history", release, "-n", namespace, "-o", "json", "--max", "256", what="helm history")
        return list(json.loads(out or "[]"))

    def chart_exists(self, chart: str, repo: str, version: str) -> bool:
        try:
            self.run("show", "chart", chart, "--repo", repo, "--version", version, what="helm show chart")
        except PermanentError:
            return False
        return True

    def chart_defaults(self, chart: str, repo: str, version: str) -> dict[str, Any]:
        import yaml

        out = self.run("show", "values", chart, "--repo", repo, "--version", version, what="helm show values")
        return dict(yaml.safe_load(out) or {})

    # ---- writes ----------------------------------------------------------------------------------------------
    def install_args(self, release: str, chart: str, namespace: str, *, repo: str, version: str,
                     values: Mapping[str, Any]) -> list[str]:
        return ["install", release, chart, "--repo", repo, "--version", version, "-n", namespace,
                "--create-namespace", *set_args(values)]

    def upgrade_args(self, release: str, chart: str, namespace: str, *, repo: str, version: str,
                     values: Mapping[str, Any], reuse_values: bool = True) -> list[str]:
        args = ["upgrade", release, chart, "--repo", repo, "--version", version, "-n", namespace]
        if reuse_values:
            args.append("--reuse-values")
        return args + set_args(values)

    def install(self, release: str, chart: str, namespace: str, **kw: Any) -> str:
        return self.run(*self.install_args(release, chart, namespace, **kw), what=f"helm install {release}")

    def upgrade(self, release: str, chart: str, namespace: str, **kw: Any) -> str:
        return self.run(*self.upgrade_args(release, chart, namespace, **kw), what=f"helm upgrade {release}")

    def rollback(self, release: str, namespace: str, revision: int) -> str:
        return self.run("rollback", release, str(revision), "-n", namespace, what=f"helm rollback {release}")

    def close(self) -> None:
        shutil.rmtree(self._home, ignore_errors=True)
