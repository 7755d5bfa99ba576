"""The frozen values the rest of kvfleet reads, and reading the inventory file.

Called from the CLI (`kvfleet validate|plan`), from every DAG's first task and from the drift watch. This module
reads the file (``read_inventory_text``: a regular file of at most ``MAX_INVENTORY_BYTES``), has the model validate
it (:mod:`.loader`) and turns the validated model into the frozen values kvfleet uses (``Inventory``, ``Cluster``,
``Endpoint``, ``Lob``, ``CurvineSpec``): defaults resolved (the L2 injection ``auto``, the Curvine worker count from
the GPU nodes, a model's size from the catalogue).

Validation collects *every* problem before it raises, because a platform team fixing a 12-endpoint file one
error per run would rightly give up. Each message names the file, the path inside it, the value, what is
allowed and the fix, e.g. ``fleet.yaml: clusters.ml-prod-1.tiered_storage.memory_percent: 15 is below 20
(HyperPod accepts 20–100); set it to 20 or more``.
"""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from kvfleet.errors import InventoryError
from kvfleet.fleet import constants as C
from kvfleet.fleet import models
from kvfleet.fleet.inventory.derived import gpu_budget, model_size, replica_fit, resolve_l2_injection
from kvfleet.fleet.inventory.loader import validate_text
from kvfleet.fleet.inventory.messages import FleetProblems
from kvfleet.fleet.inventory.schema import ClusterIn, EndpointIn, FleetFile
from kvfleet.fleet.inventory.vocabulary import MAX_INVENTORY_BYTES, SIZE, size_to_bytes


class InventoryWarning(UserWarning):
    """A legal but useless setting (for example L2 on a one-node cluster)."""


# The account a cluster is in when the inventory declares none: the base identity's own (the Airflow connection
# `aws_default`, or the environment's credential chain). Its key segment is this literal; history rows written
# before accounts existed carry it too.
DEFAULT_ACCOUNT_KEY: Final = "default"


@dataclass(frozen=True)
class Account:
    """An AWS account kvfleet reaches clusters in (top-level `accounts`), or the base identity's own."""

    name: str = DEFAULT_ACCOUNT_KEY  # the inventory's name for it; clusters and LOBs refer to it by this
    id: str | None = None  # 12 digits; None: the base identity's own account (checked at run time)
    role_arn: str | None = None  # assumed from the base identity; None: the base identity acts itself
    external_id: str | None = None
    aws_conn_id: str | None = None  # an Airflow connection that replaces the base identity for this account
    session_duration_s: int = 3600

    @property
    def key(self) -> str:
        """The account segment of a cluster key: the 12-digit id, or ``default`` for the base identity's own."""
        return self.id or DEFAULT_ACCOUNT_KEY


DEFAULT_ACCOUNT: Final = Account()


@dataclass(frozen=True)
class Lob:
    name: str
    description: str = ""
    remediate_drift: bool = False
    # Where this LOB's notifications also go (kvfleet.airflow.notify): both optional.
    notify_sns_topic_arn: str | None = None
    notify_webhook_url: str | None = None


@dataclass(frozen=True)
class CurvineSpec:
    chart: str = "curvine"
    csi_chart: str = "curvine-csi"
    repo_url: str = "https://curvineio.github.io/helm-charts"
    version: str = C.CURVINE_CHART_VERSION
    namespace: str = C.CURVINE_NAMESPACE
    master_replicas: int = 1
    master_storage_class: str = "ebs-sc"
    master_meta_size: str = "10Gi"
    master_journal_size: str = "50Gi"
    # The inventory sets it: `worker.replicas`, or the cluster's GPU node count
    # (docs/reference/curvine.md#worker-placement).
    worker_replicas: int = 2
    worker_replicas_declared: bool = False  # True when `worker.replicas` is written (an override)
    worker_host_path: str = "/opt/dlami/nvme/curvine-data"
    worker_size: str = "100Gi"
    storage_class: str = C.CURVINE_STORAGE_CLASS
    fs_path: str = "/l2cache"
    scale_out: str = "report"  # "report": the scheduled path only reports; "auto": it may scale out
    allow_insecure_repo: bool = False  # an http:// repo_url is refused unless this is true

    @property
    def worker_size_bytes(self) -> int:
        return size_to_bytes(self.worker_size)

    @property
    def capacity_text(self) -> str:
        """The L2 capacity as the sources state it: the size per worker × N workers."""
        m = SIZE.fullmatch(self.worker_size)
        total = f" = {int(m.group(1)) * self.worker_replicas}{m.group(2)}" if m else ""
        return f"{self.worker_size} × {self.worker_replicas}{total}"


