"""The inventory's vocabulary: the patterns a value must match, the limits and choices, and how a message quotes a
value (cut, never a container's repr).

Every pattern is used with ``fullmatch`` and ``re.ASCII``; the shared ones (an SNS topic ARN, a chart
repository URL) live in :mod:`kvfleet.fleet.shared_rules`, which ``kvfleet.settings`` reads too.
"""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic_core import PydanticCustomError

from kvfleet.fleet import constants as C
from kvfleet.fleet.shared_rules import NOT_A_URL, redact_url

MAX_INVENTORY_BYTES: Final = 4 * 1024 * 1024  # 4 MiB: the 12-endpoint example is 4 KiB; 1,000 endpoints ~ 300 KiB
SHOW_CHARS: Final = 80  # a value quoted in a message is cut to this many characters
MAX_PROBLEMS: Final = 200  # problems listed; the rest are counted

# Every pattern is used with fullmatch (`$` alone would accept a trailing newline) and re.ASCII, and spells its
# classes out ([0-9], not \d): a Unicode digit such as '١' is not a digit of a region, an account id or a port.
_A = re.ASCII
# Kubernetes DNS-1123 label (namespaces, object names) and the CRD's modelName pattern.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", _A)
MODEL_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", _A)
HYPERPOD_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", _A)
SIZE = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti)", _A)
REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]", _A)
# DNS-1123 subdomain (StorageClass names): lowercase alphanumerics, '-' and '.', at most 253 characters.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", _A)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", _A)
HASH_SEED_MAX: Final = 4_294_967_295  # PYTHONHASHSEED: "an integer in the range [0; 4294967295]" (python --help-env)
# SemVer 2.0.0 (semver.org's grammar), what helm requires of a chart version; EKS add-on versions are v + SemVer.
_NUM = r"(0|[1-9][0-9]*)"
_PRE = r"(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
SEMVER = re.compile(rf"{_NUM}\.{_NUM}\.{_NUM}(?:-({_PRE}(?:\.{_PRE})*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?",
                    _A)
