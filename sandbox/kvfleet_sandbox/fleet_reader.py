"""The sandbox's own reader of a fleet YAML: only what the twin needs to build the fleet a platform team already has.

Called by :func:`kvfleet_sandbox.runtime.start_sandbox` (given a path) and by ``kvfleet sandbox up`` (to refuse a
file it cannot read before starting the detached child). The sandbox imports nothing of the product but
``kvfleet.fleet.constants`` (ARCHITECTURE.md, "Layout and the direction of imports"), so it does not use
``kvfleet.fleet.inventory``: validating an inventory is kvfleet's job (``kvfleet validate``); this reader takes the
same file format and reads

- per cluster: ``name``, ``region``, ``gpu_nodes`` (``count``, ``instance_type``), ``node_recovery``,
  ``l2_injection`` (``auto`` resolved with ``production`` as kvfleet does), ``ebs_storage_class``,
  ``tiered_storage.memory_percent`` (HyperPod's range, which the emulated
  service enforces), ``curvine.namespace`` and ``curvine.master.storage_class``, and the add-ons' ``configuration``
  (the operator's execution role and TLS bucket, which :mod:`kvfleet_sandbox.aws_prereqs` creates);
- per endpoint: ``name``, ``namespace`` and ``cluster`` (the namespaces the RBAC bootstrap binds).

Keys it does not need are left to kvfleet's validator. Anything it needs but cannot read is refused with
:class:`FleetReadError`, one line per problem naming the file, the field path, the value and the fix.

A product ``Inventory`` object (from ``kvfleet.fleet.inventory``) satisfies :class:`FleetLike` as it is, so tests
that already hold one pass it to ``start_sandbox`` directly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from kvfleet.fleet.constants import (
    CURVINE_NAMESPACE,
    MEMORY_PERCENT_MAX,
    MEMORY_PERCENT_MIN,
    NODE_RECOVERY_DEFAULT,
    NODE_RECOVERY_VALUES,
)

MAX_FLEET_BYTES = 4 * 1024 * 1024
L2_MODES = ("patch", "kyverno")
# kvfleet's inventory also takes `auto` (its default): kyverno on a `production: true` cluster, patch elsewhere.
L2_CHOICES = ("auto", *L2_MODES)
# HyperPod cluster names (SageMaker API: ClusterName pattern) and AWS regions.
_CLUSTER_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class FleetReadError(ValueError):
    """A fleet file the sandbox cannot read; ``problems`` holds one message per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# ---- what the sandbox reads (its own types, and the shape a product Inventory also has) -----------------------


class AddonLike(Protocol):
    @property
    def configuration(self) -> Mapping[str, Any] | None: ...


class CurvineLike(Protocol):
    @property
    def namespace(self) -> str: ...
    @property
    def master_storage_class(self) -> str: ...


class ClusterLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def gpu_node_count(self) -> int: ...
    @property
    def gpu_instance_type(self) -> str: ...
    @property
    def node_recovery(self) -> str: ...
    @property
    def l2_injection(self) -> str: ...
    @property
    def ebs_storage_class(self) -> str: ...
    @property
    def curvine(self) -> CurvineLike: ...
    def addon(self, name: str) -> AddonLike: ...


class EndpointLike(Protocol):
    @property
    def namespace(self) -> str: ...


class FleetLike(Protocol):
    @property
    def clusters(self) -> Sequence[ClusterLike]: ...
    @property
    def endpoints(self) -> Sequence[EndpointLike]: ...


@dataclass(frozen=True)
class FleetAddon:
    name: str
    configuration: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class FleetCurvine:
    namespace: str = CURVINE_NAMESPACE
    master_storage_class: str = "ebs-sc"


@dataclass(frozen=True)
class FleetCluster:
    name: str
    region: str
    gpu_node_count: int
    gpu_instance_type: str
    node_recovery: str = NODE_RECOVERY_DEFAULT
    l2_injection: str = "patch"
    ebs_storage_class: str = "ebs-sc"
    curvine: FleetCurvine = field(default_factory=FleetCurvine)
    addons: tuple[FleetAddon, ...] = ()

    def addon(self, name: str) -> FleetAddon:
        return next((a for a in self.addons if a.name == name), FleetAddon(name))


@dataclass(frozen=True)
class FleetEndpoint:
    name: str
    namespace: str
    cluster: str


