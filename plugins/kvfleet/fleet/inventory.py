"""The fleet inventory: what platform teams declare, parsed into frozen models and validated in full.

Called from the CLI (`kvfleet validate|plan`), from every DAG's first task, and from the sandbox (which builds
the twin of the declared fleet). Pure: it reads a YAML text that the caller loaded, and never touches I/O
beyond ``load_inventory``'s one file read.

Validation collects *every* problem before it raises, because a platform team fixing a 12-endpoint file one
error per run would rightly give up. Each message names the file, the path inside it, the value, what is
allowed and the fix, e.g. ``fleet.yaml: clusters.ml-prod-1.tiered_storage.memory_percent: 15 is below 20
(HyperPod accepts 20–100); set it to 20 or more``.

Hostile input is bounded (issue 17): ``load_inventory`` reads only a regular file of at most
``MAX_INVENTORY_BYTES``; the YAML loader (``fleet/yaml_safe.py``) refuses duplicate keys, alias bombs and deep
nesting before any value is built; a value is never ``repr()``-ed whole into a message (``show`` cuts it to
``SHOW_CHARS``); at most ``MAX_PROBLEMS`` problems are listed.
"""

from __future__ import annotations

import math
import os
import re
import stat
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from kvfleet.errors import InventoryError
from kvfleet.fleet import constants as C
from kvfleet.fleet import hardware, models, yaml_safe
from kvfleet.fleet.repo_rule import repo_url_problem

MAX_INVENTORY_BYTES: Final = 4 * 1024 * 1024  # 4 MiB: the 12-endpoint example is 4 KiB; 1,000 endpoints ~ 300 KiB
SHOW_CHARS: Final = 80  # a value quoted in a message is cut to this many characters
MAX_PROBLEMS: Final = 200  # problems listed; the rest are counted

# Every pattern is used with fullmatch: `$` alone would accept a trailing newline ("chat\n").
# Kubernetes DNS-1123 label (namespaces, Deployment names that must also be Service names) and the
# CRD's modelName pattern (maxLength 63, ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}).
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MODEL_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
HYPERPOD_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
SIZE = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti)$")
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
# DNS-1123 subdomain (StorageClass names): lowercase alphanumerics, '-' and '.', at most 253 characters.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HASH_SEED_MAX: Final = 4_294_967_295  # PYTHONHASHSEED: "an integer in the range [0; 4294967295]" (python --help-env)
# SemVer 2.0.0 (semver.org's regex), what helm requires of a chart version; EKS add-on versions are v + SemVer.
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
                    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$")
# A helm chart name: lowercase letters, digits and '-' (helm's chart best practices; never a leading '-').
CHART_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# An OCI image reference (distribution/reference grammar): [domain[:port]/]path[:tag][@digest].
_IMG_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMG_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_IMG_DOMAIN = rf"(?:{_IMG_LABEL}(?:\.{_IMG_LABEL})*(?::\d{{1,5}})?/)"
IMAGE_REF = re.compile(rf"^{_IMG_DOMAIN}?{_IMG_COMPONENT}(?:/{_IMG_COMPONENT})*"
                       r"(?::[\w][\w.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$")
# A Hugging Face repo id: [owner/]name, letters, digits, '-', '_', '.'; no '--' or '..'; at most 96 characters.
HF_PART = re.compile(r"^[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?$")
# Characters helm's --set parser (pkg/strvals, FACTS §7.5) gives a meaning inside a value.
HELM_SPECIAL = frozenset(",={}[]\\")
# A host path kvfleet hands to helm and Kubernetes: absolute, plain characters only.
HOST_PATH = re.compile(r"^/[A-Za-z0-9._/-]*$")
# Env names kvfleet itself sets in the worker (endpoint_spec.worker_env): an inventory `env` entry would override
# them silently (a PYTHONHASHSEED there would bypass settings.hash_seed).
RESERVED_ENV: Final = {
    C.ENV_REMOTE_URL: "the operator injects its own entry and kvfleet replaces it (a second entry would duplicate it)",
    C.ENV_HASHSEED: "kvfleet sets it from settings.hash_seed on every pod; set that instead",
    C.ENV_REMOTE_SERDE: "kvfleet sets it from settings.serde; set that instead",
    C.ENV_CHUNK_SIZE: "kvfleet sets it from settings.chunk_size; set that instead",
}
L2_MODES = ("patch", "kyverno")  # what a cluster runs
# What a cluster may ask (issue 22 §1): `auto`, the default, is kyverno on a production cluster (the sources: manual
# patches do not survive in long-lived production; use a mutating webhook or a Kyverno ClusterPolicy), patch elsewhere.
L2_INJECTION_CHOICES = ("auto", *L2_MODES)
# An endpoint's workload (issue 22 §6) and the routing the sources advise for it (seed, "Roteamento inteligente":
# prefix-aware for multi-turn dialogue and shared system prompts, kv-aware for long documents and extended sessions,
# round-robin for stateless batch inference and load tests). RAG has no single advice: any cache-aware strategy.
WORKLOADS = ("rag", "long-document", "multi-turn", "system-prompt", "batch")
WORKLOAD_ROUTING: Final[dict[str, tuple[str, ...]]] = {
    "multi-turn": ("prefixaware",),
    "system-prompt": ("prefixaware",),
    "long-document": ("kvaware",),
    "batch": ("roundrobin",),
    "rag": ("prefixaware", "kvaware"),
}
WORKLOAD_WHY: Final[dict[str, str]] = {
    "multi-turn": "prefix-aware for multi-turn dialogue",
    "system-prompt": "prefix-aware for a shared system prompt",
    "long-document": "kv-aware for long documents",
    "batch": "round-robin for stateless batch inference and load tests",
    "rag": "a cache-aware strategy (prefixaware or kvaware) for RAG that reuses retrieved context",
}
MAX_MODEL_PARAMS_B: Final = 10_000.0  # billions; far above any model a replica can hold
# How stage 4's patch mode changes a rendered Deployment (issue 15 §2; plan.choose_strategy decides `auto`).
UPDATE_STRATEGIES = ("auto", "rolling", "surge", "scale-to-zero")
UPDATE_STRATEGY_HELP: Final = ("auto (the default: rolling with 2 or more replicas, surge when a GPU is spare, "
                               "else scale-to-zero), rolling (maxSurge 0, maxUnavailable 1: N-1 keep serving), "
                               "surge (maxSurge 1, maxUnavailable 0: needs one spare GPU per endpoint), "
                               "scale-to-zero (the seed's sequence: an outage while the patch lasts)")
LMCACHE_LOG_FORMATS = ("0.3.9", "0.5.6")
# An SNS topic ARN (AWS "Amazon Resource Names" and SNS CreateTopic: a topic name is 1–256 characters of letters,
# digits, '-' and '_', a FIFO topic's ends in ".fifo"); partition aws, aws-cn, aws-us-gov, …
SNS_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z]{2}(-[a-z]+)+-\d:\d{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$")
# A SageMaker instance type as a key of `prices` (and of the CRD's instanceType pattern ^ml\..*).
INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9-]+\.[a-z0-9]+$")
MAX_PRICE_USD_PER_HOUR: Final = 10_000.0  # far above any SageMaker instance (ml.p5en.48xlarge is ~100 USD/h)


