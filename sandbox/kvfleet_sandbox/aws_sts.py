"""Who calls the sandbox's AWS emulator, and STS: ``GetCallerIdentity`` and ``AssumeRole`` across accounts.

Called from :class:`kvfleet_sandbox.aws.AwsEmulator` for every request (``Identities.resolve`` names the caller
from the SigV4 access key id, so the request is answered in the caller's account) and for the ``sts`` operations;
from the sandbox runtime (static keys of accounts reached through their own Airflow connection) and from the
Kubernetes emulator's authenticator (``Identities.resolve`` again: which account and role an EKS token's key is).

The model is AWS's (facts and sources: tests/conformance/facts/sts_multi_account.yaml, docs/reference/aws.md#accounts):

- A long-term key belongs to one account's principal: the sandbox's base key (``sandbox``) and its admin key are
  the hub (the emulator's ``account_id``) as ``user/kvfleet-sandbox``; an account declared with ``aws_conn_id``
  gets a key of its own. Keys the emulator's ``AssumeRole`` issued (``ASIA...``, with a session token) belong to
  the role's account, as moto 5.2.5 maps them (``moto/sts/models.py`` ``_create_access_key`` takes the account
  from the role ARN; ``moto/iam/models.py`` ``get_account_id_from``).
- ``AssumeRole`` validates its input as the STS model in botocore says (``botocore/data/sts/2011-06-15/
  service-2.json``: ``roleSessionNameType`` 2..64 of ``[\\w+=,.@-]*``, ``roleDurationSecondsType`` 900..43200,
  ``tagListType`` at most 50, ``tagKeyType`` 1..128, ``tagValueType`` 0..256), then asks the role's trust policy
  (the role read from moto's IAM of the role's account) whether the caller may ``sts:AssumeRole`` and, when
  ``Tags`` are passed, ``sts:TagSession`` (IAM User Guide, "Pass session tags in AWS STS": "Permissions required
  to add session tags"), with ``sts:ExternalId`` in the request context. Refused: ``AccessDenied`` 403, "User:
  <caller> is not authorized to perform: sts:AssumeRole on resource: <role>" (a missing role answers the same,
  as AWS does not tell a caller which roles exist). ``DurationSeconds`` above the role's ``MaxSessionDuration``:
  ``ValidationError``.
- Credentials expire on the wall clock (botocore compares ``Expiration`` with the wall clock); ``lifetime_cap_s``
  shortens every session issued after it is set, so a test can watch credentials expire.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import re
import secrets
import string
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from kvfleet_sandbox.aws_wire import AwsError

BASE_USER = "kvfleet-sandbox"
BASE_USER_ID = "AIDAKVFLEETSANDBOX0001"
ASSUMED_KEY_PREFIX = "ASIA"  # temporary keys (IAM User Guide, "IAM identifiers": unique ID prefixes)
DEFAULT_DURATION_S = 3600  # AssumeRole's DurationSeconds default (the STS API reference)
DEFAULT_MAX_SESSION_S = 3600  # a role's MaxSessionDuration default (IAM CreateRole)
CHAINED_MAX_S = 3600  # role chaining: at most one hour (the STS API reference, DurationSeconds)
# botocore's STS model (service-2.json, shapes roleSessionNameType, roleDurationSecondsType, tagListType, ...).
SESSION_NAME = re.compile(r"[\w+=,.@-]*")
SESSION_NAME_LEN = (2, 64)
DURATION_RANGE = (900, 43200)
MAX_TAGS = 50
TAG_KEY_LEN = (1, 128)
TAG_VALUE_LEN = (0, 256)
# \p{L}\p{Z}\p{N}_.:/=+\-@ of tagKeyType/tagValueType: Unicode letters, separators and numbers (never a control
# character: \s would let a tab or a newline through), and six punctuation marks.
TAG_PUNCTUATION = "_.:/=+-@"


def tag_text_ok(text: str) -> bool:
    return all(ch in TAG_PUNCTUATION or unicodedata.category(ch)[0] in "LZN" for ch in text)
ACCESS_DENIED = "User: {caller} is not authorized to perform: sts:AssumeRole on resource: {role}"
TOO_LONG = "The requested DurationSeconds exceeds the MaxSessionDuration set for this role."
CHAINED_TOO_LONG = "The requested DurationSeconds exceeds the 1 hour session limit for roles assumed by role chaining."


@dataclass(frozen=True)
class Caller:
    """The principal behind an access key: its account, ARN and user id (``GetCallerIdentity``'s answer), and for
    assumed-role sessions the role, session name, session tags and expiry."""

    access_key: str
    account: str
    arn: str
    user_id: str
    role_arn: str | None = None
    session_name: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    expires: dt.datetime | None = None
    session_token: str | None = None

    def expired(self, now: dt.datetime | None = None) -> bool:
        return self.expires is not None and (now or dt.datetime.now(dt.UTC)) >= self.expires

    @property
    def session_tags(self) -> dict[str, str]:
        return dict(self.tags)


@dataclass(frozen=True)
class RoleFacts:
    """What AssumeRole reads of a role in IAM (moto's ``Role``)."""

    arn: str
    name: str
    role_id: str
    trust_policy: dict[str, Any]
    max_session_s: int


RoleLookup = Callable[[str, str], "RoleFacts | None"]  # (account, role ARN) -> the role, or None


def account_of_role(role_arn: str) -> str | None:
    """The account id of ``arn:aws:iam::<account>:role/...``, or None when it is not a role ARN."""
    found = re.fullmatch(r"arn:aws[\w-]*:iam::(\d{12}):role/(?:[\w+=,.@/-]*/)?[\w+=,.@-]+", role_arn)
    return found.group(1) if found else None


@dataclass
class Identities:
    """The emulator's principals by access key; see the module docstring. Thread-safe."""

    base_account: str
    lifetime_cap_s: float | None = None  # issued credentials live at most this long (real seconds)
    accept_unknown_keys: bool = True  # an unknown long-term key is the hub's base identity (see resolve)
    _static: dict[str, Caller] = field(default_factory=dict)
    _sessions: dict[str, Caller] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base(self) -> Caller:
        return self.base_caller("")

    def base_caller(self, access_key: str) -> Caller:
        return Caller(access_key, self.base_account, f"arn:aws:iam::{self.base_account}:user/{BASE_USER}",
                      BASE_USER_ID)

    def add_static(self, access_key: str, account: str, user: str = BASE_USER) -> Caller:
        """A long-term key of ``account``'s IAM user ``user`` (an account reached through its own connection)."""
        user_id = "AIDA" + re.sub(r"[^A-Z0-9]", "", f"{user}{account}".upper())[:17]
        caller = Caller(access_key, account, f"arn:aws:iam::{account}:user/{user}", user_id)
        with self._lock:
            self._static[access_key] = caller
        return caller

    def resolve(self, access_key: str) -> Caller | None:
        """The caller behind ``access_key``; None when AWS would not know the key. A key the emulator did not
        issue and that is not temporary (``ASIA...``) is the hub's base identity while ``accept_unknown_keys``
        holds: the single-account sandbox has always answered any long-term key as its one account."""
        with self._lock:
            known = self._static.get(access_key) or self._sessions.get(access_key)
        if known is not None:
            return known
        if self.accept_unknown_keys and access_key and not access_key.startswith(ASSUMED_KEY_PREFIX):
            return self.base_caller(access_key)
        return None

    def sessions(self) -> list[Caller]:
        with self._lock:
            return list(self._sessions.values())

    # --- STS operations ------------------------------------------------------------------------------------

    def caller_identity(self, caller: Caller) -> dict[str, Any]:
        return {"UserId": caller.user_id, "Account": caller.account, "Arn": caller.arn}

    def assume_role(self, caller: Caller, params: dict[str, Any], roles: RoleLookup) -> dict[str, Any]:
        role_arn, session = str(params["RoleArn"]), str(params["RoleSessionName"])
        tags = tags_of(params)
        duration = _duration(params)
        check_input(session, duration, tags)
        account = account_of_role(role_arn)
        role = roles(account, role_arn) if account else None
        context = {"sts:externalid": params.get("ExternalId")}
        actions = ["sts:AssumeRole"] + (["sts:TagSession"] if tags else [])
        if role is None or not all(trust_allows(role.trust_policy, caller, a, context) for a in actions):
            raise AwsError("AccessDenied", ACCESS_DENIED.format(caller=caller.arn, role=role_arn), status=403)
        if duration > role.max_session_s:
            raise AwsError("ValidationError", TOO_LONG)
        if caller.role_arn is not None and duration > CHAINED_MAX_S and "DurationSeconds" in params:
            raise AwsError("ValidationError", CHAINED_TOO_LONG)
        return self._issue(caller, role, account or "", session, tags, duration)

    def _issue(self, caller: Caller, role: RoleFacts, account: str, session: str,
               tags: list[tuple[str, str]], duration: int) -> dict[str, Any]:
        lifetime = float(duration) if self.lifetime_cap_s is None else min(float(duration), self.lifetime_cap_s)
        expires = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=lifetime)).replace(microsecond=0)
        key = ASSUMED_KEY_PREFIX + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16))
        token = "IQoJb3JpZ2luX2VjE" + secrets.token_urlsafe(96)
        arn = f"arn:aws:sts::{account}:assumed-role/{role.name}/{session}"
        issued = Caller(key, account, arn, f"{role.role_id}:{session}", role.arn, session, tuple(tags), expires,
                        token)
        with self._lock:
            self._sessions[key] = issued
        return {
            "Credentials": {"AccessKeyId": key, "SecretAccessKey": secrets.token_urlsafe(30),
                            "SessionToken": token, "Expiration": expires},
            "AssumedRoleUser": {"AssumedRoleId": issued.user_id, "Arn": arn},
        }