CHART_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", _A)
# An OCI image reference (distribution/reference grammar): [domain[:port]/]path[:tag][@digest].
_IMG_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMG_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_IMG_DOMAIN = rf"(?:{_IMG_LABEL}(?:\.{_IMG_LABEL})*(?::[0-9]{{1,5}})?/)"
IMAGE_REF = re.compile(rf"{_IMG_DOMAIN}?{_IMG_COMPONENT}(?:/{_IMG_COMPONENT})*"
                       r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?", _A)
# A Hugging Face repo id part: letters, digits, '-', '_', '.'.
HF_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?", _A)
# Characters helm's --set parser gives a meaning inside a value (docs/reference/curvine.md, helm --set).
HELM_SPECIAL = frozenset(",={}[]\\")
# A host path kvfleet hands to helm and Kubernetes: absolute, plain characters only.
HOST_PATH = re.compile(r"/[A-Za-z0-9._/-]*", _A)
# Where a Curvine worker's hostPath may live unless settings.curvine_host_path_prefixes says otherwise: the DLAMI's
# instance-store NVMe mount (kvfleet's default worker path is under it), /mnt and /data.
HOST_PATH_PREFIXES: Final = ("/opt/dlami/nvme", "/mnt", "/data")
# Namespaces Kubernetes owns (docs/reference/kubernetes.md: the kube- prefix is reserved for Kubernetes itself).
SYSTEM_NAMESPACE_PREFIX: Final = "kube-"
INSTANCE_TYPE = re.compile(r"ml\.[a-z0-9-]+\.[a-z0-9]+", _A)
MAX_PRICE_USD_PER_HOUR: Final = 10_000.0  # far above any SageMaker instance (ml.p5en.48xlarge is ~100 USD/h)
MAX_MODEL_PARAMS_B: Final = 10_000.0  # billions; far above any model a replica can hold
# Env names kvfleet itself sets in the worker (endpoint_spec.worker_env): an inventory `env` entry would override
# them silently (a PYTHONHASHSEED there would bypass settings.hash_seed).
RESERVED_ENV: Final = {
    C.ENV_REMOTE_URL: "the operator injects its own entry and kvfleet replaces it (a second entry would duplicate it)",
    C.ENV_HASHSEED: "kvfleet sets it from settings.hash_seed on every pod; set that instead",
    C.ENV_REMOTE_SERDE: "kvfleet sets it from settings.serde; set that instead",
    C.ENV_CHUNK_SIZE: "kvfleet sets it from settings.chunk_size; set that instead",
}
L2_MODES = ("patch", "kyverno")  # what a cluster runs
# `auto`, the default, is kyverno on a production cluster (manual patches do not survive operator re-renders in
# long-lived production; a Kyverno ClusterPolicy re-injects the mount), patch elsewhere.
L2_INJECTION_CHOICES = ("auto", *L2_MODES)
# An endpoint's workload and the routing advised for it: prefix-aware for multi-turn dialogue and shared system
# prompts, kv-aware for long documents, round-robin for stateless batch; RAG: any cache-aware strategy.
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
# How stage 4's patch mode changes a rendered Deployment (plan.choose_strategy decides `auto`).
UPDATE_STRATEGIES = ("auto", "rolling", "surge", "scale-to-zero")
UPDATE_STRATEGY_HELP: Final = ("auto (the default: rolling with 2 or more replicas, surge when a GPU is spare, "
                               "else scale-to-zero), rolling (maxSurge 0, maxUnavailable 1: N-1 keep serving), "
                               "surge (maxSurge 1, maxUnavailable 0: needs one spare GPU per endpoint), "
                               "scale-to-zero (the seed's sequence: an outage while the patch lasts)")
LMCACHE_LOG_FORMATS = ("0.3.9", "0.5.6")
DEFAULT_IMAGE: Final = "lmcache/vllm-openai:v0.3.9"
DEFAULT_MODEL_ID: Final = "Qwen/Qwen2-7B-Instruct"
DEFAULT_WORKER_HOST_PATH: Final = "/opt/dlami/nvme/curvine-data"
TOP_KEYS: Final = ("settings", "accounts", "lobs", "clusters", "endpoints", "prices")
NAMED: Final = ("accounts", "lobs", "clusters", "endpoints")  # the top-level collections of items with a `name`
ACCOUNT_ID = re.compile(r"[0-9]{12}", _A)
# IAM: arn:<partition>:iam::<account>:role/<path><name>; a path and name of [\w+=,.@-] (RoleName: 1-64, path: 512)
ROLE_ARN = re.compile(r"arn:aws(-cn|-us-gov)?:iam::([0-9]{12}):role/([\w+=,.@-]+/)*[\w+=,.@-]{1,64}", _A)
EXTERNAL_ID = re.compile(r"[\w+=,.@:/-]{2,1224}", _A)  # STS AssumeRole ExternalId
CONN_ID = re.compile(r"[A-Za-z0-9_.-]{1,250}", _A)  # an Airflow connection id

# ---- quoting values ---------------------------------------------------------------------------------------------


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
        return f"an integer of {value.bit_length()} bits" if value.bit_length() > 200 else repr(value)
    if isinstance(value, dict):
        return f"a mapping of {len(value)} keys"
    if isinstance(value, list | tuple | set | frozenset):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, bytes):
        return f"binary data of {len(value)} bytes"
    text = repr(value)  # dates, timestamps: short by construction
    return text if len(text) <= limit else text[:limit] + "…"


def key_text(name: Any) -> str:
    """A name used inside a problem's path: a short string."""
    text = name if isinstance(name, str) else show(name)
    return text if len(text) <= 64 else text[:64] + "…"


def type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", type(None): "null"}.get(type(value), f"a {type(value).__name__}")


def _fail(message: str) -> PydanticCustomError:
    return PydanticCustomError("kvfleet", "{detail}", {"detail": message})


def size_to_bytes(size: str) -> int:
    m = SIZE.fullmatch(size)
    if not m:
        raise ValueError(f"not a Kubernetes binary size: {size!r}")
    power = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4}[m.group(2)]
    return int(m.group(1)) * int(1024**power)


def safe_url(url: str) -> str:
    """A webhook URL as a message quotes it (``kvfleet.fleet.shared_rules.redact_url``: scheme, host and port)."""
    return show(redact_url(url) or NOT_A_URL)
