"""Authentication for the Kubernetes emulator: who a request is, as EKS decides it.

Called from ``routing.handle`` before anything else; the user it returns is what ``rbac`` authorizes.
Anonymous requests are refused (401), as on EKS, where ``--anonymous-auth`` gives an anonymous caller no rights.

EKS tokens are ``k8s-aws-v1.`` + base64url(presigned STS GetCallerIdentity URL). The checks follow
aws-iam-authenticator's ``tokenVerifier.Verify`` (kubernetes-sigs/aws-iam-authenticator ``pkg/token/token.go``,
see tests/conformance/facts/kube_rbac.yaml): scheme https, a host among STS's hostnames, path ``/``, only the
presigned-URL query parameters, ``Action=GetCallerIdentity``, ``x-k8s-aws-id`` among the signed headers,
``X-Amz-Expires`` in 0..900, and ``X-Amz-Date`` at most 15 minutes old. The real verifier then calls the URL and
maps the returned ARN through the cluster's access entries; the emulator, which checks no signature, maps the
access key id of ``X-Amz-Credential`` instead (``Authenticator.identities``, set by the sandbox: kvfleet's
key -> its access entry's groups; ``resolve_key`` for keys issued at run time, which the sandbox answers from the
AWS emulator's STS: the account and role behind the key, and whether it has expired). In the sandbox the STS
endpoint is the AWS emulator itself (``AWS_ENDPOINT_URL``), so its origin is accepted next to the real STS hostnames
(``sts_origins``).

``static_tokens`` serve the sandbox's own admin identity (kubectl users of ``sandbox up``, tests, bootstrap):
plain bearer tokens like kube-apiserver's ``--token-auth-file``, never EKS-shaped, so they cannot be confused
with kvfleet's.

Impersonation (``Impersonate-User``/``-Group``/``-Uid``/``-Extra-*``): ``impersonation_requests`` and
``impersonated_user`` follow kube-apiserver's ``WithImpersonation`` filter (kubernetes/apiserver
``pkg/endpoints/filters/impersonation.go`` at tag kubernetes-1.33.0, commit 9529108a5dff5a998bca0afd61510c9c0e34b2e3,
the version the emulator reports; ``serviceaccount.SplitUsername``/``MakeGroupNames`` from
``pkg/authentication/serviceaccount/util.go`` at the same tag; facts in
tests/conformance/facts/kube_impersonation.yaml). The ``impersonate`` checks themselves are ``rbac``'s
(``Authorizer.authorize_impersonation``); ``server`` runs the filter between authentication and routing and has
``Authenticator.authenticate`` answer the impersonated user for the rest of that request (``impersonating``).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
MAX_TOKEN_BYTES = 1024 * 4
TOKEN_LIFETIME = dt.timedelta(minutes=15)
# aws-iam-authenticator's parameterWhitelist (lower case).
ALLOWED_PARAMS = frozenset({"action", "version", "x-amz-algorithm", "x-amz-credential", "x-amz-date",
                            "x-amz-expires", "x-amz-security-token", "x-amz-signature", "x-amz-signedheaders"})
# The STS hostnames of the aws, aws-cn and aws-us-gov partitions: global, regional and FIPS endpoints.
_STS_HOST = re.compile(r"^sts(-fips)?(\.[a-z]{2}(-gov)?-[a-z]+-[0-9])?\.amazonaws\.com(\.cn)?$")
SYSTEM_MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
# authenticationv1.Impersonate*Header (k8s.io/api/authentication/v1/types.go).
IMPERSONATE_USER = "Impersonate-User"
IMPERSONATE_GROUP = "Impersonate-Group"
IMPERSONATE_UID = "Impersonate-Uid"
IMPERSONATE_EXTRA_PREFIX = "Impersonate-Extra-"
AUTHENTICATION_GROUP_VERSION = "authentication.k8s.io/v1"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
# apimachinery's ValidateNamespaceName (DNS-1123 label) and ValidateServiceAccountName (DNS-1123 subdomain).
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class UserInfo:
    """A Kubernetes user: name and groups (``system:authenticated`` is added by ``Authenticator``); an
    impersonated user also carries the ``Impersonate-Uid`` and ``Impersonate-Extra-*`` it was given."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def is_master(self) -> bool:
        return SYSTEM_MASTERS in self.groups


class TokenError(ValueError):
    """Why a bearer token was refused (kept for the emulator's log; the client only sees 401)."""