def _duration(params: dict[str, Any]) -> int:
    raw = params.get("DurationSeconds", DEFAULT_DURATION_S)
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise AwsError("ValidationError", f"1 validation error detected: Value '{raw}' at 'durationSeconds' failed "
                                          "to satisfy constraint: Member must be a number") from None


def tags_of(params: dict[str, Any]) -> list[tuple[str, str]]:
    """``Tags.member.N.Key`` / ``.Value`` of the query form, in N order."""
    found: dict[int, dict[str, str]] = {}
    for name, value in params.items():
        match = re.fullmatch(r"Tags\.member\.(\d+)\.(Key|Value)", name)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = str(value)
    return [(found[n].get("Key", ""), found[n].get("Value", "")) for n in sorted(found)]


def check_input(session: str, duration: int, tags: list[tuple[str, str]]) -> None:
    """The model's constraints, every violation in one ``ValidationError`` as STS words it."""
    problems = _length_problems(session, "roleSessionName", SESSION_NAME_LEN)
    if not SESSION_NAME.fullmatch(session):
        problems.append(_violation(session, "roleSessionName",
                                   f"Member must satisfy regular expression pattern: {SESSION_NAME.pattern}"))
    low, high = DURATION_RANGE
    if not low <= duration <= high:
        bound = f"greater than or equal to {low}" if duration < low else f"less than or equal to {high}"
        problems.append(_violation(duration, "durationSeconds", f"Member must have value {bound}"))
    if len(tags) > MAX_TAGS:
        problems.append(_violation("[...]", "tags", f"Member must have length less than or equal to {MAX_TAGS}"))
    for index, (key, value) in enumerate(tags, start=1):
        problems += _length_problems(key, f"tags.{index}.member.key", TAG_KEY_LEN)
        problems += _length_problems(value, f"tags.{index}.member.value", TAG_VALUE_LEN)
        for text, where in ((key, "key"), (value, "value")):
            if not tag_text_ok(text):
                problems.append(_violation(text, f"tags.{index}.member.{where}", "Member must satisfy regular "
                                           r"expression pattern: [\p{L}\p{Z}\p{N}_.:/=+\-@]*"))
    if problems:
        count = len(problems)
        raise AwsError("ValidationError", f"{count} validation error{'s' if count > 1 else ''} detected: "
                                          + "; ".join(problems))


