"""The sandbox's reader of a fleet YAML: the fleet a platform team already has, read through kvfleet's own model.

Called by :func:`kvfleet_sandbox.runtime.start_sandbox` (given a path) and by ``kvfleet sandbox up`` (to refuse a
file it cannot read before starting the detached child). The file is validated by the inventory model
(``kvfleet.fleet.inventory``: the same keys, both spellings of ``clusters:``/``endpoints:``, the same checks
and messages as ``kvfleet validate``), the only part of the product the sandbox imports besides
``kvfleet.fleet.constants``. From the validated model the twin keeps

- per cluster: ``name``, ``region``, ``gpu_nodes`` (``count``, ``instance_type``), ``node_recovery`` (the emulated
  service's default when the inventory declares none), ``l2_injection`` (``auto`` resolved with ``production`` as
  kvfleet does), ``ebs_storage_class``, ``curvine.namespace`` and ``curvine.master.storage_class``, and the add-ons'
  ``configuration`` (the operator's execution role and TLS bucket, which :mod:`kvfleet_sandbox.aws_prereqs`
  creates);
- per endpoint: ``name``, ``namespace`` and ``cluster`` (the namespaces the RBAC bootstrap binds).

A file the model refuses is :class:`FleetReadError`, one line per problem naming the file, the field path, the
value and the fix. A product ``Inventory`` object (from ``kvfleet.fleet.inventory``) satisfies :class:`FleetLike`
as it is, so tests that already hold one pass it to ``start_sandbox`` directly.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kvfleet.fleet.constants import CURVINE_NAMESPACE, NODE_RECOVERY_DEFAULT
from kvfleet.fleet.inventory.derived import resolve_l2_injection
from kvfleet.fleet.inventory.loader import validate_text
from kvfleet.fleet.inventory.messages import FleetProblems
from kvfleet.fleet.inventory.schema import ClusterIn
from kvfleet.fleet.inventory.vocabulary import MAX_INVENTORY_BYTES

MAX_FLEET_BYTES = MAX_INVENTORY_BYTES


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


def _cluster(c: ClusterIn) -> FleetCluster:
    mode, _ = resolve_l2_injection(c.l2_injection, c.production)
    return FleetCluster(
        name=c.name, region=c.region, gpu_node_count=c.gpu_nodes.count, gpu_instance_type=c.gpu_nodes.instance_type,
        node_recovery=c.node_recovery or NODE_RECOVERY_DEFAULT, l2_injection=mode,
        ebs_storage_class=c.ebs_storage_class,
        curvine=FleetCurvine(namespace=c.curvine.namespace, master_storage_class=c.curvine.master.storage_class),
        addons=tuple(FleetAddon(a.name, a.configuration) for a in c.addons),
    )


def parse_fleet(text: str, source: str = "fleet.yaml") -> Fleet:
    """Read a fleet YAML text; :class:`FleetReadError` lists every problem found."""
    try:
        fleet = validate_text(text, source).fleet
    except FleetProblems as exc:
        raise FleetReadError(exc.problems) from None
    return Fleet(source, tuple(_cluster(c) for c in fleet.clusters),
                 tuple(FleetEndpoint(e.name, e.namespace, e.cluster) for e in fleet.endpoints))


def read_fleet(path: str | Path) -> Fleet:
    """Read a fleet file (a regular file of at most 4 MiB, UTF-8); :class:`FleetReadError` otherwise."""
    p = Path(path)
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise FleetReadError([f"{p}: not a regular file; --fleet takes the fleet's YAML file"])
        if st.st_size > MAX_FLEET_BYTES:
            raise FleetReadError([f"{p}: more than {MAX_FLEET_BYTES} bytes; split the fleet into several files"])
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetReadError([f"{p}: cannot read the fleet file: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise FleetReadError([f"{p}: is not UTF-8 text (byte {exc.start}); save it as UTF-8"]) from None
    return parse_fleet(text, source=p.name)