@dataclass(frozen=True)
class AddonSpec:
    name: str
    version: str | None = None
    configuration: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Cluster:
    name: str
    region: str
    gpu_node_count: int
    gpu_instance_type: str
    tiered_storage_mode: str = "Enable"
    memory_percent: int = C.MEMORY_PERCENT_DEFAULT
    # The NodeRecovery the inventory declares (SageMaker ClusterNodeRecovery: Automatic | None), or None when it
    # declares none: stage 1 then sends the live value back unchanged (the service refuses tiered storage without
    # NodeRecovery) and drift does not judge it. A declared value is reconciled in stage 1
    # (docs/reference/hyperpod.md#noderecovery-rule).
    node_recovery: str | None = None
    l2_injection: str = "patch"  # what the cluster runs: patch | kyverno (`auto` resolved, see l2_injection_reason)
    l2_injection_asked: str = "auto"  # what the inventory says: auto | patch | kyverno
    l2_injection_reason: str = ""
    update_strategy: str = "auto"  # the default of its endpoints (an endpoint's own value wins)
    production: bool = False
    ebs_storage_class: str = "ebs-sc"
    curvine: CurvineSpec = field(default_factory=CurvineSpec)
    addons: tuple[AddonSpec, ...] = ()
    account: Account = DEFAULT_ACCOUNT

    @property
    def key(self) -> str:
        """The cluster's identity across the fleet: ``account/region/name`` (a HyperPod name is unique only within
        one account and region)."""
        return f"{self.account.key}/{self.region}/{self.name}"

    @property
    def node_recovery_declared(self) -> bool:
        return self.node_recovery is not None

    def addon(self, name: str) -> AddonSpec:
        for spec in self.addons:
            if spec.name == name:
                return spec
        return AddonSpec(name=name)


@dataclass(frozen=True)
class Endpoint:
    name: str
    namespace: str
    lob: str
    cluster: str
    model: str
    instance_type: str
    replicas: int = 2
    routing: str = "prefixaware"
    l1: bool = True
    l2: bool = True
    image: str = "lmcache/vllm-openai:v0.3.9"
    model_id: str = "Qwen/Qwen2-7B-Instruct"
    extra_env: Mapping[str, str] = field(default_factory=dict)
    update_strategy: str | None = None  # None: the cluster's
    # rag | long-document | multi-turn | system-prompt | batch (docs/reference/hyperpod.md#intelligent-routing)
    workload: str | None = None
    # The served model's size: explicit `model_params_b` + `dtype`, else the catalogue row of `model`
    # (or of `model_id`); None when neither says (then nothing is checked).
    model_params_b: float | None = None
    dtype: str | None = None
    catalogue_model: str | None = None  # the catalogue key the size came from, if any

    @property
    def key(self) -> str:
        """Unique within a cluster: namespace/name."""
        return f"{self.namespace}/{self.name}"

    @property
    def ref(self) -> str:
        """Unique within the fleet: cluster:namespace/name."""
        return f"{self.cluster}:{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Settings:
    wave_size: int = 3
    chunk_size: int = C.CHUNK_SIZE
    l2_url: str = C.L2_URL
    serde: str = C.L2_SERDE
    hash_seed: str = C.PYTHONHASHSEED
    lmcache_log_format: str = "0.3.9"
    operator_pause_threshold_minutes: int = 30