class InventoryWarning(UserWarning):
    """A legal but useless setting (for example L2 on a one-node cluster)."""


@dataclass(frozen=True)
class Lob:
    name: str
    description: str = ""
    remediate_drift: bool = False
    # Where this LOB's notifications also go (issue 22; kvfleet.airflow.notify): both optional.
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
    worker_replicas: int = 2  # the inventory sets it: `worker.replicas`, or the cluster's GPU node count (issue 22 §2)
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
    # NodeRecovery) and drift does not judge it. A declared value is reconciled in stage 1 (issue 22 §3).
    node_recovery: str | None = None
    l2_injection: str = "patch"  # what the cluster runs: patch | kyverno (`auto` resolved, see l2_injection_reason)
    l2_injection_asked: str = "auto"  # what the inventory says: auto | patch | kyverno
    l2_injection_reason: str = ""
    update_strategy: str = "auto"  # the default of its endpoints (an endpoint's own value wins)
    production: bool = False
    ebs_storage_class: str = "ebs-sc"
    curvine: CurvineSpec = field(default_factory=CurvineSpec)
    addons: tuple[AddonSpec, ...] = ()

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
    workload: str | None = None  # rag | long-document | multi-turn | system-prompt | batch (issue 22 §6)
    # The served model's size (issue 22 §5): explicit `model_params_b` + `dtype`, else the catalogue row of `model`
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


def size_to_bytes(size: str) -> int:
    m = SIZE.fullmatch(size)
    if not m:
        raise ValueError(f"not a Kubernetes binary size: {size!r}")
    power = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4}[m.group(2)]
    return int(m.group(1)) * int(1024**power)


# ---------------------------------------------------------------------------------------------------------
# Parsing with problem collection
# ---------------------------------------------------------------------------------------------------------


def show(value: Any, limit: int = SHOW_CHARS) -> str:
    """A value as a message quotes it: scalars as repr, cut to ``limit`` characters; containers by type and size.

    Never calls ``repr``/``str`` on a container (an alias-shared structure can expand enormously) nor on a huge
    string or integer.
    """
    if isinstance(value, str):
        if len(value) > limit:
            return repr(value[:limit]) + f"… ({len(value)} characters)"
        return repr(value)
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 200:
            return f"an integer of {value.bit_length()} bits"
        return repr(value)
    if isinstance(value, dict):
        return f"a mapping of {len(value)} keys"
    if isinstance(value, list | tuple | set | frozenset):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, bytes):
        return f"binary data of {len(value)} bytes"
    text = repr(value)  # dates, timestamps: short by construction
    return text if len(text) <= limit else text[:limit] + "…"


def _key(name: Any) -> str:
    """A name used inside a problem's path: a short string."""
    text = name if isinstance(name, str) else show(name)
    return text if len(text) <= 64 else text[:64] + "…"


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", type(None): "null"}.get(type(value), f"a {type(value).__name__}")


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
            self.problem(path, f"expected a mapping, got {_type_name(raw)} {show(raw)}")
            return {}
        bad = [k for k in raw if not isinstance(k, str)]
        for k in bad[:5]:
            self.problem(f"{path}.{_key(k)}" if path else _key(k),
                         f"the key {show(k)} is {_type_name(k)}; field names are strings — quote it")
        return {k: v for k, v in raw.items() if isinstance(k, str)} if bad else raw

    def unknown_keys(self, raw: dict[str, Any], allowed: set[str], path: str) -> None:
        for key in sorted(set(raw) - allowed)[:20]:
            self.problem(
                f"{path}.{_key(key)}" if path else _key(key),
                f"unknown field; allowed fields: {', '.join(sorted(allowed))}",
            )

    def text(self, raw: dict[str, Any], key: str, path: str, default: str | None = None,
             max_len: int = 253, allow_empty: bool = False) -> str:
        """A string field (a whole number is taken as its digits; a float or boolean is refused)."""
        value = raw.get(key, default)
        if value is None:
            self.problem(f"{path}.{key}", "is required; add it")
            return ""
        if isinstance(value, bool | float) or not isinstance(value, str | int):
            self.problem(f"{path}.{key}", f"{show(value)} is {_type_name(value)}, not a string; write a string")
            return ""
        if value == "" and not allow_empty:
            self.problem(f"{path}.{key}", "is empty; give it a value or leave the field out for the default")
            return ""
        if isinstance(value, int) and value.bit_length() > 64:
            self.problem(f"{path}.{key}", f"{show(value)} is not a string; write a string")
            return ""
        text = str(value)
        if len(text) > max_len:
            self.problem(f"{path}.{key}", f"{show(text)} is longer than {max_len} characters; shorten it")
            return ""
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
            self.problem(f"{path}.{key}", f"{show(text)} contains a control character; remove it")
            return ""
        return text

    def integer(self, raw: dict[str, Any], key: str, path: str, default: int, lo: int, hi: int,
                why: str = "") -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(f"{path}.{key}", f"{show(value)} is not an integer; use a whole number in {lo}–{hi}")
            return default
        if value < lo:
            self.problem(f"{path}.{key}", f"{show(value)} is below {lo}{why}; set it to {lo} or more")
            return default
        if value > hi:
            self.problem(f"{path}.{key}", f"{show(value)} is above {hi}{why}; set it to {hi} or less")
            return default
        return value

    def boolean(self, raw: dict[str, Any], key: str, path: str, default: bool) -> bool:
        value = raw.get(key, default)
        if not isinstance(value, bool):
            self.problem(f"{path}.{key}", f"{show(value)} is not a boolean; use true or false")
            return default
        return value

    def choice(self, raw: dict[str, Any], key: str, path: str, default: str,
               allowed: tuple[str, ...] | frozenset[str]) -> str:
        value = raw.get(key, default)
        if not isinstance(value, str) or value not in allowed:
            self.problem(
                f"{path}.{key}",
                f"{show(value)} is not one of {', '.join(sorted(allowed))}; pick one of them",
            )
            return default
        return value

    def name(self, value: str, path: str, pattern: re.Pattern[str], what: str) -> None:
        if value and not pattern.fullmatch(value):
            self.problem(path, f"{show(value)} is not a valid {what}; use lowercase letters, digits and '-', "
                         "starting and ending with a letter or digit, at most 63 characters")

    def size(self, raw: dict[str, Any], key: str, path: str, default: str) -> str:
        value = self.text(raw, key, path, default)
        if value and not SIZE.fullmatch(value):
            self.problem(f"{path}.{key}", f"{show(value)} is not a size like 100Gi; use <number>Ki|Mi|Gi|Ti")
            return default
        return value

    def update_strategy(self, raw: dict[str, Any], path: str, default: str | None) -> str | None:
        value = raw.get("update_strategy", default)
        if value is not None and (not isinstance(value, str) or value not in UPDATE_STRATEGIES):
            self.problem(f"{path}.update_strategy", f"{show(value)} is not an update strategy; allowed: "
                         f"{UPDATE_STRATEGY_HELP}. Set one of {', '.join(UPDATE_STRATEGIES)}, or remove the key "
                         "for auto")
            return default
        return value

    def storage_class(self, raw: dict[str, Any], key: str, path: str, default: str) -> str:
        value = self.text(raw, key, path, default)
        if value and not (len(value) <= 253 and DNS_SUBDOMAIN.fullmatch(value)):
            self.problem(f"{path}.{key}", f"{show(value)} is not a valid StorageClass name (DNS-1123 subdomain: "
                         "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at "
                         "most 253 characters); use e.g. ebs-sc")
        return value

    def helm_value(self, value: str, path: str) -> bool:
        """A string that reaches ``helm --set``: refuse what helm's parser would interpret (FACTS §7.5)."""
        if value.startswith("-"):
            self.problem(path, f"{show(value)} begins with '-', which helm and kubectl read as a flag; "
                         "remove the leading '-'")
            return False
        special = sorted({ch for ch in value if ch in HELM_SPECIAL})
        if special:
            self.problem(path, f"{show(value)} contains {' '.join(repr(c) for c in special)}, which helm's --set "
                         "parser interprets (a ',' splits the value, '=' '{' '}' '[' '\\' are syntax); "
                         "use a value without them")
            return False
        return True


