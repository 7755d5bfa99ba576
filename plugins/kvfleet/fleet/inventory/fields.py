"""The field checks of the inventory: each turns a value into what the model keeps, or raises the kvfleet message
(the value, what is allowed, the fix). The model (:mod:`.schema`) composes them into ``Annotated`` types."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BeforeValidator, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from kvfleet.fleet import constants as C
from kvfleet.fleet import hardware, models
from kvfleet.fleet.inventory.vocabulary import (
    ACCOUNT_ID,
    CHART_NAME,
    CONN_ID,
    DEFAULT_IMAGE,
    DEFAULT_MODEL_ID,
    DEFAULT_WORKER_HOST_PATH,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ENV_NAME,
    EXTERNAL_ID,
    HASH_SEED_MAX,
    HELM_SPECIAL,
    HF_PART,
    HOST_PATH,
    IMAGE_REF,
    INSTANCE_TYPE,
    MAX_PRICE_USD_PER_HOUR,
    MODEL_NAME,
    REGION,
    RESERVED_ENV,
    ROLE_ARN,
    SEMVER,
    SIZE,
    SYSTEM_NAMESPACE_PREFIX,
    UPDATE_STRATEGIES,
    UPDATE_STRATEGY_HELP,
    _fail,
    key_text,
    safe_url,
    show,
    type_name,
)
from kvfleet.fleet.shared_rules import SNS_TOPIC_ARN

# ---- field checks: each returns the value or raises the kvfleet message -----------------------------------------

Check = Callable[[str], str | None]  # a further check of a string: the problem, or None


def _text(max_len: int = 253, allow_empty: bool = False, check: Check | None = None,
          numbers: bool = True) -> BeforeValidator:
    """A string field (a whole number is taken as its digits unless ``numbers`` is False: an identifier YAML may
    read as an octal number; a float or boolean is refused)."""

    def run(value: Any) -> str:
        if value is None:
            raise _fail("is null (YAML reads null, ~ or an empty value as no value); give it a value or remove the "
                        "key for the default")
        if not numbers and isinstance(value, int) and not isinstance(value, bool):
            raise _fail(f"{show(value)} is an integer, not a string; quote it (YAML reads unquoted digits as a "
                        "number, and a leading 0 as octal)")
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


@dataclass(frozen=True)
class _Checked:
    """A field check that is also what the JSON Schema says of the field (its bounds or allowed values), so that
    each is declared once. pydantic calls ``check`` before its own strict type check."""

    check: Callable[[Any], Any]
    schema: tuple[tuple[str, Any], ...]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_before_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = handler(schema)
        # `int | None`: the bounds belong to the integer branch; an enum (null included) to the whole field
        target = next((s for s in out.get("anyOf", []) if s.get("type") == "integer"), out)
        target.update({k: list(v) if isinstance(v, list) else v for k, v in self.schema})  # a reader may edit it
        return out


def _int(lo: int, hi: int, why: str = "", odd: bool = False) -> _Checked:
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

    return _Checked(run, (("minimum", lo), ("maximum", hi)))


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(f"{show(value)} is not a boolean; use true or false")
    return value


def _choice(allowed: Iterable[str], nullable: bool = False) -> _Checked:
    options = tuple(sorted(allowed)) if isinstance(allowed, set | frozenset) else tuple(allowed)

    def run(value: Any) -> Any:
        if value is None and nullable:
            return None
        if not isinstance(value, str) or value not in options:
            raise _fail(f"{show(value)} is not one of {', '.join(sorted(options))}; pick one of them")
        return value

    return _enum(run, options, nullable)


def _enum(check: Callable[[Any], Any], options: Iterable[Any], nullable: bool = False) -> _Checked:
    """A choice field: ``check`` (its own message), and its options as the schema's enum (a set's sorted: its order
    differs between processes, with string hashing)."""
    values = sorted(options) if isinstance(options, set | frozenset) else list(options)
    return _Checked(check, (("enum", [*values, None] if nullable else values),))


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


_size = _pattern(SIZE, "is not a size like 100Gi; use <number>Ki|Mi|Gi|Ti")


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


_chart = _pattern(CHART_NAME, "is not a helm chart name (lowercase letters, digits and '-', starting and ending "
                  "with a letter or digit); use e.g. curvine")


_chart_version = _pattern(SEMVER, "is not a SemVer 2 version, which helm requires; use e.g. "
                          f"{C.CURVINE_CHART_VERSION}")


def _addon_version(value: str) -> str | None:
    return None if value.startswith("v") and SEMVER.fullmatch(value[1:]) else (
        f"{show(value)} is not an EKS add-on version (v + SemVer, such as v1.0.0-eksbuild.1); use the version "
        "`aws eks describe-addon-versions` lists")


_region = _pattern(REGION, "is not an AWS region such as us-east-1")
_role_arn = _pattern(ROLE_ARN, "is not an IAM role ARN such as arn:aws:iam::123456789012:role/kvfleet")
_external_id = _pattern(EXTERNAL_ID, "is not an STS external id (2 to 1224 of letters, digits and _+=,.@:/-)")
_conn_id = _pattern(CONN_ID, "is not an Airflow connection id (letters, digits, '_', '.', '-')")


def _account_id(value: Any) -> str:
    """A 12-digit AWS account id, written as a string: YAML reads an unquoted 012345670123 as an octal number."""
    if not isinstance(value, str):
        raise _fail(f"{show(value)} is {type_name(value)}, not a string; write the 12-digit account id quoted, e.g. "
                    "id: '012345678901' (YAML reads an unquoted number as a number, and a leading 0 as octal)")
    if not ACCOUNT_ID.fullmatch(value):
        raise _fail(f"{show(value)} is not a 12-digit AWS account id; write the account's 12 digits, e.g. "
                    "'012345678901'")
    return value


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


_sns_arn = _pattern(SNS_TOPIC_ARN, "is not an SNS topic ARN (arn:aws:sns:<region>:<12-digit account>:<topic name "
                    "of letters, digits, '-', '_'>); use e.g. arn:aws:sns:us-east-1:123456789012:kvfleet-retail, or "
                    "remove the key")




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
        if not isinstance(value, str):  # ip_network also takes an int (an address), which the file cannot mean
            raise TypeError(value)
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