def _violation(value: Any, where: str, constraint: str) -> str:
    return f"Value '{value}' at '{where}' failed to satisfy constraint: {constraint}"


def _length_problems(text: str, where: str, bounds: tuple[int, int]) -> list[str]:
    low, high = bounds
    if len(text) < low:
        return [_violation(text, where, f"Member must have length greater than or equal to {low}")]
    if len(text) > high:
        return [_violation(text, where, f"Member must have length less than or equal to {high}")]
    return []


# --- trust policy evaluation ----------------------------------------------------------------------------------


def parse_policy(document: Any) -> dict[str, Any]:
    """A policy document as moto keeps it (JSON text, possibly %-encoded, as IAM's GetRole returns it)."""
    if isinstance(document, dict):
        return document
    text = str(document or "")
    if text.startswith("%7B") or text.startswith("%7b"):
        text = unquote(text)
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _principal_matches(principal: Any, caller: Caller) -> bool:
    """``Principal`` names the caller: ``*``, or an ``AWS`` entry that is its ARN, its account's root ARN or its
    account id, or (for an assumed-role session) the role's ARN (IAM User Guide, "AWS JSON policy elements:
    Principal")."""
    if principal == "*":
        return True
    if not isinstance(principal, dict):
        return False
    mine = {caller.arn, f"arn:aws:iam::{caller.account}:root", caller.account, "*"}
    if caller.role_arn:
        mine.add(caller.role_arn)
    return any(str(entry) in mine for entry in _listed(principal.get("AWS", [])))


