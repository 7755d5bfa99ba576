"""The fleet inventory: what platform teams declare, parsed into frozen models and validated in full.

Called from the CLI (`kvfleet validate|plan`), from every DAG's first task, and from the sandbox (which builds
the twin of the declared fleet). Pure: it reads a YAML text that the caller loaded, and never touches I/O
beyond ``load_inventory``'s one file read.

Validation collects *every* problem before it raises, because a platform team fixing a 12-endpoint file one
error per run would rightly give up. Each message names the file, the path inside it, the value, what is
allowed and the fix, e.g. ``fleet.yaml: clusters.ml-prod-1.tiered_storage.memory_percent: 15 is below 20
(HyperPod accepts 20–100); set it to 20 or more``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvfleet.errors import InventoryError
from kvfleet.fleet import constants as C

# Kubernetes DNS-1123 label (namespaces, Deployment names that must also be Service names) and the
# CRD's modelName pattern (maxLength 63, ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}).
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MODEL_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
HYPERPOD_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
SIZE = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti)$")
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
L2_MODES = ("patch", "kyverno")
LMCACHE_LOG_FORMATS = ("0.3.9", "0.5.6")


class InventoryWarning(UserWarning):
    """A legal but useless setting (for example L2 on a one-node cluster)."""


@dataclass(frozen=True)
class Lob:
    name: str
    description: str = ""
    remediate_drift: bool = False


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
    worker_replicas: int = 2
    worker_host_path: str = "/opt/dlami/nvme/curvine-data"
    worker_size: str = "100Gi"
    storage_class: str = C.CURVINE_STORAGE_CLASS
    fs_path: str = "/l2cache"
    scale_out: str = "report"  # "report": the scheduled path only reports; "auto": it may scale out

    @property
    def worker_size_bytes(self) -> int:
        return size_to_bytes(self.worker_size)


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
    node_recovery: str = C.NODE_RECOVERY_DEFAULT
    l2_injection: str = "patch"
    production: bool = False
    ebs_storage_class: str = "ebs-sc"
    curvine: CurvineSpec = field(default_factory=CurvineSpec)
    addons: tuple[AddonSpec, ...] = ()

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
        return Inventory(self.source, self.settings, self.lobs, cls, eps, self.warnings)


def size_to_bytes(size: str) -> int:
    m = SIZE.match(size)
    if not m:
        raise ValueError(f"not a Kubernetes binary size: {size!r}")
    power = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4}[m.group(2)]
    return int(m.group(1)) * int(1024**power)


# ---------------------------------------------------------------------------------------------------------
# Parsing with problem collection
# ---------------------------------------------------------------------------------------------------------


class _Reader:
    """Reads typed fields out of raw YAML mappings, recording a problem instead of raising."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []
        self.warnings: list[str] = []

    def problem(self, path: str, msg: str) -> None:
        self.problems.append(f"{self.source}: {path}: {msg}")

    def mapping(self, raw: Any, path: str) -> dict[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.problem(path, f"expected a mapping, got {type(raw).__name__} {raw!r}")
            return {}
        return raw

    def unknown_keys(self, raw: dict[str, Any], allowed: set[str], path: str) -> None:
        for key in sorted(set(raw) - allowed):
            self.problem(
                f"{path}.{key}" if path else key,
                f"unknown field; allowed fields: {', '.join(sorted(allowed))}",
            )

    def text(self, raw: dict[str, Any], key: str, path: str, default: str | None = None) -> str:
        value = raw.get(key, default)
        if value is None:
            self.problem(f"{path}.{key}", "is required; add it")
            return ""
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            self.problem(f"{path}.{key}", f"{value!r} is not a string")
            return ""
        return str(value)

    def integer(self, raw: dict[str, Any], key: str, path: str, default: int, lo: int, hi: int,
                why: str = "") -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(f"{path}.{key}", f"{value!r} is not an integer; use a whole number in {lo}–{hi}")
            return default
        if value < lo:
            self.problem(f"{path}.{key}", f"{value} is below {lo}{why}; set it to {lo} or more")
        elif value > hi:
            self.problem(f"{path}.{key}", f"{value} is above {hi}{why}; set it to {hi} or less")
        return value

    def boolean(self, raw: dict[str, Any], key: str, path: str, default: bool) -> bool:
        value = raw.get(key, default)
        if not isinstance(value, bool):
            self.problem(f"{path}.{key}", f"{value!r} is not a boolean; use true or false")
            return default
        return value

    def choice(self, raw: dict[str, Any], key: str, path: str, default: str,
               allowed: tuple[str, ...] | frozenset[str]) -> str:
        value = raw.get(key, default)
        if value not in allowed:
            self.problem(
                f"{path}.{key}",
                f"{value!r} is not one of {', '.join(sorted(allowed))}; pick one of them",
            )
            return default
        return str(value)

    def name(self, value: str, path: str, pattern: re.Pattern[str], what: str) -> None:
        if value and not pattern.match(value):
            self.problem(path, f"{value!r} is not a valid {what}; use lowercase letters, digits and '-', "
                         "starting and ending with a letter or digit, at most 63 characters")

    def size(self, raw: dict[str, Any], key: str, path: str, default: str) -> str:
        value = self.text(raw, key, path, default)
        if value and not SIZE.match(value):
            self.problem(f"{path}.{key}", f"{value!r} is not a size like 100Gi; use <number>Ki|Mi|Gi|Ti")
        return value


def _named_items(r: _Reader, raw: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Accept a list of mappings with `name`, or a mapping keyed by name; return (name, body) pairs."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        items = []
        for name, body in raw.items():
            body = r.mapping(body, f"{path}.{name}")
            items.append((str(name), {**body, "name": body.get("name", name)}))
        return items
    if isinstance(raw, list):
        items = []
        for i, body in enumerate(raw):
            body = r.mapping(body, f"{path}[{i}]")
            items.append((str(body.get("name", f"#{i}")), body))
        return items
    r.problem(path, f"expected a list or mapping, got {type(raw).__name__}")
    return []


def _settings(r: _Reader, raw: dict[str, Any]) -> Settings:
    path = "settings"
    r.unknown_keys(raw, {"wave_size", "chunk_size", "l2_url", "serde", "hash_seed",
                         "lmcache_log_format", "operator_pause_threshold_minutes"}, path)
    s = Settings(
        wave_size=r.integer(raw, "wave_size", path, 3, 1, 500),
        chunk_size=r.integer(raw, "chunk_size", path, C.CHUNK_SIZE, 16, 4096),
        l2_url=r.text(raw, "l2_url", path, C.L2_URL),
        serde=r.choice(raw, "serde", path, C.L2_SERDE, ("naive",)),
        hash_seed=r.text(raw, "hash_seed", path, C.PYTHONHASHSEED),
        lmcache_log_format=r.choice(raw, "lmcache_log_format", path, "0.3.9", LMCACHE_LOG_FORMATS),
        operator_pause_threshold_minutes=r.integer(raw, "operator_pause_threshold_minutes", path, 30, 1, 1440),
    )
    if s.l2_url and not s.l2_url.startswith(f"fs://localhost:0{C.L2_MOUNT_PATH}/"):
        r.problem(f"{path}.l2_url", f"{s.l2_url!r} must be an fs:// URL under {C.L2_MOUNT_PATH}/ "
                  f"(LMCache's fs connector reads the Curvine mount); use {C.L2_URL}")
    return s


def _curvine(r: _Reader, raw: dict[str, Any], path: str) -> CurvineSpec:
    d = CurvineSpec()
    r.unknown_keys(raw, {"chart", "csi_chart", "repo_url", "version", "namespace", "master", "worker",
                         "storage_class", "fs_path", "scale_out"}, path)
    master = r.mapping(raw.get("master"), f"{path}.master")
    worker = r.mapping(raw.get("worker"), f"{path}.worker")
    r.unknown_keys(master, {"replicas", "storage_class", "meta_size", "journal_size"}, f"{path}.master")
    r.unknown_keys(worker, {"replicas", "host_path", "size"}, f"{path}.worker")
    spec = CurvineSpec(
        chart=r.text(raw, "chart", path, d.chart),
        csi_chart=r.text(raw, "csi_chart", path, d.csi_chart),
        repo_url=r.text(raw, "repo_url", path, d.repo_url),
        version=r.text(raw, "version", path, d.version),
        namespace=r.text(raw, "namespace", path, d.namespace),
        master_replicas=r.integer(master, "replicas", f"{path}.master", 1, 1, 7),
        master_storage_class=r.text(master, "storage_class", f"{path}.master", d.master_storage_class),
        master_meta_size=r.size(master, "meta_size", f"{path}.master", d.master_meta_size),
        master_journal_size=r.size(master, "journal_size", f"{path}.master", d.master_journal_size),
        worker_replicas=r.integer(worker, "replicas", f"{path}.worker", 2, 1, 1000),
        worker_host_path=r.text(worker, "host_path", f"{path}.worker", d.worker_host_path),
        worker_size=r.size(worker, "size", f"{path}.worker", d.worker_size),
        storage_class=r.text(raw, "storage_class", path, d.storage_class),
        fs_path=r.text(raw, "fs_path", path, d.fs_path),
        scale_out=r.choice(raw, "scale_out", path, "report", ("report", "auto")),
    )
    if spec.master_replicas % 2 == 0:
        r.problem(f"{path}.master.replicas", f"{spec.master_replicas} is even; Curvine's Raft masters must be "
                  "odd (1, 3, 5, 7)")
    r.name(spec.namespace, f"{path}.namespace", DNS_LABEL, "Kubernetes namespace")
    if not spec.worker_host_path.startswith("/"):
        r.problem(f"{path}.worker.host_path", f"{spec.worker_host_path!r} must be an absolute path on the node's NVMe")
    if not spec.fs_path.startswith("/"):
        r.problem(f"{path}.fs_path", f"{spec.fs_path!r} must be an absolute Curvine path such as /l2cache")
    return spec


def _addons(r: _Reader, raw: Any, path: str) -> tuple[AddonSpec, ...]:
    specs = []
    for name, body in _named_items(r, raw, path):
        p = f"{path}.{name}"
        if name not in C.ADDON_ORDER:
            r.problem(p, f"unknown add-on {name!r}; kvfleet manages {', '.join(C.ADDON_ORDER)}")
            continue
        r.unknown_keys(body, {"name", "version", "configuration"}, p)
        conf = body.get("configuration")
        if conf is not None and not isinstance(conf, dict):
            r.problem(f"{p}.configuration", "must be a mapping (it is sent as the add-on's JSON configurationValues)")
            conf = None
        version = body.get("version")
        specs.append(AddonSpec(name=name, version=str(version) if version else None, configuration=conf))
    return tuple(specs)


def _cluster(r: _Reader, name: str, raw: dict[str, Any]) -> Cluster:
    path = f"clusters.{name}"
    r.unknown_keys(raw, {"name", "region", "tiered_storage", "node_recovery", "gpu_nodes", "l2_injection",
                         "production", "ebs_storage_class", "curvine", "addons"}, path)
    r.name(name, f"{path}.name", HYPERPOD_NAME, "HyperPod cluster name")
    region = r.text(raw, "region", path)
    if region and not REGION.match(region):
        r.problem(f"{path}.region", f"{region!r} is not an AWS region such as us-east-1")
    ts = r.mapping(raw.get("tiered_storage"), f"{path}.tiered_storage")
    r.unknown_keys(ts, {"mode", "memory_percent"}, f"{path}.tiered_storage")
    gpu = r.mapping(raw.get("gpu_nodes"), f"{path}.gpu_nodes")
    r.unknown_keys(gpu, {"count", "instance_type"}, f"{path}.gpu_nodes")
    if not gpu:
        r.problem(f"{path}.gpu_nodes", "is required: declare {count: N, instance_type: ml.…}")
    cluster = Cluster(
        name=name,
        region=region,
        tiered_storage_mode=r.choice(ts, "mode", f"{path}.tiered_storage", "Enable", tuple(sorted(C.TIERED_MODES))),
        memory_percent=r.integer(ts, "memory_percent", f"{path}.tiered_storage", C.MEMORY_PERCENT_DEFAULT,
                                 C.MEMORY_PERCENT_MIN, C.MEMORY_PERCENT_MAX, " (HyperPod accepts 20–100)"),
        node_recovery=r.choice(raw, "node_recovery", path, C.NODE_RECOVERY_DEFAULT,
                               tuple(sorted(C.NODE_RECOVERY_VALUES))),
        gpu_node_count=r.integer(gpu, "count", f"{path}.gpu_nodes", 0, 1, 10000),
        gpu_instance_type=r.text(gpu, "instance_type", f"{path}.gpu_nodes", "ml.g6e.4xlarge"),
        l2_injection=r.choice(raw, "l2_injection", path, "patch", L2_MODES),
        production=r.boolean(raw, "production", path, False),
        ebs_storage_class=r.text(raw, "ebs_storage_class", path, "ebs-sc"),
        curvine=_curvine(r, r.mapping(raw.get("curvine"), f"{path}.curvine"), f"{path}.curvine"),
        addons=_addons(r, raw.get("addons"), f"{path}.addons"),
    )
    _instance_type(r, cluster.gpu_instance_type, f"{path}.gpu_nodes.instance_type")
    return cluster


def _instance_type(r: _Reader, value: str, path: str) -> None:
    if value and not value.startswith("ml."):
        r.problem(path, f"{value!r} does not start with 'ml.' (SageMaker instance types do, "
                  f"and the CRD's instanceType pattern is ^ml\\..*); use e.g. ml.{value}")


def _endpoint(r: _Reader, name: str, raw: dict[str, Any], i: int) -> Endpoint:
    # Index plus name: the same name may legally appear on two clusters, so the name alone is ambiguous.
    path = f"endpoints[{i}]" if name.startswith("#") else f"endpoints[{i}]({name})"
    r.unknown_keys(raw, {"name", "namespace", "lob", "cluster", "model", "instance_type", "replicas",
                         "routing", "l1", "l2", "image", "model_id", "env"}, path)
    env = r.mapping(raw.get("env"), f"{path}.env")
    ep = Endpoint(
        name=r.text(raw, "name", path),
        namespace=r.text(raw, "namespace", path, "default"),
        lob=r.text(raw, "lob", path),
        cluster=r.text(raw, "cluster", path),
        model=r.text(raw, "model", path),
        instance_type=r.text(raw, "instance_type", path),
        replicas=r.integer(raw, "replicas", path, 2, 0, 1000),
        routing=r.choice(raw, "routing", path, "prefixaware", C.ROUTING_STRATEGIES),
        l1=r.boolean(raw, "l1", path, True),
        l2=r.boolean(raw, "l2", path, True),
        image=r.text(raw, "image", path, Endpoint.image),
        model_id=r.text(raw, "model_id", path, Endpoint.model_id),
        extra_env={str(k): str(v) for k, v in env.items()},
    )
    r.name(ep.name, f"{path}.name", DNS_LABEL, "Kubernetes object name")
    r.name(ep.namespace, f"{path}.namespace", DNS_LABEL, "Kubernetes namespace")
    if ep.model and not MODEL_NAME.match(ep.model):
        r.problem(f"{path}.model", f"{ep.model!r} does not match the CRD's modelName pattern "
                  "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}; use letters, digits and '-' only")
    _instance_type(r, ep.instance_type, f"{path}.instance_type")
    for reserved in (C.ENV_REMOTE_URL,):
        if reserved in ep.extra_env:
            r.problem(f"{path}.env.{reserved}", "must not be set in the inventory: the operator injects its own "
                      "entry and kvfleet replaces it (a second entry would duplicate it); remove it")
    return ep


def _cross_checks(r: _Reader, inv_lobs: dict[str, Lob], clusters: dict[str, Cluster],
                  endpoints: list[tuple[str, Endpoint]]) -> None:
    seen: dict[tuple[str, str, str], str] = {}
    for path, ep in endpoints:
        if ep.cluster and ep.cluster not in clusters:
            r.problem(f"{path}.cluster", f"{ep.cluster!r} is not a declared cluster; declared: "
                      f"{', '.join(sorted(clusters)) or 'none'}")
        if ep.lob and ep.lob not in inv_lobs:
            r.problem(f"{path}.lob", f"{ep.lob!r} is not a declared line of business; declared: "
                      f"{', '.join(sorted(inv_lobs)) or 'none'}")
        key = (ep.cluster, ep.namespace, ep.name)
        if key in seen:
            r.problem(f"{path}", f"duplicate endpoint {ep.namespace}/{ep.name} on cluster {ep.cluster} "
                      f"(also at {seen[key]}); rename one or move it to another namespace")
        else:
            seen[key] = path
        cluster = clusters.get(ep.cluster)
        if cluster and ep.l2 and cluster.gpu_node_count < 2:
            # A warning, not an error: L2 still serves one pod's restarts, but cross-node reuse (the point of
            # a shared L2) cannot exist and stage 5 will always report `unverifiable`.
            r.warnings.append(
                f"{r.source}: {path}.l2: true on cluster {ep.cluster} with "
                f"{cluster.gpu_node_count} GPU node; cross-node reuse needs at least 2 nodes, so verification "
                "will be 'unverifiable'. Add a node or set l2: false."
            )


def parse_inventory(text: str, source: str = "fleet.yaml") -> Inventory:
    """Parse and validate an inventory text. Raises ``InventoryError`` listing every problem."""
    r = _Reader(source)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError([f"{source}: not valid YAML: {exc}"]) from exc
    raw = r.mapping(raw, "(top level)")
    r.unknown_keys(raw, {"settings", "lobs", "clusters", "endpoints"}, "")
    settings = _settings(r, r.mapping(raw.get("settings"), "settings"))
    lobs = {}
    for name, body in _named_items(r, raw.get("lobs"), "lobs"):
        r.unknown_keys(body, {"name", "description", "remediate_drift"}, f"lobs.{name}")
        r.name(name, f"lobs.{name}", DNS_LABEL, "line-of-business name")
        lobs[name] = Lob(name, str(body.get("description", "")),
                         r.boolean(body, "remediate_drift", f"lobs.{name}", False))
    clusters = {name: _cluster(r, name, body) for name, body in _named_items(r, raw.get("clusters"), "clusters")}
    endpoints = []
    for i, (name, body) in enumerate(_named_items(r, raw.get("endpoints"), "endpoints")):
        ep = _endpoint(r, name, body, i)
        endpoints.append((f"endpoints[{i}]({ep.name})" if ep.name else f"endpoints[{i}]", ep))
    if not clusters:
        r.problem("clusters", "no cluster declared; declare at least one")
    _cross_checks(r, lobs, clusters, endpoints)
    if r.problems:
        raise InventoryError(r.problems)
    for w in r.warnings:
        warnings.warn(w, InventoryWarning, stacklevel=2)
    return Inventory(
        source=source,
        settings=settings,
        lobs=tuple(lobs.values()),
        clusters=tuple(clusters.values()),
        endpoints=tuple(ep for _, ep in endpoints),
        warnings=tuple(r.warnings),
    )


def load_inventory(path: str | Path) -> Inventory:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InventoryError([f"{p}: cannot read the inventory: {exc.strerror}"]) from exc
    return parse_inventory(text, source=p.name)
