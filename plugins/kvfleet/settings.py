"""kvfleet's settings: every ``KVFLEET_*`` environment variable the product reads, as one typed model.

Read when used: :func:`load_settings` builds a fresh :class:`Settings` from the environment each time it is
called, and nothing reads the environment at import (a DAG file, a worker and the CLI see the value of the moment,
and a test sets a variable without reloading a module). The stages get theirs through ``StageContext.settings``.

A bad value is a :class:`ConfigError` (a ``PermanentError``: the task fails without spending retries; the CLI
exits 2) naming the variable, the value, what is allowed and the fix. A ``KVFLEET_`` variable that is no setting
is logged once per process, with the nearest known name. ``docs/settings.md`` is generated from this model
(``python -m kvfleet.settings --write docs/settings.md``; ``tests/unit/test_settings.py`` fails when it is out of
date).

Not here: ``KVFLEET_SANDBOX_*`` belongs to the digital twin, which reads its own (``kvfleet_sandbox``): product
code knows nothing of the twin, and the twin reaches kvfleet only through the variables below. The names in
:data:`NOT_SETTINGS` are read by the project's tooling (``tools/up.sh``, docker compose, the test suite), never by
kvfleet itself.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from kvfleet.errors import PermanentError
from kvfleet.fleet.shared_rules import NOT_A_URL, SNS_TOPIC_ARN, redact_url, repo_url_problem

log = logging.getLogger(__name__)
PREFIX = "KVFLEET_"
TWIN_PREFIX = "KVFLEET_SANDBOX_"
NOT_SETTINGS = frozenset({
    "KVFLEET_UP_PORT", "KVFLEET_UP_USER", "KVFLEET_DOWN_TIMEOUT",  # tools/up.sh, tools/down.sh
    "KVFLEET_FLEET_FILE", "KVFLEET_IMAGE", "KVFLEET_DB_PASSWORD",  # docker-compose.yaml and its .env
    "KVFLEET_FAULTS", "KVFLEET_FUZZ_LONG", "KVFLEET_FAULT_MATRIX_OUT",  # the test suite's switches
    "KVFLEET_UPSTREAM_CURVINE_HELM", "KVFLEET_UPSTREAM_CURVINE_CHART",
})
PG_SCHEMES = re.compile(r"^postgres(ql)?(\+psycopg2)?$")  # the driver kvfleet ships (psycopg2)
_warned: set[str] = set()
# The mapping load_settings(env) reads instead of os.environ, for the duration of that call.
_ENV: ContextVar[Mapping[str, str] | None] = ContextVar("kvfleet_settings_env", default=None)


class ConfigError(PermanentError):
    """A ``KVFLEET_*`` variable has a value kvfleet cannot use; the message names it, the value and the fix."""


def _extra(group: str, allowed: str, *, secret: bool = False) -> dict[str, Any]:
    return {"group": group, "allowed": allowed, "secret": secret}


def _seconds(default: float, lo: float, hi: float, group: str, description: str) -> Any:
    return Field(default, ge=lo, le=hi, description=description,
                 json_schema_extra=_extra(group, f"a number of seconds from {lo:g} to {hi:g}"))


def _http_url(value: str, what: str) -> str:
    """``value`` when it is an ``http(s)://host[:port]`` URL with a valid port (or empty); ValueError otherwise."""
    if not value:
        return value
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:  # a port over 65535 or not a number, an unclosed IPv6 bracket
        ok = False
    if not ok or " " in value:
        raise ValueError(f"is not {what}")
    return value