@dataclass(frozen=True)
class Inventory:
    source: str
    settings: Settings
    lobs: tuple[Lob, ...]
    clusters: tuple[Cluster, ...]
    endpoints: tuple[Endpoint, ...]
    warnings: tuple[str, ...] = ()
    # USD per instance-hour by SageMaker instance type (top-level `prices`, optional): what economics reports use.
    prices: Mapping[str, float] = field(default_factory=dict)

    def cluster(self, name: str) -> Cluster:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)

    def lob(self, name: str) -> Lob:
        for lob in self.lobs:
            if lob.name == name:
                return lob
        raise KeyError(name)

    def endpoints_of(self, cluster: str) -> tuple[Endpoint, ...]:
        return tuple(e for e in self.endpoints if e.cluster == cluster)

    def update_strategy(self, ep: Endpoint) -> tuple[str, str]:
        """(the strategy asked for an endpoint, where it is set): its own value wins over its cluster's."""
        if ep.update_strategy is not None:
            return ep.update_strategy, "endpoint"
        try:
            return self.cluster(ep.cluster).update_strategy, "cluster"
        except KeyError:
            return "auto", "default"

    def select(
        self,
        *,
        lobs: list[str] | None = None,
        clusters: list[str] | None = None,
        endpoints: list[str] | None = None,
    ) -> Inventory:
        """The same inventory narrowed to a scope. Unknown names are a PermanentError naming them."""
        problems = []
        for kind, wanted, known in (
            ("lob", lobs, {x.name for x in self.lobs}),
            ("cluster", clusters, {x.name for x in self.clusters}),
            ("endpoint", endpoints, {e.name for e in self.endpoints} | {e.ref for e in self.endpoints}),
        ):
            for name in wanted or []:
                if name not in known:
                    problems.append(
                        f"{self.source}: unknown {kind} {name!r}; known: {', '.join(sorted(known)) or 'none'}"
                    )
        if problems:
            raise InventoryError(problems)
        eps = tuple(
            e
            for e in self.endpoints
            if (not lobs or e.lob in lobs)
            and (not clusters or e.cluster in clusters)
            and (not endpoints or e.name in endpoints or e.ref in endpoints)
        )
        used = {e.cluster for e in eps}
        cls = tuple(
            c for c in self.clusters if (not clusters or c.name in clusters) and (not lobs or c.name in used)
        )
        return Inventory(self.source, self.settings, self.lobs, cls, eps, self.warnings, self.prices)




def gpu_demand(cluster: Cluster, endpoints: list[Endpoint] | tuple[Endpoint, ...]) -> tuple[int, int]:
    """(GPUs the cluster's endpoints need, GPUs its declared nodes have), headroom of its L2 mode included."""
    return gpu_budget(cluster.gpu_instance_type, cluster.gpu_node_count, cluster.l2_injection,
                      [e.replicas for e in endpoints if e.cluster == cluster.name])


def model_fit(ep: Endpoint) -> models.Fit | None:
    """The endpoint's model against the GPU memory of one replica, or None when either is unknown."""
    return replica_fit(ep.instance_type, ep.model_params_b, ep.dtype)


def _cluster(c: ClusterIn) -> Cluster:
    mode, reason = resolve_l2_injection(c.l2_injection, c.production)
    cv, nodes = c.curvine, c.gpu_nodes.count
    return Cluster(
        name=c.name, region=c.region, gpu_node_count=nodes, gpu_instance_type=c.gpu_nodes.instance_type,
        tiered_storage_mode=c.tiered_storage.mode, memory_percent=c.tiered_storage.memory_percent,
        node_recovery=c.node_recovery, l2_injection=mode, l2_injection_asked=c.l2_injection,
        l2_injection_reason=reason, update_strategy=c.update_strategy or "auto", production=c.production,
        ebs_storage_class=c.ebs_storage_class,
        curvine=CurvineSpec(
            chart=cv.chart, csi_chart=cv.csi_chart, repo_url=cv.repo_url, version=cv.version, namespace=cv.namespace,
            master_replicas=cv.master.replicas, master_storage_class=cv.master.storage_class,
            master_meta_size=cv.master.meta_size, master_journal_size=cv.master.journal_size,
            worker_replicas=cv.worker.replicas if cv.worker.replicas is not None else max(1, nodes),
            worker_replicas_declared=cv.worker.replicas is not None, worker_host_path=cv.worker.host_path,
            worker_size=cv.worker.size, storage_class=cv.storage_class, fs_path=cv.fs_path, scale_out=cv.scale_out,
            allow_insecure_repo=cv.allow_insecure_repo),
        addons=tuple(AddonSpec(a.name, a.version or None, a.configuration) for a in c.addons),
    )


