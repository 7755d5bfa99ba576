"""The fleet inventory's typed model (pydantic v2): the one place a key of the fleet file is declared.

``FleetFile`` mirrors the YAML a platform team writes (``settings``, ``lobs``, ``clusters``, ``endpoints``,
``prices``); ``clusters``, ``endpoints``, ``lobs`` and ``addons`` take a list of items with ``name`` or a mapping
keyed by name, and the model normalises both to the list. Every field carries its type, default, bounds and a
description: the JSON Schema (``kvfleet schema``) and the key table of docs/inventory.md
(``python -m kvfleet.fleet.inventory_doc``) are generated from it.

Validation reports *every* problem at once. A field's validator raises a ``PydanticCustomError`` whose text is the
kvfleet message (the value, what is allowed, the fix); pydantic collects them across the whole document, and
:func:`validate_document` maps each error's location to the YAML path a user reads (``clusters.ml-prod-1.
tiered_storage.memory_percent``, ``endpoints[3](chat).replicas``) and prefixes the file. Checks across fields and
objects (references, duplicates, GPU capacity, update strategies, model sizes, webhook targets, host paths under
their prefixes) are ``FleetFile``'s model validator; it runs even when fields failed, on the clusters and endpoints
that did validate, so a document's field errors and its cross-reference errors come in one list.

Called by :mod:`kvfleet.fleet.inventory` (the frozen value types the rest of kvfleet uses) and by the sandbox's
fleet reader. It imports nothing of kvfleet outside ``kvfleet.fleet``. Values are quoted through :func:`show`, cut
to ``SHOW_CHARS``; at most ``MAX_PROBLEMS`` problems are listed.
"""

from __future__ import annotations

import ipaddress
import math
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from kvfleet.fleet import constants as C
from kvfleet.fleet import hardware, models, yaml_safe
from kvfleet.fleet.repo_rule import REPO_URL

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
SNS_TOPIC_ARN = re.compile(r"arn:aws[a-z-]*:sns:[a-z]{2}(-[a-z]+)+-[0-9]:[0-9]{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?", _A)
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
TOP_KEYS: Final = ("settings", "lobs", "clusters", "endpoints", "prices")


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


# ---- field checks: each returns the value or raises the kvfleet message -----------------------------------------

Check = Callable[[str], str | None]  # a further check of a string: the problem, or None


def _text(max_len: int = 253, allow_empty: bool = False, check: Check | None = None) -> BeforeValidator:
    """A string field (a whole number is taken as its digits; a float or boolean is refused)."""

    def run(value: Any) -> str:
        if value is None:
            raise _fail("is null (YAML reads null, ~ or an empty value as no value); give it a value or remove the "
                        "key for the default")
        if isinstance(value, bool | float) or not isinstance(value, str | int) \
                or (isinstance(value, int) and value.bit_length() > 64):
            raise _fail(f"{show(value)} is {type_name(value)}, not a string; write a string")
        text = str(value)
        if text == "" and not allow_empty:
            raise _fail("is empty; give it a value or leave the field out for the default")
        if len(text) > max_len:
            raise _fail(f"{show(text)} is longer than {max_len} characters; shorten it")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
            raise _fail(f"{show(text)} contains a control character; remove it")
        problem = check(text) if check and text else None
        if problem:
            raise _fail(problem)
        return text

    return BeforeValidator(run)