def sts_url_of(token: str) -> urllib.parse.SplitResult:
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenError("token is too large")
    if not token.startswith(TOKEN_PREFIX):
        raise TokenError(f"token is missing the {TOKEN_PREFIX!r} prefix")
    payload = token[len(TOKEN_PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenError(f"token payload is not base64url: {exc}") from None
    return urllib.parse.urlsplit(raw)


@dataclass
class Authenticator:
    """Maps a request's ``Authorization`` header to a ``UserInfo``, or None (401)."""

    identities: dict[str, UserInfo] = field(default_factory=dict)  # AWS access key id -> user
    # Keys not in ``identities`` (credentials issued at run time: an assumed role's): the user, or None (401).
    resolve_key: Callable[[str], UserInfo | None] | None = None
    static_tokens: dict[str, UserInfo] = field(default_factory=dict)  # bearer token -> user
    sts_origins: set[str] = field(default_factory=set)  # extra accepted "scheme://host[:port]" of STS

    def __post_init__(self) -> None:
        self._acting = threading.local()

    @contextlib.contextmanager
    def impersonating(self, header: str | None, user: UserInfo) -> Iterator[None]:
        """For this thread's current request (its ``Authorization`` header ``header``): ``authenticate`` answers
        ``user``, the impersonated user that ``WithImpersonation`` put into the request's context."""
        previous = getattr(self._acting, "value", None)
        self._acting.value = (header, user)
        try:
            yield
        finally:
            self._acting.value = previous

    def authenticate(self, header: str | None, now: dt.datetime | None = None) -> UserInfo | None:
        acting: tuple[str | None, UserInfo] | None = getattr(self._acting, "value", None)
        if acting is not None and acting[0] == header:
            return acting[1]
        if not header or not header.startswith("Bearer "):
            return None
        token = header[len("Bearer "):].strip()
        user = self.static_tokens.get(token)
        if user is None:
            try:
                access_key = self.verify_eks_token(token, now)
            except TokenError:
                return None
            user = self.identities.get(access_key)
            if user is None and self.resolve_key is not None:
                user = self.resolve_key(access_key)
        if user is None:
            return None
        return UserInfo(user.name, tuple(dict.fromkeys((*user.groups, AUTHENTICATED))))

    def verify_eks_token(self, token: str, now: dt.datetime | None = None) -> str:
        """The access key id of a well-formed EKS token; ``TokenError`` saying why otherwise."""
        url = sts_url_of(token)
        origin = f"{url.scheme}://{url.netloc}"
        if origin not in self.sts_origins:
            if url.scheme != "https":
                raise TokenError(f"unexpected scheme {url.scheme!r} in pre-signed URL")
            if not _STS_HOST.match(url.netloc):
                raise TokenError(f"unexpected hostname {url.netloc!r} in pre-signed URL")
        if url.path != "/":
            raise TokenError("unexpected path in pre-signed URL")
        params = _query_params(url.query)
        if params.get("action") != "GetCallerIdentity":
            raise TokenError("unexpected action parameter in pre-signed URL")
        if CLUSTER_ID_HEADER not in [h.lower() for h in params.get("x-amz-signedheaders", "").split(";")]:
            raise TokenError(f"client did not sign the {CLUSTER_ID_HEADER} header in the pre-signed URL")
        _check_time(params, now or dt.datetime.now(dt.UTC))
        access_key = params.get("x-amz-credential", "").split("/")[0]
        if not access_key:
            raise TokenError("X-Amz-Credential parameter must be present in pre-signed URL")
        return access_key


@dataclass(frozen=True)
class ImpersonationRequest:
    """One thing a request asks to impersonate: Go's ``v1.ObjectReference`` as ``buildImpersonationRequests``
    fills it (kind ServiceAccount, User, Group, UserExtra or UID; a UserExtra's key in ``field_path``)."""

    kind: str
    name: str
    namespace: str = ""
    api_version: str = ""
    field_path: str = ""

    def go_value(self) -> str:
        """``fmt``'s ``%v`` of the ObjectReference: its fields Kind, Namespace, Name, UID, APIVersion,
        ResourceVersion, FieldPath in order, space-separated, in braces."""
        return "{" + " ".join((self.kind, self.namespace, self.name, "", self.api_version, "", self.field_path)) + "}"


class ImpersonationError(ValueError):
    """``buildImpersonationRequests``'s error: groups, extras or a uid without a user (kube-apiserver answers it
    500 Internal Server Error)."""


def split_service_account_username(username: str) -> tuple[str, str] | None:
    """``serviceaccount.SplitUsername``: (namespace, name) of ``system:serviceaccount:<ns>:<name>``, else None."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    parts = username[len(SERVICE_ACCOUNT_PREFIX):].split(":")
    if len(parts) != 2:
        return None
    namespace, name = parts
    if len(namespace) > 63 or not _DNS1123_LABEL.match(namespace):
        return None
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        return None
    return namespace, name


def impersonation_requests(headers: Iterable[tuple[str, str]]) -> list[ImpersonationRequest]:
    """``buildImpersonationRequests`` over a request's headers (name, value; repeated names kept, matched without
    regard to case as Go canonicalizes them): the user (a ServiceAccount when it is a service account's username),
    each ``Impersonate-Group`` value, each ``Impersonate-Extra-<key>`` value (key lower-cased, then
    %-decoded), then the uid. ``[]``: no impersonation. Raises ``ImpersonationError`` for groups, extras or a uid
    without a user."""
    pairs = list(headers)

    def values(name: str) -> list[str]:
        return [v for k, v in pairs if k.lower() == name.lower()]

    requests: list[ImpersonationRequest] = []
    user = next(iter(values(IMPERSONATE_USER)), "")
    if user:
        sa = split_service_account_username(user)
        requests.append(ImpersonationRequest("ServiceAccount", sa[1], sa[0]) if sa
                        else ImpersonationRequest("User", user))
    groups = values(IMPERSONATE_GROUP)
    requests += [ImpersonationRequest("Group", g) for g in groups]
    prefix = IMPERSONATE_EXTRA_PREFIX.lower()
    has_extra = False
    for key, value in pairs:
        if key.lower().startswith(prefix):
            has_extra = True
            extra_key = _unescape_extra_key(key[len(prefix):].lower())
            requests.append(ImpersonationRequest("UserExtra", value, api_version=AUTHENTICATION_GROUP_VERSION,
                                                 field_path=extra_key))
    uid = next(iter(values(IMPERSONATE_UID)), "")
    if uid:
        requests.append(ImpersonationRequest("UID", uid, api_version=AUTHENTICATION_GROUP_VERSION))
    if (groups or has_extra or uid) and not user:
        listed = "[" + " ".join(r.go_value() for r in requests) + "]"
        raise ImpersonationError(f"requested {listed} without impersonating a user")
    return requests


def impersonated_user(requests: list[ImpersonationRequest]) -> UserInfo:
    """The user ``WithImpersonation`` puts into the request once every request is authorized: the named user (a
    service account's groups are its fixed ones unless ``Impersonate-Group`` is given, then the given groups are
    the authority); ``system:authenticated`` added unless ``system:authenticated`` or ``system:unauthenticated``
    is among them (``system:unauthenticated`` instead for ``system:anonymous``)."""
    groups_specified = any(r.kind == "Group" for r in requests)
    username, uid = "", ""
    groups: list[str] = []
    extra: dict[str, list[str]] = {}
    for r in requests:
        if r.kind == "ServiceAccount":
            username = f"{SERVICE_ACCOUNT_PREFIX}{r.namespace}:{r.name}"
            if not groups_specified:
                groups = ["system:serviceaccounts", f"system:serviceaccounts:{r.namespace}"]
        elif r.kind == "User":
            username = r.name
        elif r.kind == "Group":
            groups.append(r.name)
        elif r.kind == "UserExtra":
            extra.setdefault(r.field_path, []).append(r.name)
        elif r.kind == "UID":
            uid = r.name
    return UserInfo(username, _with_all_group(username, groups), uid,
                    tuple((k, tuple(v)) for k, v in extra.items()))


def _with_all_group(username: str, groups: list[str]) -> tuple[str, ...]:
    """``system:authenticated`` appended unless it or ``system:unauthenticated`` is there already;
    ``system:unauthenticated`` instead for ``system:anonymous``."""
    if username != ANONYMOUS:
        if AUTHENTICATED not in groups and UNAUTHENTICATED not in groups:
            return (*groups, AUTHENTICATED)
    elif UNAUTHENTICATED not in groups:
        return (*groups, UNAUTHENTICATED)
    return tuple(groups)


def _unescape_extra_key(key: str) -> str:
    """``unescapeExtraKey``: Go's ``url.PathUnescape``, the key unchanged if it is malformed."""
    if re.search(r"%(?![0-9a-fA-F]{2})", key):
        return key
    return urllib.parse.unquote(key)


def _query_params(query: str) -> dict[str, str]:
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise TokenError("malformed query parameter") from None
    params: dict[str, str] = {}
    for key, value in pairs:
        if key.lower() not in ALLOWED_PARAMS:
            raise TokenError(f"non-whitelisted query parameter {key!r}")
        if key.lower() in params:
            raise TokenError("query parameter with multiple values not supported")
        params[key.lower()] = value
    return params


def _check_time(params: dict[str, str], now: dt.datetime) -> None:
    try:
        expires = int(params.get("x-amz-expires", ""))
    except ValueError:
        expires = -1
    if not 0 <= expires <= 900:
        raise TokenError("invalid X-Amz-Expires parameter in pre-signed URL")
    try:
        signed_at = dt.datetime.strptime(params.get("x-amz-date", ""), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        raise TokenError("X-Amz-Date parameter must be present in pre-signed URL") from None
    if now > signed_at + TOKEN_LIFETIME:
        raise TokenError("X-Amz-Date parameter is expired (15 minute expiration)")


def presigned_token(access_key: str, region: str, now: dt.datetime | None = None, origin: str | None = None) -> str:
    """An EKS-shaped token for ``access_key`` (unsigned: the emulator checks no signature). Used by the sandbox
    for its admin clients and by tests; kvfleet builds its own with boto3."""
    when = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    query = urllib.parse.urlencode({
        "Action": "GetCallerIdentity", "Version": "2011-06-15", "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
        "X-Amz-Credential": f"{access_key}/{when[:8]}/{region}/sts/aws4_request", "X-Amz-Date": when,
        "X-Amz-Expires": "60", "X-Amz-SignedHeaders": f"host;{CLUSTER_ID_HEADER}",
        "X-Amz-Signature": "0" * 64})
    url = f"{origin or f'https://sts.{region}.amazonaws.com'}/?{query}"
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