def _action_matches(actions: Any, action: str) -> bool:
    return any(fnmatch.fnmatch(action.lower(), str(a).lower()) for a in _listed(actions))


def _conditions_hold(conditions: Any, context: dict[str, Any]) -> bool:
    """``StringEquals`` (and ``StringLike``) on the request context; any other operator fails closed. A key that is
    absent from the request never equals a value (IAM User Guide, "Condition operators")."""
    if not conditions:
        return True
    if not isinstance(conditions, dict):
        return False
    for operator, tests in conditions.items():
        if operator not in ("StringEquals", "StringLike") or not isinstance(tests, dict):
            return False
        for key, wanted in tests.items():
            if not _string_test(operator, context.get(str(key).lower()), _listed(wanted)):
                return False
    return True


def _string_test(operator: str, have: Any, wanted: list[Any]) -> bool:
    if have is None:
        return False
    if operator == "StringEquals":
        return any(str(have) == str(w) for w in wanted)
    return any(fnmatch.fnmatchcase(str(have), str(w)) for w in wanted)


def trust_allows(policy: dict[str, Any], caller: Caller, action: str, context: dict[str, Any]) -> bool:
    """Whether a role's trust policy lets ``caller`` perform ``action``: an ``Allow`` statement matches (principal,
    action, conditions) and no ``Deny`` does."""
    allowed = False
    for statement in _listed(policy.get("Statement", [])):
        if not isinstance(statement, dict):
            continue
        matches = (_principal_matches(statement.get("Principal"), caller)
                   and _action_matches(statement.get("Action", []), action)
                   and _conditions_hold(statement.get("Condition"), context))
        if matches and statement.get("Effect") == "Deny":
            return False
        allowed = allowed or (matches and statement.get("Effect") == "Allow")
    return allowed


def refusal(protocol: str, kind: str) -> AwsError:
    """What a service answers a request whose key it does not know (``unknown``) or whose session token has expired
    (``expired``), by protocol: the query services (STS, IAM, SNS) ``InvalidClientTokenId`` / ``ExpiredToken``, the
    JSON ones (SageMaker, EKS) ``UnrecognizedClientException`` / ``ExpiredTokenException`` ("Common Errors" of the
    AWS API references), S3 ``InvalidAccessKeyId`` / ``ExpiredToken`` (S3 API reference, "Error responses")."""
    if kind == "expired":
        if protocol == "rest-xml":
            return AwsError("ExpiredToken", "The provided token has expired.", status=400)
        code = "ExpiredToken" if protocol == "query" else "ExpiredTokenException"
        return AwsError(code, "The security token included in the request is expired", status=403)
    if protocol == "rest-xml":
        return AwsError("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.",
                        status=403)
    code = "InvalidClientTokenId" if protocol == "query" else "UnrecognizedClientException"
    return AwsError(code, "The security token included in the request is invalid.", status=403)