def _endpoint(e: EndpointIn) -> Endpoint:
    size = model_size(e)
    return Endpoint(
        name=e.name, namespace=e.namespace, lob=e.lob, cluster=e.cluster, model=e.model,
        instance_type=e.instance_type, replicas=e.replicas, routing=e.routing, l1=e.l1, l2=e.l2, image=e.image,
        model_id=e.model_id, extra_env=dict(e.env), update_strategy=e.update_strategy, workload=e.workload,
        model_params_b=size.params_b, dtype=size.dtype, catalogue_model=size.catalogue_model,
    )


def inventory_from(fleet: FleetFile, source: str, notes: tuple[str, ...] = ()) -> Inventory:
    """The frozen value types of a validated model."""
    s = fleet.settings
    return Inventory(
        source=source,
        settings=Settings(wave_size=s.wave_size, chunk_size=s.chunk_size, l2_url=s.l2_url, serde=s.serde,
                          hash_seed=s.hash_seed, lmcache_log_format=s.lmcache_log_format,
                          operator_pause_threshold_minutes=s.operator_pause_threshold_minutes),
        lobs=tuple(Lob(x.name, x.description, x.remediate_drift, notify_sns_topic_arn=x.notify.sns_topic_arn or None,
                       notify_webhook_url=x.notify.webhook_url or None) for x in fleet.lobs),
        clusters=tuple(_cluster(c) for c in fleet.clusters),
        endpoints=tuple(_endpoint(e) for e in fleet.endpoints),
        warnings=notes,
        prices=dict(fleet.prices),
    )


def parse_inventory(text: str, source: str = "fleet.yaml") -> Inventory:
    """Parse and validate an inventory text. Raises ``InventoryError`` listing every problem."""
    try:
        checked = validate_text(text, source)
    except FleetProblems as exc:
        raise InventoryError(exc.problems) from None
    for w in checked.warnings:
        warnings.warn(w, InventoryWarning, stacklevel=2)
    return inventory_from(checked.fleet, source, checked.warnings)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def read_inventory_text(path: str | Path) -> str:
    """The inventory's text: a regular file of at most ``MAX_INVENTORY_BYTES``, UTF-8. ``InventoryError`` else.

    The type is checked before the file is opened (``open`` would block on a FIFO and ``read`` never ends on
    /dev/zero), and the read itself stops one byte past the limit (the file may grow between stat and read).
    """
    p = Path(path)
    shown = _cut(str(p), 200)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise InventoryError([f"{shown}: cannot read the inventory: {exc.strerror}"]) from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise InventoryError([f"{shown}: is {kind}, not a regular file; --fleet takes a YAML file"])
    if st.st_size > MAX_INVENTORY_BYTES:
        raise InventoryError([f"{shown}: the inventory is {st.st_size} bytes, more than the "
                              f"{MAX_INVENTORY_BYTES} ({MAX_INVENTORY_BYTES // 1024 // 1024} MiB) allowed; "
                              "split the fleet into several files"])
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # swapped between stat and open
                raise InventoryError([f"{shown}: is not a regular file; --fleet takes a YAML file"])
            data = fh.read(MAX_INVENTORY_BYTES + 1)
    except OSError as exc:
        raise InventoryError([f"{shown}: cannot read the inventory: {exc.strerror}"]) from None
    if len(data) > MAX_INVENTORY_BYTES:
        raise InventoryError([f"{shown}: the inventory is more than {MAX_INVENTORY_BYTES} bytes; split it"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError([f"{shown}: is not UTF-8 text (byte {exc.start}); save it as UTF-8"]) from None


def load_inventory(path: str | Path) -> Inventory:
    p = Path(path)
    return parse_inventory(read_inventory_text(p), source=_cut(p.name, 200))