def _int(lo: int, hi: int, why: str = "", odd: bool = False) -> BeforeValidator:
    def run(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(f"{show(value)} is not an integer; use a whole number in {lo}–{hi}")
        if value < lo:
            raise _fail(f"{show(value)} is below {lo}{why}; set it to {lo} or more")
        if value > hi:
            raise _fail(f"{show(value)} is above {hi}{why}; set it to {hi} or less")
        if odd and value % 2 == 0:
            raise _fail(f"{value} is even; Curvine's Raft masters must be odd (1, 3, 5, 7)")
        return value

    return BeforeValidator(run)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(f"{show(value)} is not a boolean; use true or false")
    return value


def _choice(allowed: Iterable[str], nullable: bool = False) -> BeforeValidator:
    options = tuple(allowed)

    def run(value: Any) -> Any:
        if value is None and nullable:
            return None
        if not isinstance(value, str) or value not in options:
            raise _fail(f"{show(value)} is not one of {', '.join(sorted(options))}; pick one of them")
        return value

    return BeforeValidator(run)


def _enum(options: Iterable[str], nullable: bool = False) -> Any:
    """The schema's enum of a choice field (beside its ``_choice`` validator)."""
    values: list[Any] = sorted(options) if isinstance(options, frozenset) else list(options)
    return Field(json_schema_extra={"enum": [*values, None] if nullable else values})


def _pattern(pattern: re.Pattern[str], message: str) -> Check:
    return lambda v: None if pattern.fullmatch(v) else f"{show(v)} {message}"


def _name_check(pattern: re.Pattern[str], what: str) -> Check:
    return _pattern(pattern, f"is not a valid {what}; use lowercase letters, digits and '-', starting and ending "
                             "with a letter or digit, at most 63 characters")


def _name(pattern: re.Pattern[str], what: str) -> BeforeValidator:
    """A name (of a cluster, LOB, endpoint, add-on): a non-empty string as written. YAML 1.1 reads an unquoted
    ``on``/``yes``/``no`` as a boolean, ``null``/``~`` as null and ``0x1F``/``017`` as numbers: such a mapping key is
    refused, never turned into a cluster called ``True`` or ``31``."""

    def run(value: Any) -> str:
        if not isinstance(value, str):
            raise _fail(f"{show(value)} is {type_name(value)}, not a name: YAML 1.1 reads on/off/yes/no as booleans, "
                        "null and ~ as null, 0x1F and 017 as numbers; a name is a string as written — quote it")
        if value == "":
            raise _fail("is empty; a name is required")
        problem = _name_check(pattern, what)(value)
        if problem:
            raise _fail(problem)
        return value

    return BeforeValidator(run)


def _no_dotdot(value: str, what: str) -> str | None:
    if ".." in value.split("/"):
        return (f"{show(value)} contains a '..' segment; {what} must not climb out of its directory — write the "
                "path without '..'")
    return None


def _helm_value(value: str) -> str | None:
    """A string that reaches ``helm --set``: refuse what helm's parser would interpret."""
    if value.startswith("-"):
        return f"{show(value)} begins with '-', which helm and kubectl read as a flag; remove the leading '-'"
    special = sorted({ch for ch in value if ch in HELM_SPECIAL})
    if special:
        return (f"{show(value)} contains {' '.join(repr(c) for c in special)}, which helm's --set parser interprets "
                "(a ',' splits the value, '=' '{' '}' '[' '\\' are syntax); use a value without them")
    return None


def _host_path(value: str) -> str | None:
    problem = _helm_value(value) or _no_dotdot(value, "a host path")
    if problem is None and (not HOST_PATH.fullmatch(value) or len(value) < 2):
        problem = (f"{show(value)} must be an absolute path on the node's NVMe of letters, digits, '.', '_', '-' and "
                   f"'/'; use e.g. {DEFAULT_WORKER_HOST_PATH}")
    return problem


def _fs_path(value: str) -> str | None:
    problem = _no_dotdot(value, "the Curvine path")
    if problem is None and not HOST_PATH.fullmatch(value):
        problem = (f"{show(value)} must be an absolute Curvine path of letters, digits, '.', '_', '-' and '/', such "
                   "as /l2cache")
    return problem


def _namespace(value: str) -> str | None:
    problem = _name_check(DNS_LABEL, "Kubernetes namespace")(value)
    if problem is None and value.startswith(SYSTEM_NAMESPACE_PREFIX):
        problem = (f"{show(value)} is a system namespace (kube-system, kube-public, kube-node-lease and every "
                   "kube- name belong to Kubernetes); kvfleet does not deploy there — use a namespace of your own, "
                   "e.g. retail or curvine")
    return problem


def _storage_class(value: str) -> str | None:
    if len(value) <= 253 and DNS_SUBDOMAIN.fullmatch(value):
        return None
    return (f"{show(value)} is not a valid StorageClass name (DNS-1123 subdomain: lowercase letters, digits, '-' and "
            "'.', starting and ending with a letter or digit, at most 253 characters); use e.g. ebs-sc")


def _size(value: str) -> str | None:
    return None if SIZE.fullmatch(value) else f"{show(value)} is not a size like 100Gi; use <number>Ki|Mi|Gi|Ti"


def _instance_type(value: str) -> str | None:
    if not value.startswith("ml."):
        return (f"{show(value)} does not start with 'ml.' (SageMaker instance types do, and the CRD's instanceType "
                f"pattern is ^ml\\..*); use e.g. ml.{key_text(value)}")
    if not INSTANCE_TYPE.fullmatch(value):
        return f"{show(value)} is not a SageMaker instance type such as ml.g5.4xlarge"
    return None


def _gpu_instance_type(value: str) -> str | None:
    problem = _instance_type(value)
    if problem is None and hardware.gpu_shape(value) is None:
        problem = (f"{show(value)} is not an instance type kvfleet knows the GPUs of, so GPU capacity cannot be "
                   f"checked; use one of {', '.join(hardware.known_types())}")
    return problem


def _chart(value: str) -> str | None:
    return None if CHART_NAME.fullmatch(value) else (
        f"{show(value)} is not a helm chart name (lowercase letters, digits and '-', starting and ending with a letter "
        "or digit); use e.g. curvine")


def _chart_version(value: str) -> str | None:
    return None if SEMVER.fullmatch(value) else (
        f"{show(value)} is not a SemVer 2 version, which helm requires; use e.g. {C.CURVINE_CHART_VERSION}")


def _addon_version(value: str) -> str | None:
    return None if value.startswith("v") and SEMVER.fullmatch(value[1:]) else (
        f"{show(value)} is not an EKS add-on version (v + SemVer, such as v1.0.0-eksbuild.1); use the version "
        "`aws eks describe-addon-versions` lists")


def _region(value: str) -> str | None:
    return None if REGION.fullmatch(value) else f"{show(value)} is not an AWS region such as us-east-1"


def _model_name(value: str) -> str | None:
    if MODEL_NAME.fullmatch(value):
        return None
    spec = models.lookup(value)
    valid = next((n for n in (spec.key, *spec.aliases) if MODEL_NAME.fullmatch(n)), None) if spec else None
    return (f"{show(value)} does not match the CRD's modelName pattern ^[a-zA-Z0-9](-*[a-zA-Z0-9]){{0,62}}; use "
            "letters, digits and '-' only" + (f", e.g. {valid} (the same catalogue model)" if valid else ""))


def _image(value: str) -> str | None:
    if len(value) <= 255 and IMAGE_REF.fullmatch(value):
        return None
    return (f"{show(value)} is not an image reference ([registry[:port]/]repository[:tag][@sha256:digest], lowercase "
            f"repository); use e.g. {DEFAULT_IMAGE}")


def _model_id(value: str) -> str | None:
    parts = value.split("/")
    if len(parts) > 2 or len(value) > 96 or "--" in value or ".." in value \
            or not all(HF_PART.fullmatch(p) for p in parts):
        return (f"{show(value)} is not a Hugging Face model id ([owner/]name of letters, digits, '-', '_' and '.', no "
                f"'--' or '..', at most 96 characters); use e.g. {DEFAULT_MODEL_ID}")
    return None


def _l2_url(value: str) -> str | None:
    if not value.startswith(f"fs://localhost:0{C.L2_MOUNT_PATH}/"):
        return (f"{show(value)} must be an fs:// URL under {C.L2_MOUNT_PATH}/ (LMCache's fs connector reads the "
                f"Curvine mount); use {C.L2_URL}")
    problem = _no_dotdot(value, "the L2 path")
    if problem is None and " " in value:
        problem = f"{show(value)} contains a space; use {C.L2_URL}"
    return problem


def _repo_url(value: str) -> str | None:
    # The one URL pattern, shared with the environment's chart-mirror overrides (kvfleet.fleet.repo_rule).
    return None if REPO_URL.fullmatch(value) else (
        f"{show(value)} is not a chart repository URL (https://host[:port]/path, no user name, query or spaces); "
        "use e.g. https://curvineio.github.io/helm-charts")


def _sns_arn(value: str) -> str | None:
    return None if SNS_TOPIC_ARN.fullmatch(value) else (
        f"{show(value)} is not an SNS topic ARN (arn:aws:sns:<region>:<12-digit account>:<topic name of letters, "
        "digits, '-', '_'>); use e.g. arn:aws:sns:us-east-1:123456789012:kvfleet-retail, or remove the key")


def safe_url(url: str) -> str:
    """A webhook URL as a message quotes it: scheme and host only (its path or query often is the secret)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return "(unparseable URL)"
    return show(f"{parts.scheme}://{host}/…" if parts.path not in ("", "/") or parts.query else url)


def _webhook(value: str) -> str | None:
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises ValueError on a port that is not a number in 0–65535
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # a bad port or bracketed host
        ok = False
    if not ok or any(ch.isspace() for ch in value):
        return (f"{safe_url(value)} is not an http(s) URL (http:// or https://, a host, no spaces); use e.g. "
                "https://hooks.example.com/kvfleet, or remove the key")
    return None


def _hash_seed(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() <= 64:
        value = str(value)
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 10 \
            or int(value) > HASH_SEED_MAX:
        raise _fail(f"{show(value)} is not an integer string in 0–{HASH_SEED_MAX}; PYTHONHASHSEED must be the same "
                    "fixed number on every pod (LMCache keys derive from Python hashes; 'random' gives each pod its "
                    "own keys and no cross-pod hit) — use \"0\"")
    return value


def _number(hi: float, what: str) -> BeforeValidator:
    def run(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or (isinstance(value, int) and value.bit_length() > 64):
            raise _fail(f"{show(value)} is {type_name(value)}, not a number; {what}")
        if not math.isfinite(value) or value <= 0 or value > hi:
            raise _fail(f"{show(value)} is not a number above 0 and at most {hi:g}; {what}")
        return float(value)

    return BeforeValidator(run)


def _price(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or (isinstance(value, int) and value.bit_length() > 64):
        raise _fail(f"{show(value)} is {type_name(value)}, not a price; write the USD per instance-hour as a number, "
                    "e.g. 1.861")
    if not math.isfinite(value) or value <= 0 or value > MAX_PRICE_USD_PER_HOUR:
        raise _fail(f"{show(value)} is not a price in USD per hour above 0 and at most {MAX_PRICE_USD_PER_HOUR:g}; "
                    "write the on-demand USD per instance-hour, e.g. 1.861")
    return float(value)


def _price_key(value: Any) -> str:
    if not isinstance(value, str) or not INSTANCE_TYPE.fullmatch(value):
        raise _fail(f"{show(value)} is not a SageMaker instance type (ml.<family>.<size>, such as ml.g6e.4xlarge); "
                    "use the instance type the price is for")
    return value


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or not ENV_NAME.fullmatch(value) or len(value) > 255:
        raise _fail(f"{show(value)} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most 255 "
                    "characters); rename it, e.g. with '_' instead of '-' or '.'")
    if value in RESERVED_ENV:
        raise _fail(f"must not be set in the inventory: {RESERVED_ENV[value]}; remove it")
    return value


def _env_value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or \
            (isinstance(value, int) and value.bit_length() > 64):
        raise _fail(f"{show(value)} is {type_name(value)}; an env value is a string — quote it, e.g. \"1\"")
    text = str(value)
    if len(text) > 4096 or "\0" in text:
        raise _fail(f"{show(text)} is longer than 4096 characters or contains NUL; shorten it")
    return text


def _json_problem(value: Any, path: str = "", depth: int = 0) -> str | None:
    """None when ``value`` is plain JSON (add-on configurationValues are sent as a JSON string), else the problem."""
    where = f" at {path}" if path else ""
    if depth > 20:
        return f"is nested more than 20 levels{where}; flatten it"
    if value is None or isinstance(value, bool | str):
        return None
    if isinstance(value, int):
        return None if value.bit_length() <= 64 else f"{show(value)}{where} is an integer beyond 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{show(value)}{where} is not a finite number"
    if isinstance(value, list):
        return next((p for i, v in enumerate(value) if (p := _json_problem(v, f"{path}[{i}]", depth + 1))), None)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{show(k)}{where} is a key that is not a string; use a string key"
            if p := _json_problem(v, f"{path}.{key_text(k)}" if path else key_text(k), depth + 1):
                return p
        return None
    return f"{show(value)}{where} is {type_name(value)}, which JSON cannot carry; use a string, number, boolean, " \
           "list or mapping"


def _configuration(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail(f"{show(value)} must be a mapping (it is sent as the add-on's JSON configurationValues)")
    problem = _json_problem(value)
    if problem:
        raise _fail(problem)
    return value


def _private_range(value: Any) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except (TypeError, ValueError):
        raise _fail(f"{show(value)} is not an IP network (CIDR) such as 10.20.0.0/16; write the private range the "
                    "webhook lives in") from None
    return str(value)


def _prefix_entry(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/") or not HOST_PATH.fullmatch(value) \
            or _unnormal(value.rstrip("/")) or len(value.rstrip("/")) < 2:
        raise _fail(f"{show(value)} is not an absolute directory below / of letters, digits, '.', '_', '-' and '/' "
                    "(no '..', '.' or empty segments); write e.g. /mnt/nvme")
    return value.rstrip("/")


def _unnormal(path: str) -> bool:
    """A path with an empty, '.' or '..' segment ('//', '/./', '/..'): one spelling of a directory only."""
    return any(part in ("", ".", "..") for part in path.split("/")[1:])


# ---- the model ----------------------------------------------------------------------------------------------------

Text = Annotated[str, _text()]
Bool = Annotated[bool, BeforeValidator(_bool)]


_REQUIRED: Any = ...


def _described(text: str, default: Any = _REQUIRED, default_factory: Callable[[], Any] | None = None) -> Any:
    """A field's description (the docs table and the schema read it) and its default."""
    if default_factory is not None:
        value = default_factory()
        shown = value if isinstance(value, list | dict) else None  # the schema and the docs show plain defaults
        return Field(default_factory=default_factory, description=text,
                     json_schema_extra=None if shown is None else {"default": shown})
    return Field(default, description=text)


class _Model(BaseModel):
    """A mapping of the inventory: unknown keys are refused, values are typed strictly (YAML's ``"3"`` is no 3)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=False)

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, data: Any) -> Any:
        if data is None:
            return {}  # `tiered_storage:` with nothing under it: every default
        if isinstance(data, BaseModel):
            return data
        if not isinstance(data, dict):
            raise _fail(f"expected a mapping, got {type_name(data)} {show(data)}")
        bad = next((k for k in data if not isinstance(k, str)), None)
        if bad is not None:
            raise _fail(f"the key {show(bad)} is {type_name(bad)}; field names are strings (YAML 1.1 reads on/off/"
                        "yes/no as booleans and 0x1F as a number) — quote it")
        return data


def named_items(raw: Any) -> Any:
    """The two spellings of a named collection, normalised to a list: a list of mappings with ``name`` stays as it
    is; a mapping keyed by name becomes a list whose items carry the key as ``name`` (an item's own ``name`` wins).
    Anything else is returned unchanged, for pydantic to refuse."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        out = []
        for key, body in raw.items():
            if body is None:
                body = {}
            out.append({**body, "name": body.get("name", key)} if isinstance(body, dict) else body)
        return out
    return raw


class Notify(_Model):
    sns_topic_arn: Annotated[str | None, _text(max_len=1024, allow_empty=True, check=_sns_arn)] = _described(
        "An SNS topic that also receives this LOB's notifications (arn:aws:sns:<region>:<account>:<topic>).",
        default=None)
    webhook_url: Annotated[str | None, _text(max_len=2048, allow_empty=True, check=_webhook)] = _described(
        "An http(s) URL that also receives this LOB's notifications (JSON POST). A host in a loopback, link-local "
        "or private range is refused unless settings.webhook_private_ranges holds it.", default=None)


class LobIn(_Model):
    name: Annotated[str, _name(DNS_LABEL, "line-of-business name")] = _described(
        "The line of business (DNS-1123 label); endpoints name it in `lob`.")
    description: Annotated[str, _text(max_len=1000, allow_empty=True)] = _described("Free text.", default="")
    remediate_drift: Bool = _described("Drift on this LOB's endpoints is fixed automatically.", default=False)
    notify: Notify = _described("Where this LOB's notifications also go (both keys optional).",
                                default_factory=Notify)


class SettingsIn(_Model):
    wave_size: Annotated[int, Field(ge=1, le=500), _int(1, 500)] = _described(
        "Endpoints per cluster per wave after the canary wave.", default=3)
    chunk_size: Annotated[int, Field(ge=16, le=4096), _int(16, 4096)] = _described(
        "LMCache chunk size in tokens: prompts shorter than one chunk never reach L2.", default=C.CHUNK_SIZE)
    l2_url: Annotated[str, _text(max_len=1024, check=_l2_url)] = _described(
        f"LMCache's remote URL: an fs:// URL under the Curvine mount {C.L2_MOUNT_PATH}/.", default=C.L2_URL)
    serde: Annotated[str, _choice(("naive",)), _enum(("naive",))] = _described(
        "LMCache's remote serde (cachegen has a bug under the fs connector).", default=C.L2_SERDE)
    hash_seed: Annotated[str, BeforeValidator(_hash_seed)] = _described(
        "PYTHONHASHSEED on every pod: one fixed integer string in 0–4294967295, so LMCache keys match across pods.",
        default=C.PYTHONHASHSEED)
    lmcache_log_format: Annotated[str, _choice(LMCACHE_LOG_FORMATS), _enum(LMCACHE_LOG_FORMATS)] = _described(
        "The LMCache release whose log lines verification reads.", default="0.3.9")
    operator_pause_threshold_minutes: Annotated[int, Field(ge=1, le=1440), _int(1, 1440)] = _described(
        "Drift reports an operator paused longer than this.", default=30)
    curvine_host_path_prefixes: Annotated[list[Annotated[str, BeforeValidator(_prefix_entry)]],
                                          Field(min_length=1, max_length=20)] = _described(
        "Directories a Curvine worker's host_path may live under (a node directory kvfleet mounts into pods).",
        default_factory=lambda: list(HOST_PATH_PREFIXES))
    webhook_private_ranges: Annotated[list[Annotated[str, BeforeValidator(_private_range)]],
                                      Field(max_length=50)] = _described(
        "Private, loopback or link-local networks (CIDR) a LOB's webhook_url may point into; none by default.",
        default_factory=list)


class TieredStorageIn(_Model):
    mode: Annotated[str, _choice(C.TIERED_MODES), _enum(C.TIERED_MODES)] = _described(
        "HyperPod managed tiered storage (the L1 CPU tier).", default="Enable")
    memory_percent: Annotated[int, Field(ge=C.MEMORY_PERCENT_MIN, le=C.MEMORY_PERCENT_MAX), _int(
        C.MEMORY_PERCENT_MIN, C.MEMORY_PERCENT_MAX, " (HyperPod accepts 20–100)")] = _described(
        "InstanceMemoryAllocationPercentage: host memory given to the L1 tier.", default=C.MEMORY_PERCENT_DEFAULT)


class GpuNodesIn(_Model):
    count: Annotated[int, Field(ge=1, le=10000), _int(1, 10000)] = _described("GPU nodes of the cluster.")
    instance_type: Annotated[str, _text(check=_gpu_instance_type)] = _described(
        "Their SageMaker instance type (kvfleet must know its GPUs).", default="ml.g6e.4xlarge")


class CurvineMasterIn(_Model):
    replicas: Annotated[int, Field(ge=1, le=7), _int(1, 7, odd=True)] = _described(
        "Curvine masters (Raft: odd).", default=1)
    storage_class: Annotated[str, _text(check=_storage_class)] = _described(
        "StorageClass of the masters' volumes.", default="ebs-sc")
    meta_size: Annotated[str, _text(check=_size)] = _described("Metadata volume size.", default="10Gi")
    journal_size: Annotated[str, _text(check=_size)] = _described("Journal volume size.", default="50Gi")


class CurvineWorkerIn(_Model):
    replicas: Annotated[int | None, Field(ge=1, le=1000), _int(1, 1000)] = _described(
        "Workers; by default one per GPU node (the cluster's gpu_nodes.count).", default=None)
    host_path: Annotated[str, _text(max_len=4096, check=_host_path)] = _described(
        "The node directory (NVMe) a worker stores blocks in; under settings.curvine_host_path_prefixes.",
        default=DEFAULT_WORKER_HOST_PATH)
    size: Annotated[str, _text(check=_size)] = _described("Capacity per worker (L2 = size × workers).",
                                                          default="100Gi")


class CurvineIn(_Model):
    chart: Annotated[str, _text(check=_chart)] = _described("Helm chart of Curvine.", default="curvine")
    csi_chart: Annotated[str, _text(check=_chart)] = _described("Helm chart of Curvine's CSI driver.",
                                                                default="curvine-csi")
    allow_insecure_repo: Bool = _described("Accept an http:// repo_url.", default=False)
    repo_url: Annotated[str, _text(max_len=2048, check=_repo_url)] = _described(
        "The charts' repository (https://).", default="https://curvineio.github.io/helm-charts")
    version: Annotated[str, _text(check=_chart_version)] = _described("Chart version (SemVer 2).",
                                                                      default=C.CURVINE_CHART_VERSION)
    namespace: Annotated[str, _text(check=_namespace)] = _described("Namespace of Curvine (not a kube- one).",
                                                                    default=C.CURVINE_NAMESPACE)
    master: CurvineMasterIn = _described("Curvine masters.", default_factory=CurvineMasterIn)
    worker: CurvineWorkerIn = _described("Curvine workers.", default_factory=CurvineWorkerIn)
    storage_class: Annotated[str, _text(check=_storage_class)] = _described(
        "The StorageClass pods mount L2 through.", default=C.CURVINE_STORAGE_CLASS)
    fs_path: Annotated[str, _text(max_len=4096, check=_fs_path)] = _described("Curvine path of the L2 cache.",
                                                                              default="/l2cache")
    scale_out: Annotated[str, _choice(("report", "auto")), _enum(("report", "auto"))] = _described(
        "report: the scheduled path only reports capacity; auto: it may add workers.", default="report")

    @field_validator("repo_url")
    @classmethod
    def _https_unless_allowed(cls, value: str, info: ValidationInfo) -> str:
        if value.startswith("http://") and not info.data.get("allow_insecure_repo", False):
            raise _fail(f"{show(value)} is plain http: charts fetched over it can be altered in transit; use "
                        "https://, or set allow_insecure_repo: true beside it for a repository you trust on your "
                        "network")
        return value


class AddonIn(_Model):
    name: Annotated[str, BeforeValidator(lambda v: _addon_name(v)), _enum(C.ADDON_ORDER)] = _described(
        "An EKS add-on kvfleet manages.")
    version: Annotated[str | None, _text(allow_empty=True, check=_addon_version)] = _described(
        "Its version (v + SemVer); none: whatever is installed.", default=None)
    configuration: Annotated[dict[str, Any] | None, BeforeValidator(_configuration)] = _described(
        "Its configurationValues (JSON).", default=None)


def _addon_name(value: Any) -> str:
    if not isinstance(value, str) or value not in C.ADDON_ORDER:
        raise _fail(f"unknown add-on {show(value)}; kvfleet manages {', '.join(C.ADDON_ORDER)}")
    return value


def _node_recovery(value: Any) -> Any:
    allowed = tuple(sorted(C.NODE_RECOVERY_VALUES))
    if value is None:
        raise _fail("is null (YAML reads null, ~ or an empty value as no value); write Automatic or None, or remove "
                    "the key to keep the cluster's live value")
    if not isinstance(value, str) or value not in allowed:
        raise _fail(f"{show(value)} is not one of {', '.join(allowed)} (SageMaker's ClusterNodeRecovery); set one of "
                    "them, or remove the key to keep the cluster's live value")
    return value


def _update_strategy(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or value not in UPDATE_STRATEGIES):
        raise _fail(f"{show(value)} is not an update strategy; allowed: {UPDATE_STRATEGY_HELP}. Set one of "
                    f"{', '.join(UPDATE_STRATEGIES)}, or remove the key for auto")
    return value


UpdateStrategy = Annotated[str | None, BeforeValidator(_update_strategy),
                           Field(json_schema_extra={"enum": [*UPDATE_STRATEGIES, None]})]


class ClusterIn(_Model):
    name: Annotated[str, _name(HYPERPOD_NAME, "HyperPod cluster name")] = _described(
        "The HyperPod cluster's name (letters, digits, '-', at most 63).")
    region: Annotated[str, _text(check=_region)] = _described("Its AWS region, e.g. us-east-1.")
    production: Bool = _described("A production cluster: `auto` L2 injection is kyverno, Curvine upgrades ask for "
                                  "approval.", default=False)
    tiered_storage: TieredStorageIn = _described("HyperPod managed tiered storage (L1).",
                                                 default_factory=TieredStorageIn)
    node_recovery: Annotated[str | None, BeforeValidator(_node_recovery), _enum(C.NODE_RECOVERY_VALUES)] = _described(
        "Declared: stage 1 reconciles the cluster to it; absent: the live value is kept.", default=None)
    gpu_nodes: GpuNodesIn = _described("The cluster's GPU nodes: {count, instance_type}.")
    l2_injection: Annotated[str, _choice(L2_INJECTION_CHOICES), _enum(L2_INJECTION_CHOICES)] = _described(
        "How the L2 mount reaches operator pods: auto (kyverno on production, else patch), patch, kyverno.",
        default="auto")
    update_strategy: UpdateStrategy = _described(
        f"How patch mode changes a Deployment, the default of its endpoints: {UPDATE_STRATEGY_HELP}.", default=None)
    ebs_storage_class: Annotated[str, _text(check=_storage_class)] = _described(
        "The EBS StorageClass of the cluster.", default="ebs-sc")
    curvine: CurvineIn = _described("Curvine (L2) on this cluster.", default_factory=CurvineIn)
    addons: list[AddonIn] = _described("EKS add-ons: a list with `name`, or a mapping keyed by name.",
                                       default_factory=list)

    @field_validator("addons", mode="before")
    @classmethod
    def _both_spellings(cls, value: Any) -> Any:
        return named_items(value)


class EndpointIn(_Model):
    name: Annotated[str, _name(DNS_LABEL, "Kubernetes object name")] = _described(
        "The endpoint (a Kubernetes object name and the SageMaker endpoint name).")
    namespace: Annotated[str, _text(check=_namespace)] = _described(
        "Its namespace (not a kube- one).", default="default")
    lob: Text = _described("Its line of business (declared in `lobs`).")
    cluster: Text = _described("Its cluster (declared in `clusters`).")
    model: Annotated[str, _text(check=_model_name)] = _described(
        "The CRD's modelName; a catalogue name sizes the model.")
    instance_type: Annotated[str, _text(check=_instance_type)] = _described(
        "SageMaker instance type of its replicas: the cluster's gpu_nodes.instance_type.")
    replicas: Annotated[int, Field(ge=0, le=1000), _int(0, 1000)] = _described("Replicas (1 GPU each).", default=2)
    routing: Annotated[str, _choice(C.ROUTING_STRATEGIES), _enum(C.ROUTING_STRATEGIES)] = _described(
        "Intelligent routing strategy.", default="prefixaware")
    l1: Bool = _described("LMCache's local CPU tier.", default=True)
    l2: Bool = _described("The shared Curvine tier.", default=True)
    image: Annotated[str, _text(max_len=512, check=_image)] = _described("The worker image.", default=DEFAULT_IMAGE)
    model_id: Annotated[str, _text(check=_model_id)] = _described("Hugging Face model id the operator downloads.",
                                                                  default=DEFAULT_MODEL_ID)
    env: Annotated[dict[Annotated[str, BeforeValidator(_env_name)], Annotated[str, BeforeValidator(_env_value)]],
                   Field(max_length=200)] = _described("Extra worker environment (string values).",
                                                       default_factory=dict)
    update_strategy: UpdateStrategy = _described("This endpoint's update strategy (wins over the cluster's).",
                                                 default=None)
    workload: Annotated[str | None, _choice(WORKLOADS, nullable=True), _enum(WORKLOADS, nullable=True)] = _described(
        "What the traffic is; validate warns when routing contradicts it.", default=None)
    model_params_b: Annotated[float | None, _number(MAX_MODEL_PARAMS_B, "write the parameter count in billions, "
                                                    "e.g. 7.62 for a 7B model")] = _described(
        "Parameters in billions (else the catalogue's).", default=None)
    dtype: Annotated[str | None, _choice(models.DTYPES, True), _enum(models.DTYPES, True)] = _described(
        "Weights' dtype, with model_params_b (else the catalogue's).", default=None)


class FleetFile(_Model):
    """The whole inventory file."""

    settings: SettingsIn = _described("Fleet-wide settings.", default_factory=SettingsIn)
    lobs: list[LobIn] = _described("Lines of business: a list with `name`, or a mapping keyed by name.",
                                   default_factory=list)
    clusters: list[ClusterIn] = _described("HyperPod clusters: a list with `name`, or a mapping keyed by name.",
                                           default_factory=list)
    endpoints: list[EndpointIn] = _described("Inference endpoints: a list with `name`, or a mapping keyed by name.",
                                             default_factory=list)
    prices: Annotated[dict[Annotated[str, BeforeValidator(_price_key)], Annotated[float, BeforeValidator(_price)]],
                      Field(max_length=500)] = _described("USD per instance-hour by instance type (optional).",
                                                          default_factory=dict)

    @field_validator("lobs", "clusters", "endpoints", mode="before")
    @classmethod
    def _both_spellings(cls, value: Any) -> Any:
        return named_items(value)

    @model_validator(mode="wrap")
    @classmethod
    def _cross_checks(cls, data: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> FleetFile:
        """Field errors and the checks across objects, in one ValidationError (see the module docstring)."""
        try:
            fleet: FleetFile | None = handler(data)
            errors: list[Any] = []
        except ValidationError as exc:
            fleet, errors = None, list(exc.errors())
        found = Found()
        if isinstance(data, dict):
            context = info.context if isinstance(info.context, dict) else {}
            found = cross_checks(normalised(data), fleet, str(context.get("source", "fleet.yaml")))
            context.setdefault("warnings", []).extend(found.warnings)
        if errors or found.problems:
            raise ValidationError.from_exception_data(cls.__name__, [_again(e) for e in errors] + [
                InitErrorDetails(type=_fail(msg), loc=loc, input=None) for loc, msg in found.problems])
        assert fleet is not None
        return fleet


def _again(error: Any) -> InitErrorDetails:
    """A collected error, carried into the combined ValidationError unchanged in substance."""
    ctx = {k: v for k, v in (error.get("ctx") or {}).items() if k != "error"}
    if error["type"] != "kvfleet":
        ctx["detail"] = error["msg"]
    return InitErrorDetails(type=PydanticCustomError(error["type"], "{detail}", ctx), loc=error["loc"],
                            input=error.get("input"))


def normalised(data: dict[str, Any]) -> dict[str, Any]:
    """The document with its named collections as lists (what the paths of messages are read against)."""
    out = {k: named_items(v) if k in ("lobs", "clusters", "endpoints") else v for k, v in data.items()}
    if isinstance(out.get("clusters"), list):
        out["clusters"] = [{**c, "addons": named_items(c["addons"])} if isinstance(c, dict) and "addons" in c else c
                           for c in out["clusters"]]
    return out


Loc = tuple[str | int, ...]


# ---- from pydantic's errors to kvfleet's messages -------------------------------------------------------------


@dataclass
class Found:
    """What the cross checks found: (location, message) problems and full warning lines."""

    problems: list[tuple[tuple[str | int, ...], str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class FleetProblems(ValueError):
    """A fleet document that is not a valid inventory; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Validated:
    fleet: FleetFile
    warnings: tuple[str, ...]


MISSING: Final = {
    "gpu_nodes": "is required: declare {count: N, instance_type: ml.…}",
    "count": "is required; add a whole number in 1–10000",
}


def _item_label(kind: str, index: int, items: Any) -> str:
    item = items[index] if isinstance(items, list) and 0 <= index < len(items) else None
    name = item.get("name") if isinstance(item, dict) else None
    if kind == "endpoints":
        return f"endpoints[{index}]({key_text(name)})" if isinstance(name, str) and name else f"endpoints[{index}]"
    return f"{kind}.{key_text(name)}" if isinstance(name, str) and name else f"{kind}[{index}]"


def yaml_path(loc: tuple[str | int, ...], data: Any) -> str:
    """The path a user reads for a pydantic location: names for list items, ``[key]`` segments dropped."""
    out = ""
    node = data
    i = 0
    while i < len(loc):
        seg = loc[i]
        items = node.get(seg) if isinstance(node, dict) and isinstance(seg, str) else None
        if isinstance(seg, str) and seg in ("lobs", "clusters", "endpoints", "addons") and i + 1 < len(loc) \
                and isinstance(loc[i + 1], int) and isinstance(items, list):
            index = int(loc[i + 1])
            label = _item_label(seg, index, items)
            out = f"{out}.{label}" if out else label
            node = items[index] if 0 <= index < len(items) else None
            i += 2
            continue
        if seg == "[key]":
            i += 1
            continue
        text = f"[{seg}]" if isinstance(seg, int) else key_text(seg)
        out = f"{out}{text}" if text.startswith("[") or not out else f"{out}.{text}"
        node = node.get(seg) if isinstance(node, dict) else node[seg] if isinstance(node, list) and \
            isinstance(seg, int) and 0 <= seg < len(node) else None
        i += 1
    return out


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model class a location's mapping is validated by (for the allowed keys of an unknown one)."""
    cls: Any = FleetFile
    for seg in loc:
        if isinstance(seg, int):
            continue
        fields = getattr(cls, "model_fields", None)
        if not fields or seg not in fields:
            return None
        cls = _inner_model(fields[seg].annotation)
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _message(error: Any) -> str:
    kind, loc, value = error["type"], tuple(error["loc"]), error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "kvfleet":
        return str(ctx["detail"])
    if kind == "missing":
        return MISSING.get(str(loc[-1]) if loc else "", "is required; add it")
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        allowed = ", ".join(sorted(model.model_fields)) if model else "see docs/inventory.md"
        return f"unknown field; allowed fields: {allowed}"
    if kind == "too_long":
        return f"has {ctx.get('actual_length')} entries; at most {ctx.get('max_length')}"
    if kind in ("list_type", "dict_type"):
        want = "a list or mapping" if loc and loc[-1] in ("lobs", "clusters", "endpoints", "addons") else \
            "a list" if kind == "list_type" else "a mapping"
        return f"expected {want}, got {type_name(value)} {show(value)}"
    return f"{show(value)}: {error['msg']}"


def _where(loc: Loc) -> Loc:
    """An unknown add-on is the add-on's own problem (``clusters.c1.addons.nope``), not its name field's."""
    return loc[:-1] if len(loc) >= 3 and loc[-1] == "name" and loc[-3] == "addons" else loc


def _fleet_document(raw: Any, source: str) -> dict[str, Any]:
    """The top level: a mapping with at least one inventory key. A file that is not one is refused without quoting
    any of its content (``--fleet`` given the wrong file must not print what that file holds)."""
    why = ""
    if raw is None:
        return {}  # an empty document: an inventory that declares nothing (refused below: no cluster)
    if not isinstance(raw, dict):
        why = f"its top level is {type_name(raw)}, not a mapping"
    elif raw and not any(k in TOP_KEYS for k in raw if isinstance(k, str)):
        why = f"none of its {len(raw)} top-level keys is {', '.join(TOP_KEYS[:-1])} or {TOP_KEYS[-1]}"
    if why:
        raise FleetProblems([f"{source}: (top level): not a kvfleet inventory: {why}; --fleet takes the fleet's "
                             "YAML file (see fleet.example.yaml and docs/inventory.md)"])
    return dict(raw)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error without the document's text: PyYAML's message quotes the offending line and its tokens."""
    if isinstance(exc, yaml_safe.UnsafeYaml):
        return str(exc)[:400]
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = re.sub(r"'[^']*'|\"[^\"]*\"", "(…)", str(getattr(exc, "problem", None) or type(exc).__name__))
    context = re.sub(r"'[^']*'|\"[^\"]*\"", "(…)", str(getattr(exc, "context", None) or ""))
    return f"{problem}{where}" + (f" ({context})" if context else "") + "; fix the YAML syntax there"


def load_document(text: str, source: str) -> Any:
    """The YAML document, through the bounded loader (size, aliases, depth, duplicate keys)."""
    if len(text) > MAX_INVENTORY_BYTES:
        raise FleetProblems([f"{source}: the inventory has {len(text)} characters, more than the "
                             f"{MAX_INVENTORY_BYTES} allowed; split the fleet into several files"])
    try:
        return yaml_safe.load(text)
    except yaml.YAMLError as exc:
        raise FleetProblems([f"{source}: not valid YAML: {_yaml_problem(exc)}"]) from None
    except (ValueError, OverflowError, RecursionError, MemoryError) as exc:
        # a constructor's own failure (an integer of more than 4300 digits, a bad timestamp): no document text
        raise FleetProblems([f"{source}: not valid YAML: a value YAML cannot build ({type(exc).__name__})"]) from None


def validate_document(raw: Any, source: str = "fleet.yaml") -> Validated:
    """Validate a loaded YAML document against :class:`FleetFile`; :class:`FleetProblems` lists every problem."""
    data = normalised(_fleet_document(raw, source))
    context: dict[str, Any] = {"source": source, "warnings": []}
    try:
        fleet = FleetFile.model_validate(data, context=context)
    except ValidationError as exc:
        lines = [f"{source}: {yaml_path(_where(tuple(e['loc'])), data) or '(top level)'}: {_message(e)}"
                 for e in exc.errors()]
        shown = lines[:MAX_PROBLEMS]
        if len(lines) > MAX_PROBLEMS:
            shown.append(f"{source}: … and {len(lines) - MAX_PROBLEMS} more problems")
        raise FleetProblems(shown) from None
    return Validated(fleet, tuple(context["warnings"]))


def validate_text(text: str, source: str = "fleet.yaml") -> Validated:
    """Load and validate an inventory text; :class:`FleetProblems` lists every problem."""
    return validate_document(load_document(text, source), source)


def json_schema() -> dict[str, Any]:
    """The inventory's JSON Schema (draft 2020-12), generated from :class:`FleetFile`."""
    schema: dict[str, Any] = FleetFile.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "kvfleet fleet inventory"
    return _named_collections(schema)


def _named_collections(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema of `lobs`, `clusters`, `endpoints` and `addons` takes both spellings: the list, or a mapping keyed
    by name whose items may leave `name` out."""
    defs = schema.get("$defs", {})
    targets = [(schema, k) for k in ("lobs", "clusters", "endpoints")]
    targets += [(defs["ClusterIn"], "addons")] if "ClusterIn" in defs else []
    for owner, key in targets:
        prop = owner["properties"][key]
        ref = prop["items"]["$ref"]
        name = ref.rsplit("/", 1)[-1]
        keyed = {k: v for k, v in defs[name].items() if k != "required"}
        keyed["required"] = [r for r in defs[name].get("required", []) if r != "name"]
        defs[f"{name}Keyed"] = keyed
        owner["properties"][key] = {
            "description": prop.get("description", ""),
            "anyOf": [{"type": "array", "items": {"$ref": ref}},
                      {"type": "object", "additionalProperties": {"$ref": f"#/$defs/{name}Keyed"}},
                      {"type": "null"}]}
    return schema


# ---- the checks across fields and objects (FleetFile's model validator) -----------------------------------------


def resolve_l2_injection(asked: str, production: bool) -> tuple[str, str]:
    """(the L2 injection a cluster runs, why): `auto` is kyverno on a production cluster, patch elsewhere."""
    if asked == "auto":
        if production:
            return "kyverno", ("auto: production cluster → kyverno (the sources: a manual patch does not survive "
                               "operator re-renders in long-lived production)")
        return "patch", "auto: not a production cluster → patch (the seed's patch sequence, batched per wave)"
    return asked, f"asked (l2_injection: {asked})"


def gpu_budget(instance_type: str, node_count: int, l2_mode: str, replicas: Iterable[int]) -> tuple[int, int]:
    """(GPUs the replicas need, GPUs the nodes have), the headroom of the cluster's L2 mode included."""
    shape = hardware.gpu_shape(instance_type)
    available = node_count * (shape.gpus if shape else 0)
    needed = sum(r * hardware.GPUS_PER_REPLICA for r in replicas)
    # Surge headroom of the change strategy goes here (0 for both today: see hardware.PATCH_HEADROOM_GPUS).
    return needed + hardware.PATCH_HEADROOM_GPUS.get(l2_mode, 0), available


def replica_fit(instance_type: str, params_b: float | None, dtype: str | None) -> models.Fit | None:
    """A model against the GPU memory of one replica, or None when either is unknown."""
    shape = hardware.gpu_shape(instance_type)
    if shape is None or params_b is None or dtype is None:
        return None
    return models.fit(params_b, dtype, shape, hardware.GPUS_PER_REPLICA)


@dataclass(frozen=True)
class ModelSize:
    params_b: float | None
    dtype: str | None
    catalogue_model: str | None


def model_size(ep: EndpointIn) -> ModelSize:
    """The served model's size: explicit `model_params_b` (+ `dtype`), else the catalogue row of `model`, else of
    `model_id` (what the operator downloads); unknown when none of them says."""
    spec = models.lookup(ep.model) or models.lookup(ep.model_id)
    if ep.model_params_b is not None:
        return ModelSize(ep.model_params_b, ep.dtype or (spec.dtype if spec else None), None)
    if spec is not None:
        return ModelSize(spec.params_b, ep.dtype or spec.dtype, spec.key)
    return ModelSize(None, ep.dtype, None)


def _as_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        # What resolvers also take as IPv4: 2130706433, 0x7f.1, 127.1 (inet_aton's forms)
        if not re.fullmatch(r"[0-9a-fA-FxX.]+", host, re.ASCII) or not any(c.isdigit() for c in host):
            return None
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(ip, ipaddress.IPv6Address):
        return _embedded_v4(ip) or ip
    return ip


_V4_IN_V6: Final = (ipaddress.ip_network("::/96"), ipaddress.ip_network("64:ff9b::/96"))  # compatible, NAT64


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped ::ffff:a.b.c.d, compatible ::a.b.c.d, NAT64 64:ff9b::a.b.c.d,
    6to4 2002:aabb:ccdd::), which the network may route to that IPv4 address."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in net for net in _V4_IN_V6) and int(ip) > 1:  # :: and ::1 stay themselves
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def webhook_target_problem(url: str, allowed: Iterable[str]) -> str | None:
    """A webhook into the instance metadata service, a link-local, loopback or private address is refused: kvfleet
    posts from the Airflow workers, inside the network. A private range the inventory lists is allowed."""
    try:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError:
        return None  # refused already as not an http(s) URL
    if not host.isascii():  # full-width or circled digits, ideographic dots: resolvers fold them to an address
        return (f"{safe_url(url)} has a host name that is not ASCII: write it as ASCII (an IDN in its xn-- form), "
                "so that the address it names can be checked")
    ip = ipaddress.ip_address("127.0.0.1") if host == "localhost" or host.endswith(".localhost") else _as_ip(host)
    if ip is None or (ip.is_global and not ip.is_multicast):
        return None
    if any(ip in ipaddress.ip_network(net, strict=False) for net in allowed):
        return None
    what = ("the instance metadata service" if str(ip) == "169.254.169.254" else "a link-local address"
            if ip.is_link_local else "a loopback address" if ip.is_loopback else "a private or reserved address")
    return (f"{safe_url(url)} points at {what} ({ip}): the Airflow workers would post the fleet's notifications "
            "inside their own network; use a public endpoint, or list its private range (CIDR) in "
            "settings.webhook_private_ranges")


# Text fields the cross checks may read as written when they failed (a reference, a name, a type compared as text);
# a required one is validated with its stand-in, then given back as written (model_copy does not validate).
_STAND_INS: Final[dict[str, str]] = {"name": "x", "lob": "x", "cluster": "x", "model": "x", "region": "us-east-1",
                                     "instance_type": "ml.g5.4xlarge", "namespace": "x", "model_id": "x/x",
                                     "image": "x"}
_DROP: Final = object()


def _replacement(model: type[_Model], key: str, value: Any) -> tuple[Any, Any] | None:
    """For a field that failed: (what to validate with, or _DROP for its default; what to put back afterwards, or
    _DROP); None when the object cannot be built without it."""
    info = model.model_fields[key]
    inner = _inner_model(info.annotation)
    sub = _validated(inner, value) if inner is not None and isinstance(value, dict) else None
    if sub is not None:  # a sub-mapping with a bad field: the rest of it still counts
        return sub, _DROP
    written = value if key in _STAND_INS and isinstance(value, str) else _DROP
    if info.is_required():
        return None if written is _DROP else (_STAND_INS[key], written)
    return _DROP, written


def _validated(model: type[_Model], raw: Any) -> Any:
    """``raw`` validated, or, when some of its fields failed, the object without them (their defaults; a text field
    the cross checks read, as written); None when that cannot be built (the failed fields are reported anyway)."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
    bad = {e["loc"][0] for e in errors if e["loc"]}
    if not isinstance(raw, dict) or any(not e["loc"] for e in errors) or \
            not all(isinstance(b, str) and b in model.model_fields for b in bad):
        return None
    fixed = {k: v for k, v in raw.items() if k not in bad}
    as_written = {}
    for key in map(str, bad):
        replacement = _replacement(model, key, raw.get(key))
        if replacement is None:
            return None
        if replacement[0] is not _DROP:
            fixed[key] = replacement[0]
        if replacement[1] is not _DROP:
            as_written[key] = replacement[1]
    try:
        return model.model_validate(fixed).model_copy(update=as_written)
    except ValidationError:
        return None


class _Checks:
    """One pass over the normalised document and what of it validated; collects problems and warnings."""

    def __init__(self, data: dict[str, Any], fleet: FleetFile | None, source: str) -> None:
        self.data, self.source = data, source
        self.found = Found()
        self.raw_lobs, self.raw_clusters, self.raw_eps = (_listed(data, k) for k in ("lobs", "clusters", "endpoints"))
        if fleet is not None:
            self.settings: SettingsIn | None = fleet.settings
            self.lobs: list[LobIn | None] = list(fleet.lobs)
            self.clusters: list[ClusterIn | None] = list(fleet.clusters)
            self.eps: list[EndpointIn | None] = list(fleet.endpoints)
        else:  # field errors elsewhere: check what did validate
            self.settings = _validated(SettingsIn, data.get("settings"))
            self.lobs = [_validated(LobIn, x) for x in self.raw_lobs]
            self.clusters = [_validated(ClusterIn, x) for x in self.raw_clusters]
            self.eps = [_validated(EndpointIn, x) for x in self.raw_eps]

    def problem(self, loc: Loc, msg: str) -> None:
        self.found.problems.append((loc, msg))

    def warn(self, loc: Loc, msg: str) -> None:
        self.found.warnings.append(f"{self.source}: {yaml_path(loc, self.data)}: {msg}")

    def label(self, i: int) -> str:
        return yaml_path(("endpoints", i), self.data)


def _listed(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return value if isinstance(value, list) else []


def _raw_str(body: Any, key: str, default: str = "") -> str:
    value = body.get(key, default) if isinstance(body, dict) else default
    return value if isinstance(value, str) else str(value) if isinstance(value, int) and not isinstance(
        value, bool) and value.bit_length() <= 64 else ""


def _unique_names(k: _Checks, items: list[Any], loc: Loc, what: str) -> None:
    seen: dict[str, int] = {}
    for i, body in enumerate(items):
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            continue
        if name in seen:
            where = yaml_path((*loc, f"[{seen[name]}]"), k.data)
            k.problem((*loc, f"[{i}]"), f"duplicate {what} {show(name)} (also at {where}); each name may appear "
                      "once — merge the two entries or rename one")
        else:
            seen[name] = i


def _cluster_checks(k: _Checks) -> None:
    prefixes = k.settings.curvine_host_path_prefixes if k.settings else None
    for ci, cl in enumerate(k.clusters):
        body = k.raw_clusters[ci]
        if isinstance(body, dict) and isinstance(body.get("addons"), list):
            _unique_names(k, body["addons"], ("clusters", ci, "addons"), "add-on")
        if cl is None:
            continue
        if cl.l2_injection == "patch" and cl.production:
            k.warn(("clusters", ci, "l2_injection"), "patch on a production cluster: the operator re-renders its "
                   "Deployments (a CR edit, an operator upgrade, a deleted Deployment) and each re-render drops the "
                   "patch until drift notices; the sources recommend a mutating webhook or a Kyverno ClusterPolicy "
                   "for long-lived production. Set l2_injection: kyverno, or remove the key (auto: kyverno on "
                   "production clusters).")
        _worker_count(k, ci, cl)
        hp = cl.curvine.worker.host_path
        if _unnormal(hp.rstrip("/")) and hp != "/":
            k.problem(("clusters", ci, "curvine", "worker", "host_path"), f"{show(hp)} has an empty, '.' or '..' "
                      f"segment; write the directory once, plainly, e.g. {DEFAULT_WORKER_HOST_PATH}")
        elif prefixes and not any(hp.rstrip("/").startswith(p + "/") for p in prefixes):
            k.problem(("clusters", ci, "curvine", "worker", "host_path"), f"{show(hp)} is not a directory below "
                      f"{', '.join(prefixes)} (settings.curvine_host_path_prefixes): a worker mounts this node "
                      f"directory, so it must be one kept for data; use e.g. {DEFAULT_WORKER_HOST_PATH}, or add its "
                      "parent to settings.curvine_host_path_prefixes")


def _worker_count(k: _Checks, ci: int, cl: ClusterIn) -> None:
    declared, nodes, w = cl.curvine.worker.replicas, cl.gpu_nodes.count, cl.curvine.worker
    if declared is None or declared == nodes:
        return
    text = (f"is below the cluster's {nodes} GPU nodes: pods on the {nodes - declared} nodes without a worker "
            f"write their KV blocks over the network, and L2 holds {w.size} × {declared} instead of × {nodes} (the "
            "sources put a worker on every GPU node)" if declared < nodes else
            f"is above the cluster's {nodes} GPU nodes: with one worker per node the extra {declared - nodes} would "
            "stay Pending")
    k.warn(("clusters", ci, "curvine", "worker", "replicas"), f"{declared} {text}. Remove worker.replicas to follow "
           f"the GPU node count, or set it to {nodes}.")


def _lob_checks(k: _Checks) -> None:
    _unique_names(k, k.raw_lobs, ("lobs",), "line of business")
    allowed = k.settings.webhook_private_ranges if k.settings else None
    for li, lob in enumerate(k.lobs):
        if lob is None or allowed is None or not lob.notify.webhook_url:
            continue
        problem = webhook_target_problem(lob.notify.webhook_url, allowed)
        if problem:
            k.problem(("lobs", li, "notify", "webhook_url"), problem)


def _endpoint_refs(k: _Checks) -> list[int]:
    """References, duplicates and endpoint names, read from the raw document (so an endpoint with a bad field is
    still checked); the indexes of the endpoints that are not duplicates."""
    clusters = sorted({n for b in k.raw_clusters if isinstance(b, dict) and isinstance(n := b.get("name"), str)})
    lobs = sorted({n for b in k.raw_lobs if isinstance(b, dict) and isinstance(n := b.get("name"), str)})
    seen: dict[tuple[str, str, str], int] = {}
    named: dict[tuple[str, str], tuple[int, str]] = {}
    unique = []
    for i, body in enumerate(k.raw_eps):
        cluster, lob, name = _raw_str(body, "cluster"), _raw_str(body, "lob"), _raw_str(body, "name")
        namespace = _raw_str(body, "namespace", "default")
        if cluster and cluster not in clusters:
            k.problem(("endpoints", i, "cluster"), f"{show(cluster)} is not a declared cluster; declared: "
                      f"{', '.join(clusters[:20]) or 'none'}")
        if lob and lob not in lobs:
            k.problem(("endpoints", i, "lob"), f"{show(lob)} is not a declared line of business; declared: "
                      f"{', '.join(lobs[:20]) or 'none'}")
        key = (cluster, namespace, name)
        if key in seen:
            k.problem(("endpoints", f"[{i}]({key_text(name)})" if name else f"[{i}]"),
                      f"duplicate endpoint {namespace}/{name} on cluster {cluster} (also at {k.label(seen[key])}); "
                      "rename one or move it to another namespace")
            continue
        seen[key] = i
        unique.append(i)
        other = named.get((cluster, name))
        if other is not None and name:
            # The CR's spec.endpointName is the name, and names a SageMaker endpoint: unique per AWS account and
            # region (docs/reference/hyperpod.md), and one cluster is one account and region.
            k.problem(("endpoints", i, "name"), f"{show(name)} is also the endpoint at {k.label(other[0])} (namespace "
                      f"{other[1]}) on cluster {cluster}; kvfleet sets the CR's endpointName to the name, and that "
                      "names a SageMaker endpoint, unique per AWS account and region (the CRD: \"Name of a SageMaker "
                      "endpoint to be created\"), so two namespaces cannot both use it; rename one")
        else:
            named[(cluster, name)] = (i, namespace)
    return unique


def _endpoint_checks(k: _Checks, unique: list[int]) -> None:
    by_name = {c.name: c for c in k.clusters if c is not None}
    for i in unique:
        ep = k.eps[i] if i < len(k.eps) else None
        if ep is None:
            continue
        cl = by_name.get(ep.cluster)
        if cl and ep.instance_type != cl.gpu_nodes.instance_type and ep.instance_type.startswith("ml.") \
                and cl.gpu_nodes.instance_type.startswith("ml."):
            want = cl.gpu_nodes.instance_type
            k.problem(("endpoints", i, "instance_type"), f"{show(ep.instance_type)} but cluster {ep.cluster}'s GPU "
                      f"nodes are {want} (gpu_nodes.instance_type): the operator schedules a replica only on nodes "
                      f"of its instanceType, so none would start; use {want}")
        _model_checks(k, i, ep, k.raw_eps[i])
        _routing_advice(k, i, ep)
        if cl and ep.l2 and cl.gpu_nodes.count < 2:
            # A warning: L2 still serves one pod's restarts, but cross-node reuse cannot exist.
            k.warn(("endpoints", i, "l2"), f"true on cluster {ep.cluster} with {cl.gpu_nodes.count} GPU node; "
                   "cross-node reuse needs at least 2 nodes, so verification will be 'unverifiable'. Add a node or "
                   "set l2: false.")
        asked = ep.update_strategy or (cl.update_strategy if cl else None) or "auto"
        if asked == "rolling" and ep.replicas < 2:
            where = "" if ep.update_strategy else f" (from clusters.{ep.cluster}.update_strategy)"
            k.problem(("endpoints", i, "update_strategy"), f"rolling{where} with replicas {ep.replicas}: a rolling "
                      "update keeps N-1 replicas serving, which is 0 here; set update_strategy: surge (needs a "
                      "spare GPU) or scale-to-zero on this endpoint, or raise replicas to 2")


def _model_checks(k: _Checks, i: int, ep: EndpointIn, body: Any) -> None:
    by_name, by_id = models.lookup(ep.model), models.lookup(ep.model_id)
    loc: Loc = ("endpoints", i, "model")
    if by_name and by_id and by_name is not by_id and ep.model_params_b is None:
        id_where = "model_id" if isinstance(body, dict) and "model_id" in body else "model_id (the default)"
        k.warn(loc, f"{show(ep.model)} is the catalogue's {by_name.hf_id}, but {id_where} {show(ep.model_id)} is what "
               f"the operator downloads ({by_id.hf_id}); the GPU memory check uses {by_name.key}. Set model_id: "
               f"{by_name.hf_id} if that is the model served.")
    size = model_size(ep)
    if ep.model_params_b is not None and size.dtype is None:
        k.problem(("endpoints", i, "dtype"), f"is required with model_params_b (the bytes per parameter); add one of "
                  f"{', '.join(models.DTYPES)}, e.g. dtype: bf16")
        return
    if size.params_b is None:
        k.warn(loc, f"{show(ep.model)} (model_id {show(ep.model_id)}) is not in kvfleet's model catalogue "
               f"({', '.join(models.known_names())}), so whether it fits the GPUs of one replica is not checked; add "
               "model_params_b (billions) and dtype to the endpoint.")
        return
    f = replica_fit(ep.instance_type, size.params_b, size.dtype)
    if f is None or f.fits:
        return
    what = (f"{size.catalogue_model} ({size.params_b:g} B parameters, {size.dtype}, catalogue)" if size.catalogue_model
            else f"a {size.params_b:g} B-parameter model in {size.dtype}")
    bigger = [t for t in hardware.known_types() if (s := hardware.gpu_shape(t)) and
              models.fit(size.params_b, size.dtype or "bf16", s, hardware.GPUS_PER_REPLICA).fits]
    families = sorted({t.split(".")[1] for t in bigger})
    k.problem(("endpoints", i, "model_params_b" if size.catalogue_model is None else "model"),
              f"{what} needs {f.weights_gib:.1f} GiB ({f.weights_gib * models.GIB / 1e9:.1f} GB) of GPU memory for "
              f"its weights alone, but one replica on {ep.instance_type} gets {f.describe()} and vLLM uses "
              f"{models.VLLM_GPU_MEMORY_UTILIZATION:g} of it ({f.usable_gib:.1f} GiB), leaving no room for the KV "
              f"cache (kvfleet asks {hardware.GPUS_PER_REPLICA} GPU per replica); use an instance type whose GPU "
              "holds it" + (f" ({', '.join(families)})" if families else "") + ", a smaller model, or a smaller dtype")


def _routing_advice(k: _Checks, i: int, ep: EndpointIn) -> None:
    """Warn when the routing strategy contradicts what the sources advise for the endpoint's workload."""
    if ep.workload is None or ep.routing in WORKLOAD_ROUTING[ep.workload]:
        return
    advised = WORKLOAD_ROUTING[ep.workload]
    k.warn(("endpoints", i, "routing"), f"{ep.routing} for workload {ep.workload}; the sources advise "
           f"{WORKLOAD_WHY[ep.workload]}. Set routing: {advised[0]}"
           + (f" (or {' or '.join(advised[1:])})" if len(advised) > 1 else "")
           + ", or change workload if it does not describe the traffic. Note that the operator refuses a change of "
           "routing on an existing endpoint (intelligentRoutingSpec: \"Adding this configuration to an existing "
           "deployment will be rejected\").")


def _capacity_checks(k: _Checks, unique: list[int]) -> None:
    eps = [ep for i in unique if i < len(k.eps) and (ep := k.eps[i]) is not None]
    for ci, cl in enumerate(k.clusters):
        shape = hardware.gpu_shape(cl.gpu_nodes.instance_type) if cl else None
        if cl is None or shape is None:
            continue
        mine = [e for e in eps if e.cluster == cl.name]
        mode, _ = resolve_l2_injection(cl.l2_injection, cl.production)
        needed, available = gpu_budget(cl.gpu_nodes.instance_type, cl.gpu_nodes.count, mode,
                                       [e.replicas for e in mine])
        if needed <= available:
            continue
        top = sorted(mine, key=lambda e: -e.replicas)[:5]
        detail = ", ".join(f"{e.namespace}/{e.name} {e.replicas}" for e in top)
        k.problem(("clusters", ci, "gpu_nodes"), f"GPU overcommit: the endpoints need {needed} GPUs ({len(mine)} "
                  f"endpoints, replicas × {hardware.GPUS_PER_REPLICA} GPU each: {detail}"
                  f"{', …' if len(mine) > 5 else ''}) but {cl.gpu_nodes.count} × {cl.gpu_nodes.instance_type} nodes "
                  f"have {available} GPUs ({shape.gpus} {shape.gpu} per node); replicas beyond {available} would "
                  "stay Pending and the rollout end in DeploymentFailed — lower replicas or raise gpu_nodes.count to "
                  f"{-(-needed // shape.gpus)}")


def cross_checks(data: dict[str, Any], fleet: FleetFile | None, source: str) -> Found:
    """The checks across fields and objects, on what validated (``fleet``, or item by item when fields failed)."""
    k = _Checks(data, fleet, source)
    if not k.raw_clusters:
        k.problem(("clusters",), "no cluster declared; declare at least one")
    _unique_names(k, k.raw_clusters, ("clusters",), "cluster")
    _lob_checks(k)
    _cluster_checks(k)
    unique = _endpoint_refs(k)
    _endpoint_checks(k, unique)
    _capacity_checks(k, unique)
    return k.found