def _named_items(r: _Reader, raw: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Accept a list of mappings with `name`, or a mapping keyed by name; return (name, body) pairs.

    A name must be a string (or a plain integer); a name that appears twice is a problem, never "last wins".
    """
    if raw is None:
        return []
    items: list[tuple[str, dict[str, Any]]] = []
    if isinstance(raw, dict):
        for name, body in raw.items():
            body = r.mapping(body, f"{path}.{_key(name)}")
            items.append((_key(name), {**body, "name": body.get("name", name)}))
    elif isinstance(raw, list):
        for i, body in enumerate(raw):
            body = r.mapping(body, f"{path}[{i}]")
            name = body.get("name", f"#{i}")
            if isinstance(name, bool) or not isinstance(name, str | int) or len(str(name)) > 253:
                r.problem(f"{path}[{i}].name", f"{show(name)} is not a name; use a string")
                name = f"#{i}"
            items.append((str(name), body))
    else:
        r.problem(path, f"expected a list or mapping, got {_type_name(raw)} {show(raw)}")
        return []
    return items


def _unique(r: _Reader, items: list[tuple[str, dict[str, Any]]], path: str, what: str) -> None:
    seen: dict[str, int] = {}
    for i, (name, _) in enumerate(items):
        if name.startswith("#"):
            continue
        if name in seen:
            r.problem(f"{path}[{i}]", f"duplicate {what} {show(name)} (also at {path}[{seen[name]}]); "
                      "each name may appear once — merge the two entries or rename one")
        else:
            seen[name] = i


def _no_dotdot(r: _Reader, value: str, path: str, what: str) -> bool:
    if ".." in value.split("/"):
        r.problem(path, f"{show(value)} contains a '..' segment; {what} must not climb out of its directory — "
                  "write the path without '..'")
        return False
    return True


def _settings(r: _Reader, raw: dict[str, Any]) -> Settings:
    path = "settings"
    r.unknown_keys(raw, {"wave_size", "chunk_size", "l2_url", "serde", "hash_seed",
                         "lmcache_log_format", "operator_pause_threshold_minutes"}, path)
    s = Settings(
        wave_size=r.integer(raw, "wave_size", path, 3, 1, 500),
        chunk_size=r.integer(raw, "chunk_size", path, C.CHUNK_SIZE, 16, 4096),
        l2_url=r.text(raw, "l2_url", path, C.L2_URL, max_len=1024),
        serde=r.choice(raw, "serde", path, C.L2_SERDE, ("naive",)),
        hash_seed=_hash_seed(r, raw, path),
        lmcache_log_format=r.choice(raw, "lmcache_log_format", path, "0.3.9", LMCACHE_LOG_FORMATS),
        operator_pause_threshold_minutes=r.integer(raw, "operator_pause_threshold_minutes", path, 30, 1, 1440),
    )
    if s.l2_url and not s.l2_url.startswith(f"fs://localhost:0{C.L2_MOUNT_PATH}/"):
        r.problem(f"{path}.l2_url", f"{show(s.l2_url)} must be an fs:// URL under {C.L2_MOUNT_PATH}/ "
                  f"(LMCache's fs connector reads the Curvine mount); use {C.L2_URL}")
    elif s.l2_url and _no_dotdot(r, s.l2_url, f"{path}.l2_url", "the L2 path") and " " in s.l2_url:
        r.problem(f"{path}.l2_url", f"{show(s.l2_url)} contains a space; use {C.L2_URL}")
    return s


def _hash_seed(r: _Reader, raw: dict[str, Any], path: str) -> str:
    value = raw.get("hash_seed", C.PYTHONHASHSEED)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value) if value.bit_length() <= 64 else value
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 10 \
            or int(value) > HASH_SEED_MAX:
        r.problem(f"{path}.hash_seed", f"{show(value)} is not an integer string in 0–{HASH_SEED_MAX}; "
                  "PYTHONHASHSEED must be the same fixed number on every pod (LMCache keys derive from Python "
                  "hashes; 'random' gives each pod its own keys and no cross-pod hit) — use \"0\"")
        return C.PYTHONHASHSEED
    return value


def _chart_version(r: _Reader, value: str, path: str, what: str) -> None:
    if value and not SEMVER.fullmatch(value):
        r.problem(path, f"{show(value)} is not a SemVer 2 version, which {what} requires; use e.g. "
                  f"{C.CURVINE_CHART_VERSION}")


def _repo_url(r: _Reader, value: str, allow_http: bool, path: str) -> None:
    problem = repo_url_problem(value, allow_http=allow_http, shown=show(value),
                               allowance="set allow_insecure_repo: true beside it")
    if problem:
        r.problem(path, problem)


def _curvine(r: _Reader, raw: dict[str, Any], path: str, gpu_nodes: int) -> CurvineSpec:
    """Curvine's settings; the worker count defaults to the cluster's GPU node count (issue 22 §2: the sources put a
    worker on every GPU node's local NVMe, so writes land locally and L2 holds worker size × N)."""
    d = CurvineSpec()
    r.unknown_keys(raw, {"chart", "csi_chart", "repo_url", "version", "namespace", "master", "worker",
                         "storage_class", "fs_path", "scale_out", "allow_insecure_repo"}, path)
    master = r.mapping(raw.get("master"), f"{path}.master")
    worker = r.mapping(raw.get("worker"), f"{path}.worker")
    r.unknown_keys(master, {"replicas", "storage_class", "meta_size", "journal_size"}, f"{path}.master")
    r.unknown_keys(worker, {"replicas", "host_path", "size"}, f"{path}.worker")
    spec = CurvineSpec(
        chart=r.text(raw, "chart", path, d.chart),
        csi_chart=r.text(raw, "csi_chart", path, d.csi_chart),
        repo_url=r.text(raw, "repo_url", path, d.repo_url, max_len=2048),
        version=r.text(raw, "version", path, d.version),
        namespace=r.text(raw, "namespace", path, d.namespace),
        master_replicas=r.integer(master, "replicas", f"{path}.master", 1, 1, 7),
        master_storage_class=r.storage_class(master, "storage_class", f"{path}.master", d.master_storage_class),
        master_meta_size=r.size(master, "meta_size", f"{path}.master", d.master_meta_size),
        master_journal_size=r.size(master, "journal_size", f"{path}.master", d.master_journal_size),
        worker_replicas=r.integer(worker, "replicas", f"{path}.worker", max(1, gpu_nodes), 1, 1000)
        if "replicas" in worker else max(1, gpu_nodes),
        worker_replicas_declared="replicas" in worker,
        worker_host_path=r.text(worker, "host_path", f"{path}.worker", d.worker_host_path, max_len=4096),
        worker_size=r.size(worker, "size", f"{path}.worker", d.worker_size),
        storage_class=r.storage_class(raw, "storage_class", path, d.storage_class),
        fs_path=r.text(raw, "fs_path", path, d.fs_path, max_len=4096),
        scale_out=r.choice(raw, "scale_out", path, "report", ("report", "auto")),
        allow_insecure_repo=r.boolean(raw, "allow_insecure_repo", path, False),
    )
    if spec.worker_replicas_declared and gpu_nodes >= 1 and spec.worker_replicas != gpu_nodes:
        fewer = spec.worker_replicas < gpu_nodes
        r.warnings.append(
            f"{r.source}: {path}.worker.replicas: {spec.worker_replicas} "
            + (f"is below the cluster's {gpu_nodes} GPU nodes: pods on the {gpu_nodes - spec.worker_replicas} nodes "
               "without a worker write their KV blocks over the network, and L2 holds "
               f"{spec.worker_size} × {spec.worker_replicas} instead of × {gpu_nodes} (the sources put a worker on "
               "every GPU node)" if fewer else
               f"is above the cluster's {gpu_nodes} GPU nodes: with one worker per node the extra "
               f"{spec.worker_replicas - gpu_nodes} would stay Pending")
            + f". Remove worker.replicas to follow the GPU node count, or set it to {gpu_nodes}."
        )
    if spec.master_replicas % 2 == 0:
        r.problem(f"{path}.master.replicas", f"{spec.master_replicas} is even; Curvine's Raft masters must be "
                  "odd (1, 3, 5, 7)")
    r.name(spec.namespace, f"{path}.namespace", DNS_LABEL, "Kubernetes namespace")
    for key, value in (("chart", spec.chart), ("csi_chart", spec.csi_chart)):
        if value and not CHART_NAME.fullmatch(value):
            r.problem(f"{path}.{key}", f"{show(value)} is not a helm chart name (lowercase letters, digits and "
                      "'-', starting and ending with a letter or digit); use e.g. curvine")
    _chart_version(r, spec.version, f"{path}.version", "helm")
    _repo_url(r, spec.repo_url, spec.allow_insecure_repo, f"{path}.repo_url")
    hp = spec.worker_host_path
    hp_path = f"{path}.worker.host_path"
    if hp and r.helm_value(hp, hp_path) and _no_dotdot(r, hp, hp_path, "a host path") \
            and (not HOST_PATH.fullmatch(hp) or len(hp) < 2):
        r.problem(f"{path}.worker.host_path", f"{show(hp)} must be an absolute path on the node's NVMe of "
                  "letters, digits, '.', '_', '-' and '/'; use e.g. /opt/dlami/nvme/curvine-data")
    fs = spec.fs_path
    if fs and _no_dotdot(r, fs, f"{path}.fs_path", "the Curvine path") and not HOST_PATH.fullmatch(fs):
        r.problem(f"{path}.fs_path", f"{show(fs)} must be an absolute Curvine path of letters, digits, "
                  "'.', '_', '-' and '/', such as /l2cache")
    return spec


def _json_value(r: _Reader, value: Any, path: str, depth: int = 0) -> bool:
    """True when ``value`` is plain JSON (add-on configurationValues are sent as a JSON string)."""
    if depth > 20:
        r.problem(path, "is nested more than 20 levels; flatten it")
        return False
    if value is None or isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return value.bit_length() <= 64 or _bad(r, path, value, "an integer beyond 64 bits")
    if isinstance(value, float):
        return math.isfinite(value) or _bad(r, path, value, "not a finite number")
    if isinstance(value, list):
        return all(_json_value(r, v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
    if isinstance(value, dict):
        return all(
            (isinstance(k, str) or _bad(r, f"{path}.{_key(k)}", k, "a key that is not a string"))
            and _json_value(r, v, f"{path}.{_key(k)}", depth + 1)
            for k, v in value.items()
        )
    return _bad(r, path, value, f"{_type_name(value)}, which JSON cannot carry")


def _bad(r: _Reader, path: str, value: Any, why: str) -> bool:
    r.problem(path, f"{show(value)} is {why}; use a string, number, boolean, list or mapping")
    return False


def _addons(r: _Reader, raw: Any, path: str) -> tuple[AddonSpec, ...]:
    specs = []
    items = _named_items(r, raw, path)
    _unique(r, items, path, "add-on")
    for name, body in items:
        p = f"{path}.{name}"
        if name not in C.ADDON_ORDER:
            r.problem(p, f"unknown add-on {show(name)}; kvfleet manages {', '.join(C.ADDON_ORDER)}")
            continue
        r.unknown_keys(body, {"name", "version", "configuration"}, p)
        conf = body.get("configuration")
        if conf is not None and not isinstance(conf, dict):
            r.problem(f"{p}.configuration", f"{show(conf)} must be a mapping (it is sent as the add-on's JSON "
                      "configurationValues)")
            conf = None
        elif conf is not None and not _json_value(r, conf, f"{p}.configuration"):
            conf = None
        version = r.text(body, "version", p, "", allow_empty=True) or None
        if version and not (version.startswith("v") and SEMVER.fullmatch(version[1:])):
            r.problem(f"{p}.version", f"{show(version)} is not an EKS add-on version (v + SemVer, such as "
                      "v1.0.0-eksbuild.1); use the version `aws eks describe-addon-versions` lists")
            version = None
        specs.append(AddonSpec(name=name, version=version, configuration=conf))
    return tuple(specs)


def _cluster(r: _Reader, name: str, raw: dict[str, Any]) -> Cluster:
    path = f"clusters.{name}"
    r.unknown_keys(raw, {"name", "region", "tiered_storage", "node_recovery", "gpu_nodes", "l2_injection",
                         "update_strategy", "production", "ebs_storage_class", "curvine", "addons"}, path)
    r.name(name, f"{path}.name", HYPERPOD_NAME, "HyperPod cluster name")
    region = r.text(raw, "region", path)
    if region and not REGION.fullmatch(region):
        r.problem(f"{path}.region", f"{show(region)} is not an AWS region such as us-east-1")
    ts = r.mapping(raw.get("tiered_storage"), f"{path}.tiered_storage")
    r.unknown_keys(ts, {"mode", "memory_percent"}, f"{path}.tiered_storage")
    gpu = r.mapping(raw.get("gpu_nodes"), f"{path}.gpu_nodes")
    r.unknown_keys(gpu, {"count", "instance_type"}, f"{path}.gpu_nodes")
    if not gpu:
        r.problem(f"{path}.gpu_nodes", "is required: declare {count: N, instance_type: ml.…}")
    gpu_node_count = r.integer(gpu, "count", f"{path}.gpu_nodes", 0, 1, 10000)
    production = r.boolean(raw, "production", path, False)
    asked = r.choice(raw, "l2_injection", path, "auto", L2_INJECTION_CHOICES)
    mode, reason = resolve_l2_injection(asked, production)
    if asked == "patch" and production:
        r.warnings.append(
            f"{r.source}: {path}.l2_injection: patch on a production cluster: the operator re-renders its "
            "Deployments (a CR edit, an operator upgrade, a deleted Deployment) and each re-render drops the patch "
            "until drift notices; the sources recommend a mutating webhook or a Kyverno ClusterPolicy for long-lived "
            "production. Set l2_injection: kyverno, or remove the key (auto: kyverno on production clusters)."
        )
    cluster = Cluster(
        name=name,
        region=region,
        tiered_storage_mode=r.choice(ts, "mode", f"{path}.tiered_storage", "Enable", tuple(sorted(C.TIERED_MODES))),
        memory_percent=r.integer(ts, "memory_percent", f"{path}.tiered_storage", C.MEMORY_PERCENT_DEFAULT,
                                 C.MEMORY_PERCENT_MIN, C.MEMORY_PERCENT_MAX, " (HyperPod accepts 20–100)"),
        node_recovery=_node_recovery(r, raw, path),
        gpu_node_count=gpu_node_count,
        gpu_instance_type=r.text(gpu, "instance_type", f"{path}.gpu_nodes", "ml.g6e.4xlarge"),
        l2_injection=mode,
        l2_injection_asked=asked,
        l2_injection_reason=reason,
        update_strategy=r.update_strategy(raw, path, "auto") or "auto",
        production=production,
        ebs_storage_class=r.storage_class(raw, "ebs_storage_class", path, "ebs-sc"),
        curvine=_curvine(r, r.mapping(raw.get("curvine"), f"{path}.curvine"), f"{path}.curvine", gpu_node_count),
        addons=_addons(r, raw.get("addons"), f"{path}.addons"),
    )
    if _instance_type(r, cluster.gpu_instance_type, f"{path}.gpu_nodes.instance_type") \
            and hardware.gpu_shape(cluster.gpu_instance_type) is None:
        r.problem(f"{path}.gpu_nodes.instance_type", f"{show(cluster.gpu_instance_type)} is not an instance type "
                  "kvfleet knows the GPUs of, so GPU capacity cannot be checked; use one of "
                  f"{', '.join(hardware.known_types())}")
    return cluster


def resolve_l2_injection(asked: str, production: bool) -> tuple[str, str]:
    """(the L2 injection a cluster runs, why): `auto` is kyverno on a production cluster, patch elsewhere."""
    if asked == "auto":
        if production:
            return "kyverno", ("auto: production cluster → kyverno (the sources: a manual patch does not survive "
                               "operator re-renders in long-lived production)")
        return "patch", "auto: not a production cluster → patch (the seed's patch sequence, batched per wave)"
    return asked, f"asked (l2_injection: {asked})"


def _node_recovery(r: _Reader, raw: dict[str, Any], path: str) -> str | None:
    """The declared NodeRecovery, or None when the key is absent (keep the cluster's live value)."""
    if "node_recovery" not in raw:
        return None
    allowed = tuple(sorted(C.NODE_RECOVERY_VALUES))
    value = raw["node_recovery"]
    if value is None:
        r.problem(f"{path}.node_recovery", "is null (YAML reads null, ~ or an empty value as no value); write "
                  "Automatic or None, or remove the key to keep the cluster's live value")
        return None
    if not isinstance(value, str) or value not in allowed:
        r.problem(f"{path}.node_recovery", f"{show(value)} is not one of {', '.join(allowed)} (SageMaker's "
                  "ClusterNodeRecovery); set one of them, or remove the key to keep the cluster's live value")
        return None
    return value


def _instance_type(r: _Reader, value: str, path: str) -> bool:
    if value and not value.startswith("ml."):
        r.problem(path, f"{show(value)} does not start with 'ml.' (SageMaker instance types do, "
                  f"and the CRD's instanceType pattern is ^ml\\..*); use e.g. ml.{_key(value)}")
        return False
    if value and not re.fullmatch(r"^ml\.[a-z0-9-]+\.[a-z0-9]+$", value):
        r.problem(path, f"{show(value)} is not a SageMaker instance type such as ml.g5.4xlarge")
        return False
    return bool(value)


def _env(r: _Reader, raw: Any, path: str) -> dict[str, str]:
    env = r.mapping(raw, path)
    out: dict[str, str] = {}
    for name, value in list(env.items())[:200]:
        p = f"{path}.{_key(name)}"
        if not ENV_NAME.fullmatch(name) or len(name) > 255:
            r.problem(p, f"{show(name)} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most "
                      "255 characters); rename it, e.g. with '_' instead of '-' or '.'")
            continue
        if name in RESERVED_ENV:
            r.problem(p, f"must not be set in the inventory: {RESERVED_ENV[name]}; remove it")
            continue
        if isinstance(value, bool) or not isinstance(value, str | int | float) or \
                (isinstance(value, int) and value.bit_length() > 64):
            r.problem(p, f"{show(value)} is {_type_name(value)}; an env value is a string — quote it, e.g. "
                      f"{name}: \"1\"")
            continue
        text = str(value)
        if len(text) > 4096 or "\0" in text:
            r.problem(p, f"{show(text)} is longer than 4096 characters or contains NUL; shorten it")
            continue
        out[name] = text
    if len(env) > 200:
        r.problem(path, f"has {len(env)} entries; at most 200")
    return out


def _endpoint(r: _Reader, name: str, raw: dict[str, Any], i: int) -> Endpoint:
    # Index plus name: the same name may legally appear on two clusters, so the name alone is ambiguous.
    path = f"endpoints[{i}]" if name.startswith("#") else f"endpoints[{i}]({_key(name)})"
    r.unknown_keys(raw, {"name", "namespace", "lob", "cluster", "model", "instance_type", "replicas",
                         "routing", "l1", "l2", "image", "model_id", "env", "update_strategy", "workload",
                         "model_params_b", "dtype"}, path)
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
        image=r.text(raw, "image", path, Endpoint.image, max_len=512),
        model_id=r.text(raw, "model_id", path, Endpoint.model_id),
        extra_env=_env(r, raw.get("env"), f"{path}.env"),
        update_strategy=r.update_strategy(raw, path, None),
        workload=r.choice(raw, "workload", path, "", WORKLOADS) or None if raw.get("workload") is not None else None,
    )
    ep = _model_size(r, ep, raw, path)
    _routing_advice(r, ep, path)
    r.name(ep.name, f"{path}.name", DNS_LABEL, "Kubernetes object name")
    r.name(ep.namespace, f"{path}.namespace", DNS_LABEL, "Kubernetes namespace")
    if ep.model and not MODEL_NAME.fullmatch(ep.model):
        spec = models.lookup(ep.model)
        valid = next((n for n in (spec.key, *spec.aliases) if MODEL_NAME.fullmatch(n)), None) if spec else None
        r.problem(f"{path}.model", f"{show(ep.model)} does not match the CRD's modelName pattern "
                  "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}; use letters, digits and '-' only"
                  + (f", e.g. {valid} (the same catalogue model)" if valid else ""))
    _instance_type(r, ep.instance_type, f"{path}.instance_type")
    if ep.image and (len(ep.image) > 255 or not IMAGE_REF.fullmatch(ep.image)):
        r.problem(f"{path}.image", f"{show(ep.image)} is not an image reference "
                  "([registry[:port]/]repository[:tag][@sha256:digest], lowercase repository); use e.g. "
                  f"{Endpoint.image}")
    if ep.model_id:
        parts = ep.model_id.split("/")
        if len(parts) > 2 or len(ep.model_id) > 96 or "--" in ep.model_id or ".." in ep.model_id \
                or not all(HF_PART.fullmatch(p) for p in parts):
            r.problem(f"{path}.model_id", f"{show(ep.model_id)} is not a Hugging Face model id ([owner/]name of "
                      "letters, digits, '-', '_' and '.', no '--' or '..', at most 96 characters); use e.g. "
                      f"{Endpoint.model_id}")
    return ep


def _number(r: _Reader, raw: dict[str, Any], key: str, path: str, hi: float) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or (isinstance(value, int) and value.bit_length() > 64):
        r.problem(f"{path}.{key}", f"{show(value)} is {_type_name(value)}, not a number; write e.g. 7.62")
        return None
    if not math.isfinite(value) or value <= 0 or value > hi:
        r.problem(f"{path}.{key}", f"{show(value)} is not a number above 0 and at most {hi:g}; write the "
                  "parameter count in billions, e.g. 7.62 for a 7B model")
        return None
    return float(value)


def _model_size(r: _Reader, ep: Endpoint, raw: dict[str, Any], path: str) -> Endpoint:
    """The served model's parameter count and dtype: explicit `model_params_b` (+ `dtype`), else the catalogue row of
    `model`, else of `model_id` (what the operator downloads). Nothing to check when none of them says."""
    params = _number(r, raw, "model_params_b", path, MAX_MODEL_PARAMS_B)
    dtype = r.choice(raw, "dtype", path, "", models.DTYPES) or None if raw.get("dtype") is not None else None
    by_name = models.lookup(ep.model)
    by_id = models.lookup(ep.model_id)
    spec = by_name or by_id
    if by_name and by_id and by_name is not by_id and params is None:
        id_where = "model_id" if "model_id" in raw else "model_id (the default)"
        r.warnings.append(
            f"{r.source}: {path}.model: {show(ep.model)} is the catalogue's {by_name.hf_id}, but {id_where} "
            f"{show(ep.model_id)} is what the operator downloads ({by_id.hf_id}); the GPU memory check uses "
            f"{by_name.key}. Set model_id: {by_name.hf_id} if that is the model served."
        )
    if params is not None:
        if dtype is None and spec is None:
            r.problem(f"{path}.dtype", f"is required with model_params_b (the bytes per parameter); add one of "
                      f"{', '.join(models.DTYPES)}, e.g. dtype: bf16")
            return ep
        return replace(ep, model_params_b=params, dtype=dtype or (spec.dtype if spec else None))
    if spec is not None:
        return replace(ep, model_params_b=spec.params_b, dtype=dtype or spec.dtype, catalogue_model=spec.key)
    if ep.model:
        r.warnings.append(
            f"{r.source}: {path}.model: {show(ep.model)} (model_id {show(ep.model_id)}) is not in kvfleet's model "
            f"catalogue ({', '.join(models.known_names())}), so whether it fits the GPUs of one replica is not "
            "checked; add model_params_b (billions) and dtype to the endpoint."
        )
    return replace(ep, dtype=dtype)


def _routing_advice(r: _Reader, ep: Endpoint, path: str) -> None:
    """Warn when the routing strategy contradicts what the sources advise for the endpoint's workload (§6)."""
    if ep.workload is None or ep.routing in WORKLOAD_ROUTING[ep.workload]:
        return
    advised = WORKLOAD_ROUTING[ep.workload]
    r.warnings.append(
        f"{r.source}: {path}.routing: {ep.routing} for workload {ep.workload}; the sources advise "
        f"{WORKLOAD_WHY[ep.workload]}. Set routing: {advised[0]}"
        + (f" (or {' or '.join(advised[1:])})" if len(advised) > 1 else "")
        + ", or change workload if it does not describe the traffic. Note that the operator refuses a change of "
        "routing on an existing endpoint (intelligentRoutingSpec: \"Adding this configuration to an existing "
        "deployment will be rejected\")."
    )


def model_fit(ep: Endpoint) -> models.Fit | None:
    """The endpoint's model against the GPU memory of one replica, or None when either is unknown."""
    shape = hardware.gpu_shape(ep.instance_type)
    if shape is None or ep.model_params_b is None or ep.dtype is None:
        return None
    return models.fit(ep.model_params_b, ep.dtype, shape, hardware.GPUS_PER_REPLICA)


def _model_fit(r: _Reader, path: str, ep: Endpoint) -> None:
    f = model_fit(ep)
    if f is None or f.fits:
        return
    what = (f"{ep.catalogue_model} ({ep.model_params_b:g} B parameters, {ep.dtype}, catalogue)" if ep.catalogue_model
            else f"a {ep.model_params_b:g} B-parameter model in {ep.dtype}")
    bigger = [t for t in hardware.known_types() if (s := hardware.gpu_shape(t)) and
              models.fit(ep.model_params_b or 0, ep.dtype or "bf16", s, hardware.GPUS_PER_REPLICA).fits]
    families = sorted({t.split(".")[1] for t in bigger})
    r.problem(
        f"{path}.model_params_b" if ep.catalogue_model is None else f"{path}.model",
        f"{what} needs {f.weights_gib:.1f} GiB ({f.weights_gib * models.GIB / 1e9:.1f} GB) of GPU memory for its "
        f"weights alone, but one replica on "
        f"{ep.instance_type} gets {f.describe()} and vLLM uses {models.VLLM_GPU_MEMORY_UTILIZATION:g} of it "
        f"({f.usable_gib:.1f} GiB), leaving no room for the KV cache (kvfleet asks {hardware.GPUS_PER_REPLICA} GPU "
        "per replica); use an instance type whose GPU holds it"
        + (f" ({', '.join(families)})" if families else "")
        + ", a smaller model, or a smaller dtype",
    )


def _cross_checks(r: _Reader, inv_lobs: dict[str, Lob], clusters: dict[str, Cluster],
                  endpoints: list[tuple[str, Endpoint]]) -> None:
    seen: dict[tuple[str, str, str], str] = {}
    named: dict[tuple[str, str], tuple[str, str]] = {}
    unique: list[tuple[str, Endpoint]] = []  # a duplicate is its own problem, not also GPU demand
    for path, ep in endpoints:
        if ep.cluster and ep.cluster not in clusters:
            r.problem(f"{path}.cluster", f"{show(ep.cluster)} is not a declared cluster; declared: "
                      f"{', '.join(sorted(clusters)[:20]) or 'none'}")
        if ep.lob and ep.lob not in inv_lobs:
            r.problem(f"{path}.lob", f"{show(ep.lob)} is not a declared line of business; declared: "
                      f"{', '.join(sorted(inv_lobs)[:20]) or 'none'}")
        key = (ep.cluster, ep.namespace, ep.name)
        if key in seen:
            r.problem(f"{path}", f"duplicate endpoint {ep.namespace}/{ep.name} on cluster {ep.cluster} "
                      f"(also at {seen[key]}); rename one or move it to another namespace")
            continue
        seen[key] = path
        unique.append((path, ep))
        other = named.get((ep.cluster, ep.name))
        if other is not None and ep.name:
            # The CR's spec.endpointName is ep.name; the CRD describes it as the "Name of a SageMaker endpoint to
            # be created for this InferenceEndpointConfig", and a SageMaker endpoint name is unique per AWS
            # account and region — one cluster is one account and region, so the namespace does not separate
            # the two: the second CR's endpoint would collide with the first.
            r.problem(f"{path}.name", f"{show(ep.name)} is also the endpoint at {other[0]} (namespace "
                      f"{other[1]}) on cluster {ep.cluster}; kvfleet sets the CR's endpointName to the name, and "
                      "that names a SageMaker endpoint, unique per AWS account and region (the CRD: \"Name of a "
                      "SageMaker endpoint to be created\"), so two namespaces cannot both use it; rename one")
        else:
            named[(ep.cluster, ep.name)] = (path, ep.namespace)
        cluster = clusters.get(ep.cluster)
        if cluster and ep.instance_type.startswith("ml.") and cluster.gpu_instance_type.startswith("ml.") \
                and ep.instance_type != cluster.gpu_instance_type:
            r.problem(f"{path}.instance_type", f"{show(ep.instance_type)} but cluster {ep.cluster}'s GPU nodes are "
                      f"{cluster.gpu_instance_type} (gpu_nodes.instance_type): the operator schedules a replica "
                      f"only on nodes of its instanceType, so none would start; use {cluster.gpu_instance_type}")
        _model_fit(r, path, ep)
        if cluster and ep.l2 and cluster.gpu_node_count < 2:
            # A warning, not an error: L2 still serves one pod's restarts, but cross-node reuse (the point of
            # a shared L2) cannot exist and stage 5 will always report `unverifiable`.
            r.warnings.append(
                f"{r.source}: {path}.l2: true on cluster {ep.cluster} with "
                f"{cluster.gpu_node_count} GPU node; cross-node reuse needs at least 2 nodes, so verification "
                "will be 'unverifiable'. Add a node or set l2: false."
            )
    _gpu_capacity(r, clusters, unique)
    _strategy_checks(r, clusters, unique)


def _strategy_checks(r: _Reader, clusters: dict[str, Cluster], endpoints: list[tuple[str, Endpoint]]) -> None:
    """`rolling` keeps N-1 replicas serving: with one replica that is 0, which no strategy but scale-to-zero may
    cause. Refused here when the inventory already says so (the stage refuses it again on the live count)."""
    for path, ep in endpoints:
        cluster = clusters.get(ep.cluster)
        asked = ep.update_strategy or (cluster.update_strategy if cluster else "auto")
        if asked == "rolling" and ep.replicas < 2:
            where = "" if ep.update_strategy else f" (from clusters.{ep.cluster}.update_strategy)"
            r.problem(f"{path}.update_strategy", f"rolling{where} with replicas {ep.replicas}: a rolling update "
                      "keeps N-1 replicas serving, which is 0 here; set update_strategy: surge (needs a spare GPU) "
                      "or scale-to-zero on this endpoint, or raise replicas to 2")


def gpu_demand(cluster: Cluster, endpoints: list[Endpoint] | tuple[Endpoint, ...]) -> tuple[int, int]:
    """(GPUs the cluster's endpoints need, GPUs its declared nodes have), headroom of its L2 mode included."""
    shape = hardware.gpu_shape(cluster.gpu_instance_type)
    available = cluster.gpu_node_count * (shape.gpus if shape else 0)
    needed = sum(e.replicas * hardware.GPUS_PER_REPLICA for e in endpoints if e.cluster == cluster.name)
    # Surge headroom of the change strategy goes here (0 for both today: see hardware.PATCH_HEADROOM_GPUS).
    needed += hardware.PATCH_HEADROOM_GPUS.get(cluster.l2_injection, 0)
    return needed, available


def _gpu_capacity(r: _Reader, clusters: dict[str, Cluster], endpoints: list[tuple[str, Endpoint]]) -> None:
    for cluster in clusters.values():
        shape = hardware.gpu_shape(cluster.gpu_instance_type)
        if shape is None or cluster.gpu_node_count < 1:
            continue  # already a problem of its own
        eps = [ep for _, ep in endpoints if ep.cluster == cluster.name]
        needed, available = gpu_demand(cluster, eps)
        if needed > available:
            top = sorted(eps, key=lambda e: -e.replicas)[:5]
            detail = ", ".join(f"{e.namespace}/{e.name} {e.replicas}" for e in top)
            r.problem(f"clusters.{cluster.name}.gpu_nodes",
                      f"GPU overcommit: the endpoints need {needed} GPUs ({len(eps)} endpoints, replicas × "
                      f"{hardware.GPUS_PER_REPLICA} GPU each: {detail}{', …' if len(eps) > 5 else ''}) but "
                      f"{cluster.gpu_node_count} × {cluster.gpu_instance_type} nodes have {available} GPUs "
                      f"({shape.gpus} {shape.gpu} per node); replicas beyond {available} would stay Pending and "
                      f"the rollout end in DeploymentFailed — lower replicas or raise gpu_nodes.count to "
                      f"{-(-needed // shape.gpus)}")


def _safe_url(url: str) -> str:
    """A webhook URL as a message quotes it: scheme and host only (its path or query often is the secret)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return "(unparseable URL)"
    return show(f"{parts.scheme}://{host}/…" if parts.path not in ("", "/") or parts.query else url)


def _notify(r: _Reader, raw: Any, path: str) -> tuple[str | None, str | None]:
    """A LOB's `notify: {sns_topic_arn, webhook_url}` (both optional): (topic ARN, webhook URL)."""
    body = r.mapping(raw, path)
    r.unknown_keys(body, {"sns_topic_arn", "webhook_url"}, path)
    topic: str | None = None
    url: str | None = None
    if body.get("sns_topic_arn") is not None:
        topic = r.text(body, "sns_topic_arn", path, max_len=1024) or None
        if topic and not SNS_TOPIC_ARN.fullmatch(topic):
            r.problem(f"{path}.sns_topic_arn", f"{show(topic)} is not an SNS topic ARN "
                      "(arn:aws:sns:<region>:<12-digit account>:<topic name of letters, digits, '-', '_'>); use "
                      "e.g. arn:aws:sns:us-east-1:123456789012:kvfleet-retail, or remove the key")
            topic = None
    if body.get("webhook_url") is not None:
        value = body.get("webhook_url")
        url = r.text(body, "webhook_url", path, max_len=2048) or None
        if url:
            try:
                parts = urlsplit(url)
                _ = parts.port  # raises ValueError on a port that is not a number in 0–65535
                ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            except ValueError:  # a bad port or bracketed host
                ok = False
            if not ok or any(ch.isspace() for ch in url):
                r.problem(f"{path}.webhook_url", f"{_safe_url(url) if isinstance(value, str) else show(value)} is "
                          "not an http(s) URL (http:// or https://, a host, no spaces); use e.g. "
                          "https://hooks.example.com/kvfleet, or remove the key")
                url = None
    return topic, url


def _lobs(r: _Reader, raw: Any) -> dict[str, Lob]:
    lobs: dict[str, Lob] = {}
    lob_items = _named_items(r, raw, "lobs")
    _unique(r, lob_items, "lobs", "line of business")
    for name, body in lob_items:
        r.unknown_keys(body, {"name", "description", "remediate_drift", "notify"}, f"lobs.{name}")
        r.name(name, f"lobs.{name}", DNS_LABEL, "line-of-business name")
        topic, url = _notify(r, body.get("notify"), f"lobs.{name}.notify")
        lobs.setdefault(name, Lob(name, r.text(body, "description", f"lobs.{name}", "", max_len=1000,
                                                 allow_empty=True),
                                  r.boolean(body, "remediate_drift", f"lobs.{name}", False),
                                  notify_sns_topic_arn=topic, notify_webhook_url=url))
    return lobs


def _prices(r: _Reader, raw: Any) -> dict[str, float]:
    """Top-level `prices: {<instance type>: <USD per hour>}` (optional)."""
    body = r.mapping(raw, "prices")
    out: dict[str, float] = {}
    for itype, value in list(body.items())[:500]:
        p = f"prices.{_key(itype)}"
        if not INSTANCE_TYPE.fullmatch(itype):
            r.problem(p, f"{show(itype)} is not a SageMaker instance type (ml.<family>.<size>, such as "
                      "ml.g6e.4xlarge); use the instance type the price is for")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or (isinstance(value, int) and value.bit_length() > 64):
            r.problem(p, f"{show(value)} is {_type_name(value)}, not a price; write the USD per instance-hour as "
                      "a number, e.g. 1.861")
            continue
        price = float(value)
        if not math.isfinite(price) or price <= 0 or price > MAX_PRICE_USD_PER_HOUR:
            r.problem(p, f"{show(value)} is not a price in USD per hour above 0 and at most "
                      f"{MAX_PRICE_USD_PER_HOUR:g}; write the on-demand USD per instance-hour, e.g. 1.861")
            continue
        out[itype] = price
    if len(body) > 500:
        r.problem("prices", f"has {len(body)} entries; at most 500")
    return out


def parse_inventory(text: str, source: str = "fleet.yaml") -> Inventory:
    """Parse and validate an inventory text. Raises ``InventoryError`` listing every problem."""
    r = _Reader(source)
    if len(text) > MAX_INVENTORY_BYTES:
        raise InventoryError([f"{source}: the inventory has {len(text)} characters, more than the "
                              f"{MAX_INVENTORY_BYTES} allowed; split the fleet into several files"])
    try:
        raw = yaml_safe.load(text)
    except yaml.YAMLError as exc:
        raise InventoryError([f"{source}: not valid YAML: {_cut(str(exc), 400)}"]) from None
    except (ValueError, OverflowError, RecursionError, MemoryError) as exc:
        # a constructor's own failure (e.g. an integer of more than 4300 digits, a bad timestamp)
        raise InventoryError([f"{source}: not valid YAML: {type(exc).__name__}: {_cut(str(exc), 200)}"]) from None
    raw = r.mapping(raw, "(top level)")
    r.unknown_keys(raw, {"settings", "lobs", "clusters", "endpoints", "prices"}, "")
    settings = _settings(r, r.mapping(raw.get("settings"), "settings"))
    lobs = _lobs(r, raw.get("lobs"))
    prices = _prices(r, raw.get("prices"))
    cluster_items = _named_items(r, raw.get("clusters"), "clusters")
    _unique(r, cluster_items, "clusters", "cluster")
    clusters: dict[str, Cluster] = {}
    for name, body in cluster_items:
        clusters.setdefault(name, _cluster(r, name, body))
    endpoints = []
    for i, (name, body) in enumerate(_named_items(r, raw.get("endpoints"), "endpoints")):
        ep = _endpoint(r, name, body, i)
        endpoints.append((f"endpoints[{i}]({ep.name})" if ep.name else f"endpoints[{i}]", ep))
    if not clusters:
        r.problem("clusters", "no cluster declared; declare at least one")
    _cross_checks(r, lobs, clusters, endpoints)
    if r.problems:
        shown = r.problems[:MAX_PROBLEMS]
        if len(r.problems) > MAX_PROBLEMS:
            shown.append(f"{source}: … and {len(r.problems) - MAX_PROBLEMS} more problems")
        raise InventoryError(shown)
    for w in r.warnings:
        warnings.warn(w, InventoryWarning, stacklevel=2)
    return Inventory(
        source=source,
        settings=settings,
        lobs=tuple(lobs.values()),
        clusters=tuple(clusters.values()),
        endpoints=tuple(ep for _, ep in endpoints),
        warnings=tuple(r.warnings),
        prices=prices,
    )


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