class Settings(BaseSettings):
    """Every ``KVFLEET_*`` setting; the variable is ``KVFLEET_`` + the field name in upper case. Empty = unset."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, extra="ignore", frozen=True,
                                      validate_default=True)

    # ---- the inventory ----
    fleet: str = Field("fleet.example.yaml", min_length=1, description=(
        "The fleet inventory YAML: the default of the DAGs' `fleet` Param, of the drift watch and of the CLI's "
        "`--fleet`. A local path (bake it into the image or mount it)."),
        json_schema_extra=_extra("inventory", "a file path"))
    fleet_paths: Annotated[tuple[str, ...], NoDecode] = Field((), description=(
        "Where a DAG run's `fleet` Param may point: inventory files or directories, separated by `:`. A run "
        "naming any other file is refused before it is read. Unset: the directory of `KVFLEET_FLEET`. The CLI's "
        "`--fleet` is not restricted (it reads as the user who runs it)."),
        json_schema_extra=_extra("inventory", "paths separated by `:`"))

    # ---- waits ----
    poll_seconds: float = _seconds(5.0, 0.01, 300, "waits", "How often waits poll: 5 s against real AWS; the demo "
                                   "and the tests set it lower.")
    timeout_cluster_s: float = _seconds(3600.0, 1, 86400, "waits",
                                        "Patience for a HyperPod cluster update (back to InService), per try.")
    timeout_addon_s: float = _seconds(1200.0, 1, 86400, "waits", "Patience for an EKS add-on to be ACTIVE, per try.")
    timeout_pods_s: float = _seconds(1800.0, 1, 86400, "waits",
                                     "Patience for pods and controllers to be ready, per try.")
    timeout_pvc_s: float = _seconds(300.0, 1, 86400, "waits", "Patience for a PVC to be Bound, per try.")
    drift_watch_quiet_s: float = _seconds(15.0, 0, 3600, "waits", (
        "The drift watch emits a burst of changes once the fleet has been quiet this long (read when the DAG file "
        "is parsed)."))

    # ---- charts ----
    helm: str = Field("", description="The `helm` binary. Unset: `helm` on PATH, else `.tools/bin/helm` of a "
                      "checkout.", json_schema_extra=_extra("charts", "a file path"))
    helm_repo_curvine: str = Field("", description=(
        "A mirror of the Curvine chart repository, used instead of each cluster's `curvine.repo_url`. The same rule "
        "as the inventory: https, or plain http with `KVFLEET_HELM_REPO_ALLOW_INSECURE=true`."),
        json_schema_extra=_extra("charts", "an https:// chart repository URL", secret=True))
    helm_repo_kyverno: str = Field("", description=(
        "A mirror of the Kyverno chart repository (default https://kyverno.github.io/kyverno/); the same rule."),
        json_schema_extra=_extra("charts", "an https:// chart repository URL", secret=True))
    helm_repo_allow_insecure: bool = Field(False, description=(
        "Allow a plain-http `KVFLEET_HELM_REPO_*` mirror (a repository you trust on your network), as "
        "`allow_insecure_repo: true` does for an inventory `repo_url`."),
        json_schema_extra=_extra("charts", "true or false"))
    kyverno_install: Literal["install", "refuse"] = Field("refuse", description=(
        "Whether kvfleet installs a missing Kyverno on a kyverno-mode cluster. `refuse` (the default): the cluster "
        "is refused with the exact helm command, for a cluster admin to run (the kvfleet-bootstrap bundle prints "
        "it). `install` needs kvfleet's identity bound to cluster-admin while it installs (k8s/rbac/README.md)."),
        json_schema_extra=_extra("charts", "install or refuse"))

    # ---- the history database (read by kvfleet.history.db) ----
    history_url: str = Field("", description=(
        "The history database, as its writer role: a `postgresql://` SQLAlchemy URL, or `embedded` for an "
        "embedded PostgreSQL under the state directory (explicit opt-in: the demo and local runs). Unset: the "
        "Airflow connection `kvfleet_history`."),
        json_schema_extra=_extra("history", "`embedded` or a postgresql:// URL", secret=True))
    history_owner_url: str = Field("", description=(
        "The history database as its owner role, for migrations only (`kvfleet db upgrade`). Unset: the Airflow "
        "connection `kvfleet_history_owner`, else migrations run as the writer."),
        json_schema_extra=_extra("history", "a postgresql:// URL", secret=True))
    history_reader_url: str = Field("", description=(
        "The history database as its reader role (SELECT only), for `kvfleet audit` and the kvfleet page. Unset: "
        "the Airflow connection `kvfleet_history_reader`, else the writer's URL."),
        json_schema_extra=_extra("history", "`embedded` or a postgresql:// URL", secret=True))
    history_connect_timeout_s: float = _seconds(10.0, 1, 86400, "history", (
        "libpq's connect timeout for the history database (rounded up to whole seconds, at least 2): a server "
        "that accepts and never answers fails the command or the task with this cause."))
    history_statement_timeout_s: float = _seconds(300.0, 1, 86400, "history",
                                                  "Each history statement's timeout (PostgreSQL statement_timeout).")

    # ---- notifications ----
    notify_sns_topic_arn: str = Field(
        "", description="The global SNS topic for notifications (docs/notifications.md).",
        json_schema_extra=_extra("notify", "an SNS topic ARN (arn:aws:sns:<region>:<account>:<topic>)"))
    notify_aws_conn_id: str = Field("aws_default", description="The Airflow AWS connection SNS is published with.",
                                    json_schema_extra=_extra("notify", "an Airflow connection id"))
    notify_region: str = Field("", description="The SNS region. Unset: the topic ARN's region.",
                               json_schema_extra=_extra("notify", "an AWS region"))
    notify_webhook_url: str = Field("", description=(
        "The global webhook: receives one `POST` of `application/json` per event; redirects are not followed."),
        json_schema_extra=_extra("notify", "an http:// or https:// URL", secret=True))
    notify_timeout_s: float = _seconds(5.0, 1, 60, "notify", "Per attempt, for SNS and the webhook.")
    notify_global: Literal["fallback", "always"] = Field("fallback", description=(
        "`fallback`: the global destinations get what no LOB of the inventory takes; `always`: every event."),
        json_schema_extra=_extra("notify", "fallback or always"))

    # ---- links, the UI and the CLI ----
    airflow_url: str = Field("", description=(
        "The Airflow UI's public URL, for the links in gates and notifications. Unset: Airflow's `[api] base_url`."),
        json_schema_extra=_extra("ui", "an http(s):// URL"))
    runbook_url: str = Field("", description="Where your team reads the runbook; the links point there instead of "
                             "the kvfleet page's `/runbook`.", json_schema_extra=_extra("ui", "an http(s):// URL"))
    runbook_path: str = Field("", description="The runbook's markdown the kvfleet page serves. Unset: "
                              "`docs/runbook.md` of the checkout.", json_schema_extra=_extra("ui", "a file path"))
    state_dir: str = Field("", description="Local state (embedded PostgreSQL, sandbox, demo). Unset: `./.state`.",
                           json_schema_extra=_extra("paths", "a directory path"))
    sql_dir: str = Field("", description="Alembic migrations and the named audit queries. Unset: `sql/` of the "
                         "checkout.", json_schema_extra=_extra("paths", "a directory path"))
    debug: bool = Field(False, description="The CLI prints the traceback of an unexpected error.",
                        json_schema_extra=_extra("paths", "true or false"))
    user: str = Field("", max_length=200, description=(
        "Who `kvfleet freeze` and `kvfleet stop` record as having asked (their `--by` default). Unset: the OS login "
        "name."), json_schema_extra=_extra("paths", "a user name"))

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment only (no .env file, no secrets directory): ``load_settings``' mapping, else
        ``os.environ``."""
        env = _ENV.get()
        return (init_settings, _EnvSource(settings_cls, os.environ if env is None else env))

    @field_validator("fleet_paths", mode="before")
    @classmethod
    def _split_paths(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(os.pathsep) if p.strip())
        return value

    @field_validator("notify_sns_topic_arn")
    @classmethod
    def _arn(cls, value: str) -> str:
        if value and not SNS_TOPIC_ARN.fullmatch(value):
            raise ValueError("is not an SNS topic ARN")
        return value

    @field_validator("notify_webhook_url", "airflow_url", "runbook_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _http_url(value.strip(), "an http(s):// URL with a host and a port from 1 to 65535")

    @field_validator("history_url", "history_owner_url", "history_reader_url")
    @classmethod
    def _pg_url(cls, value: str, info: Any) -> str:
        if not value or (value == "embedded" and info.field_name in ("history_url", "history_reader_url")):
            return value
        try:
            parts = urlsplit(value)
            ok = bool(PG_SCHEMES.fullmatch(parts.scheme)) and (parts.port is None or parts.port > 0)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError("is not a postgresql:// URL")
        return value

    @model_validator(mode="after")
    def _repos(self) -> Settings:
        for name in ("helm_repo_curvine", "helm_repo_kyverno"):
            value = getattr(self, name)
            problem = repo_url_problem(value, allow_http=self.helm_repo_allow_insecure, shown=masked_url(value),
                                       allowance=f"set {PREFIX}HELM_REPO_ALLOW_INSECURE=true")
            if problem:
                raise ConfigError(f"{env_name(name)}: {problem}, or unset {env_name(name)}")
        return self

    # ---- derived ----
    @property
    def allowed_fleet_paths(self) -> tuple[Path, ...]:
        """The resolved files and directories a DAG run's ``fleet`` may name (``fleet_paths``, else the directory
        of ``fleet``)."""
        return tuple(Path(p).expanduser().resolve() for p in self.fleet_paths or (str(Path(self.fleet).parent),))

    def check_fleet_path(self, fleet: str, what: str = "fleet") -> str:
        """``fleet`` (a DAG run's ``fleet`` Param) when it is one of, or inside, :attr:`allowed_fleet_paths`; else
        a ConfigError naming the value, the allowed paths and the fix. Symbolic links are resolved first."""
        allowed = self.allowed_fleet_paths
        if any(a == Path(a.anchor) for a in allowed):  # e.g. a relative KVFLEET_FLEET in a worker whose cwd is /
            raise ConfigError(f"{PREFIX}FLEET_PATHS: the allowed inventory paths ({', '.join(map(str, allowed))}) "
                              f"include the filesystem root, which allows every file; set {PREFIX}FLEET_PATHS to "
                              f"the inventories' directory, or {PREFIX}FLEET to an absolute path")
        path = Path(str(fleet)).expanduser().resolve()
        if any(path == a or path.is_relative_to(a) for a in allowed):
            return str(fleet)
        shown = ", ".join(str(a) for a in allowed)
        raise ConfigError(f"{what}: {_shown(str(fleet))} is not one of the configured inventory paths ({shown}); "
                          f"name an inventory file there, or add its file or directory to {PREFIX}FLEET_PATHS "
                          f"(paths separated by ':')")


def env_name(field: str) -> str:
    return f"{PREFIX}{field.upper()}"


def known_variables() -> dict[str, FieldInfo]:
    return {env_name(name): info for name, info in Settings.model_fields.items()}


def _shown(value: str) -> str:
    return repr(value if len(value) <= 120 else value[:117] + "...")


def _masked(value: Any, info: FieldInfo | None) -> str:
    """A value for an error message: a secret one (a URL with a password or a webhook's token) keeps its scheme,
    host and port only."""
    text = str(value)
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    return masked_url(text) if extra.get("secret") and "://" in text else _shown(text)


def masked_url(text: str) -> str:
    """A URL as a message quotes it: ``scheme://host[:port]/…`` (``kvfleet.fleet.shared_rules.redact_url``)."""
    shown = redact_url(text)
    return repr(shown) if shown else NOT_A_URL


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping (``os.environ`` unless told)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._mapping = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._mapping, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def _message(err: Mapping[str, Any], env: Mapping[str, str]) -> str:
    field = str(err["loc"][0]) if err.get("loc") else ""
    info = Settings.model_fields.get(field)
    var = env_name(field)
    raw = env.get(var, err.get("input"))
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    allowed = str(extra.get("allowed") or "a valid value")
    default = _default_text(info) if info is not None else "unset"
    why = str(err.get("msg") or "").removeprefix("Value error, ")
    return (f"{var}={_masked(raw, info)}: {why}; allowed: {allowed}. Fix: set {var} to {allowed}, or unset it "
            f"(default: {default})")


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The settings from ``env`` (default: the process environment), read now. Raises ConfigError naming every
    bad variable; logs (once per process) each ``KVFLEET_`` variable that is no setting, with the nearest name."""
    env = os.environ if env is None else env
    warn_unknown(env)
    token = _ENV.set(env)
    try:
        # Every field has a default; mypy without pydantic's plugin takes them for required arguments.
        return Settings()  # type: ignore[call-arg]
    except ValidationError as exc:
        problems = [_message(e, env) for e in exc.errors(include_url=False)]
        raise ConfigError("; ".join(problems)) from None
    finally:
        _ENV.reset(token)


def unknown_variables(env: Mapping[str, str]) -> dict[str, str | None]:
    """Each ``KVFLEET_`` variable of ``env`` that is no setting (nor the twin's, nor the tooling's), with the
    nearest known name (difflib) or None."""
    known = known_variables()
    out: dict[str, str | None] = {}
    for name in env:
        if name.startswith(PREFIX) and name not in known and name not in NOT_SETTINGS \
                and not name.startswith(TWIN_PREFIX):
            out[name] = next(iter(difflib.get_close_matches(name, known, n=1, cutoff=0.6)), None)
    return out


def warn_unknown(env: Mapping[str, str]) -> None:
    for name, nearest in sorted(unknown_variables(env).items()):
        if name in _warned:
            continue
        _warned.add(name)
        hint = f"; did you mean {nearest}?" if nearest else ""
        log.warning("kvfleet: %s is not a kvfleet setting and is ignored%s (docs/settings.md lists them)", name,
                    hint)


# ---- the generated table (docs/settings.md) -------------------------------------------------------------------

BEGIN, END = "<!-- BEGIN GENERATED: kvfleet.settings -->", "<!-- END GENERATED: kvfleet.settings -->"
GROUPS = {"inventory": "The inventory", "waits": "Waits", "charts": "Charts", "history": "The history database",
          "notify": "Notifications", "ui": "Links and the kvfleet page", "paths": "Files and the CLI"}


def _default_text(info: FieldInfo) -> str:
    default = info.default
    if default in ("", ()):
        return "unset"
    if isinstance(default, bool):
        return "`true`" if default else "`false`"
    if isinstance(default, float):
        return f"`{default:g}`"
    return f"`{default}`"


def table() -> str:
    """The markdown between the markers of docs/settings.md: one table per group, in the model's order."""
    out: list[str] = []
    fields = list(Settings.model_fields.items())
    for group, title in GROUPS.items():
        rows = [(n, i) for n, i in fields if isinstance(i.json_schema_extra, dict)
                and i.json_schema_extra.get("group") == group]
        if not rows:
            continue
        out += [f"### {title}", "", "| variable | allowed | default | what it does |", "| --- | --- | --- | --- |"]
        for name, info in rows:
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            desc = str(info.description or "").replace("|", "\\|")
            out.append(f"| `{env_name(name)}` | {extra.get('allowed')} | {_default_text(info)} | {desc} |")
        out.append("")
    out += ["### Not settings", "",
            "Read by the project's tooling, never by kvfleet (no warning): "
            + ", ".join(f"`{n}`" for n in sorted(NOT_SETTINGS)) + f". `{TWIN_PREFIX}*` belongs to the digital twin.",
            ""]
    return "\n".join(out)


def render_doc(text: str) -> str:
    """``text`` (docs/settings.md) with the generated part replaced; ValueError without the markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN} and {END} are missing")
    return text[:start + len(BEGIN)] + "\n" + table() + text[end:]


def main(argv: list[str]) -> int:
    """``python -m kvfleet.settings --write docs/settings.md`` rewrites the table; ``--check`` exits 1 when stale."""
    if len(argv) != 2 or argv[0] not in ("--write", "--check"):
        print("usage: python -m kvfleet.settings --write|--check docs/settings.md", file=sys.stderr)
        return 2
    path = Path(argv[1])
    text = path.read_text()
    new = render_doc(text)
    if argv[0] == "--check":
        if new != text:
            print(f"{path} is out of date: run python -m kvfleet.settings --write {path}", file=sys.stderr)
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