@dataclass(frozen=True)
class Fleet:
    source: str
    clusters: tuple[FleetCluster, ...]
    endpoints: tuple[FleetEndpoint, ...]


# ---- reading --------------------------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def problem(self, path: str, msg: str) -> None:
        self.problems.append(f"{self.source}: {path}: {msg}")

    def mapping(self, raw: Any, path: str) -> dict[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.problem(path, f"expected a mapping, got {type(raw).__name__} {_shown(raw)}")
            return {}
        return raw

    def text(self, raw: dict[str, Any], key: str, path: str, default: str | None = None,
             pattern: re.Pattern[str] | None = None, example: str = "") -> str:
        value = raw.get(key, default)
        if value is None:
            self.problem(f"{path}.{key}", f"is required; add it{f' (e.g. {example})' if example else ''}")
            return ""
        if not isinstance(value, str) or not value:
            self.problem(f"{path}.{key}", f"{_shown(value)} is not a non-empty string; write a string"
                         f"{f' such as {example}' if example else ''}")
            return ""
        if pattern is not None and not pattern.fullmatch(value):
            self.problem(f"{path}.{key}", f"{_shown(value)} is not valid here; use e.g. {example}")
            return ""
        return value

    def integer(self, raw: dict[str, Any], key: str, path: str, default: int | None, lo: int, hi: int,
                why: str = "") -> int:
        value = raw.get(key, default)
        if value is None:
            self.problem(f"{path}.{key}", f"is required; add a whole number in {lo}–{hi}")
            return lo
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(f"{path}.{key}", f"{_shown(value)} is not an integer; use a whole number in {lo}–{hi}")
            return lo
        if value < lo:
            self.problem(f"{path}.{key}", f"{value} is below {lo}{why}; set it to {lo} or more")
            return lo
        if value > hi:
            self.problem(f"{path}.{key}", f"{value} is above {hi}{why}; set it to {hi} or less")
            return hi
        return value

    def choice(self, raw: dict[str, Any], key: str, path: str, default: str, allowed: Sequence[str]) -> str:
        value = raw.get(key, default)
        if value not in allowed:
            self.problem(f"{path}.{key}", f"{_shown(value)} is not one of {', '.join(sorted(allowed))}")
            return default
        return str(value)

    def items(self, raw: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
        """A list of mappings with ``name``, or a mapping keyed by name (the inventory's two spellings)."""
        if raw is None:
            return []
        if isinstance(raw, dict):
            return [(str(k), {**self.mapping(v, f"{path}.{k}"), "name": k}) for k, v in raw.items()]
        if not isinstance(raw, list):
            self.problem(path, f"expected a list or mapping, got {type(raw).__name__} {_shown(raw)}")
            return []
        out = []
        for i, body in enumerate(raw):
            body = self.mapping(body, f"{path}[{i}]")
            name = body.get("name")
            if not isinstance(name, str) or not name:
                self.problem(f"{path}[{i}].name", f"{_shown(name)} is not a name; give each item a string name")
                continue
            out.append((name, body))
        return out


def _addons(r: _Reader, raw: Any, path: str) -> tuple[FleetAddon, ...]:
    out = []
    for name, body in r.items(raw, path):
        conf = body.get("configuration")
        if conf is not None and not isinstance(conf, dict):
            r.problem(f"{path}.{name}.configuration", f"{_shown(conf)} must be a mapping")
            conf = None
        out.append(FleetAddon(name, conf))
    return tuple(out)


def _l2_mode(asked: str, production: Any) -> str:
    """The injection mode the cluster runs, resolved as kvfleet's inventory resolves `auto`."""
    if asked != "auto":
        return asked
    return "kyverno" if production is True else "patch"


def _cluster(r: _Reader, name: str, raw: dict[str, Any]) -> FleetCluster:
    path = f"clusters.{name}"
    if not _CLUSTER_NAME.fullmatch(name):
        r.problem(f"{path}.name", f"{_shown(name)} is not a HyperPod cluster name (letters, digits and '-', "
                  "at most 63); use e.g. ml-prod-use1")
    gpu = r.mapping(raw.get("gpu_nodes"), f"{path}.gpu_nodes")
    if not gpu:
        r.problem(f"{path}.gpu_nodes", "is required: declare {count: N, instance_type: ml.…}")
    tiered = r.mapping(raw.get("tiered_storage"), f"{path}.tiered_storage")
    r.integer(tiered, "memory_percent", f"{path}.tiered_storage", MEMORY_PERCENT_MIN, MEMORY_PERCENT_MIN,
              MEMORY_PERCENT_MAX, f" (HyperPod accepts {MEMORY_PERCENT_MIN}–{MEMORY_PERCENT_MAX})")
    curvine = r.mapping(raw.get("curvine"), f"{path}.curvine")
    master = r.mapping(curvine.get("master"), f"{path}.curvine.master")
    defaults = FleetCurvine()
    return FleetCluster(
        name=name,
        region=r.text(raw, "region", path, pattern=_REGION, example="us-east-1"),
        gpu_node_count=r.integer(gpu, "count", f"{path}.gpu_nodes", None, 1, 10000),
        gpu_instance_type=r.text(gpu, "instance_type", f"{path}.gpu_nodes", "ml.g6e.4xlarge",
                                 pattern=re.compile(r"^ml\.[a-z0-9]+\.[a-z0-9]+$"), example="ml.g6e.4xlarge"),
        node_recovery=r.choice(raw, "node_recovery", path, NODE_RECOVERY_DEFAULT, sorted(NODE_RECOVERY_VALUES)),
        l2_injection=_l2_mode(r.choice(raw, "l2_injection", path, "auto", L2_CHOICES), raw.get("production")),
        ebs_storage_class=r.text(raw, "ebs_storage_class", path, "ebs-sc", example="ebs-sc"),
        curvine=FleetCurvine(
            namespace=r.text(curvine, "namespace", f"{path}.curvine", defaults.namespace, pattern=_DNS_LABEL,
                             example=CURVINE_NAMESPACE),
            master_storage_class=r.text(master, "storage_class", f"{path}.curvine.master",
                                        defaults.master_storage_class, example="ebs-sc"),
        ),
        addons=_addons(r, raw.get("addons"), f"{path}.addons"),
    )


def parse_fleet(text: str, source: str = "fleet.yaml") -> Fleet:
    """Read a fleet YAML text; :class:`FleetReadError` lists every problem found."""
    r = _Reader(source)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FleetReadError([f"{source}: not valid YAML: {str(exc)[:400]}"]) from None
    raw = r.mapping(raw, "(top level)")
    clusters = [_cluster(r, name, body) for name, body in r.items(raw.get("clusters"), "clusters")]
    if not clusters and not r.problems:
        r.problem("clusters", "no cluster declared; declare at least one")
    seen = [c.name for c in clusters]
    for name in sorted({n for n in seen if seen.count(n) > 1}):
        r.problem(f"clusters.{name}", "is declared twice; give each cluster one entry")
    endpoints = []
    for i, (name, body) in enumerate(r.items(raw.get("endpoints"), "endpoints")):
        path = f"endpoints[{i}]({name})"
        cluster = r.text(body, "cluster", path, example=seen[0] if seen else "ml-prod-use1")
        if cluster and cluster not in seen:
            r.problem(f"{path}.cluster", f"{_shown(cluster)} is not a declared cluster; use one of "
                      f"{', '.join(seen) or '(none)'}")
        endpoints.append(FleetEndpoint(name, r.text(body, "namespace", path, pattern=_DNS_LABEL, example="retail"),
                                       cluster))
    if r.problems:
        raise FleetReadError(r.problems)
    return Fleet(source, tuple(clusters), tuple(endpoints))


def read_fleet(path: str | Path) -> Fleet:
    """Read a fleet file (a regular file of at most 4 MiB, UTF-8); :class:`FleetReadError` otherwise."""
    p = Path(path)
    try:
        if not p.is_file():
            raise FleetReadError([f"{p}: not a regular file; --fleet takes the fleet's YAML file"])
        if p.stat().st_size > MAX_FLEET_BYTES:
            raise FleetReadError([f"{p}: more than {MAX_FLEET_BYTES} bytes; split the fleet into several files"])
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetReadError([f"{p}: cannot read the fleet file: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise FleetReadError([f"{p}: is not UTF-8 text (byte {exc.start}); save it as UTF-8"]) from None
    return parse_fleet(text, source=p.name)
