"""The sandbox's AWS control-plane emulator: one HTTP endpoint on 127.0.0.1 that real boto3 clients call.

Called from ``kvfleet sandbox up`` (which seeds the fleet with :meth:`AwsEmulator.add_eks_cluster` and
:meth:`AwsEmulator.add_hyperpod_cluster`), from the simulated controllers (through the ``on_*`` hooks) and
from integration tests. Product code never imports it: it reaches the emulator only through boto3 with
``endpoint_url`` set, exactly as it reaches AWS ("simulate at the wire", docs/architecture.md).

One endpoint serves every service. The service and region are read from the SigV4 credential scope
(``Credential=AKID/<date>/<region>/<service>/aws4_request``), so one URL works for SageMaker (JSON 1.1), EKS
(rest-json) and STS (query). botocore's service models are the contract (:mod:`kvfleet_sandbox.aws_wire`).

IAM, S3 and SNS are moto's (:class:`MotoServices`): a request whose scope names ``iam``, ``s3`` or ``sns`` is
handed, rewritten to the service's AWS URL, to moto's own in-process dispatcher (``BotocoreStubber``, the path
``mock_aws`` uses), so nothing of those services is written here. moto keeps state per account in process-wide
dictionaries: the emulator speaks as the caller's account (header ``x-moto-account-id``) and clears an account's
IAM, S3 and SNS state when the first emulator using the account in the process starts and when the last one stops.

Accounts (docs/reference/aws.md#accounts): a request is answered in the account of the principal that signed it
(:mod:`kvfleet_sandbox.aws_sts`: the hub's base key, an account's static key, or AssumeRole's session keys), and
SageMaker HyperPod and EKS state is kept per account, so two accounts' ``ml-prod`` coexist. The seeding and
inspection helpers take ``account`` (None: the emulator's ``account_id``, the hub).
Two emulators alive at once with the same account therefore share IAM/S3/SNS, as two clients of one AWS account
do. moto's AWS managed policies (e.g. ``AmazonEBSCSIDriverPolicy``) are loaded, so attaching one works.
What moto covers for the calls kvfleet makes: ``tests/conformance/facts/moto_coverage.yaml``.

Why not moto: moto 5.2.5 was weighed (docs/reference/aws.md#moto) and falls short of what stages 1 and 2 need. It has no
SageMaker ``UpdateCluster`` and no EKS add-on calls; its ``CreateCluster`` silently drops ``Orchestrator``,
``NodeRecovery`` and ``TieredStorageConfig``, always reports ``InService``, and refuses ``ml.g6e.4xlarge``.
Mixing it in for the remaining calls (``DescribeCluster``, ``ListClusterNodes``) would have split one
cluster's state between two stores, so the emulator owns all of it.

IAM (:mod:`kvfleet_sandbox.aws_iam_enforce`): once ``enforce_iam`` is called (the sandbox runtime does, after
attaching k8s/iam's policies to kvfleet's principal in each account), every request, to the services emulated here
and to moto's alike, is authorized by the caller's identity policies in moto's IAM of its account before it is
answered; a refusal is the service's own AccessDenied, recorded in ``iam_denials()``. Requests signed with an
administrator's key (``admin_key``) are not authorized by IAM: they are the sandbox's set-up and tests.

Fault injection: ``error_rate`` answers that share of requests with 503 ``ServiceUnavailable`` (botocore's
retry handler retries it, as it would a real brown-out), ``latency_s`` delays every request, both from a
seeded random generator so a scenario replays identically; ``fail_next_update`` and ``fail_addon`` make the
next transition fail; ``fail_mutations`` answers the next N mutating operations (Create*, Update*, Delete*, ...),
optionally only one operation, with 409 ``ConflictException`` or closes their connection without an answer.
"""

from __future__ import annotations

import logging
import random
import re
import socket
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from kvfleet.fleet.constants import NODE_RECOVERY_DEFAULT
from kvfleet_sandbox.aws_clock import Clock, Timers
from kvfleet_sandbox.aws_eks import AddonHook, EksService
from kvfleet_sandbox.aws_iam_enforce import (
    ALLOW,
    IamEnforcement,
    UnmodelledCondition,
    access_denied,
    checks_of,
    evaluate,
    identity_policies,
    principal_context,
)
from kvfleet_sandbox.aws_sagemaker import HyperPodCluster, HyperPodService, TieredStorageHook
from kvfleet_sandbox.aws_sts import Caller, Identities, RoleFacts, parse_policy, refusal
from kvfleet_sandbox.aws_wire import (
    AwsError,
    Codec,
    EmulatorBug,
    JsonCodec,
    WireRequest,
    WireResponse,
    codec_for,
    credential_scope,
    load_model,
    route_pattern,
)

log = logging.getLogger(__name__)

OWN_SERVICES = ("sagemaker", "eks", "sts")
ADMIN_KEY = "sandbox-admin"  # the sandbox's own administrator in the base account (seeding, tests)
MOTO_SERVICES = ("iam", "s3", "sns")
SERVICES = OWN_SERVICES + MOTO_SERVICES
_TARGET_PREFIXES = {"SageMaker": "sagemaker"}  # unsigned JSON requests still name their service


class AwsRequest(NamedTuple):
    """One entry of :attr:`AwsEmulator.request_log`: the call, the account it was answered in, the caller's ARN
    and the session tags of its credentials (``service, op, params = entry[:3]`` reads the call alone)."""

    service: str
    operation: str
    params: dict[str, Any]
    account: str = ""
    caller_arn: str = ""
    session_tags: tuple[tuple[str, str], ...] = ()

    @property
    def mutating(self) -> bool:
        return self.operation.startswith(_MUTATING_PREFIXES)


# SigV4's access key id: "Credential=AKID/<date>/<region>/<service>/aws4_request" (the header form).
_ACCESS_KEY = re.compile(r"Credential=([^/,\s]+)/")


def access_key_of(headers: dict[str, str]) -> str | None:
    """The access key id a request was signed with, or None when it is unsigned."""
    found = _ACCESS_KEY.search(headers.get("authorization", ""))
    return found.group(1) if found else None


def _logged(service: str, operation: str, params: dict[str, Any], caller: Caller) -> AwsRequest:
    return AwsRequest(service, operation, params, caller.account, caller.arn, caller.tags)


_MUTATING_PREFIXES = ("Create", "Update", "Delete", "Put", "Tag", "Untag", "Attach", "Detach", "Publish",
                      "Associate", "Disassociate", "Add", "Remove", "Set")


class _Account:
    """One account's SageMaker HyperPod and EKS state (names are unique per account and region, as in AWS)."""

    def __init__(self, account_id: str, emulator: AwsEmulator) -> None:
        self.eks = EksService(
            account_id=account_id,
            lock=emulator._lock,
            timers=emulator._timers,
            rng=emulator._rng,
            delay=lambda: emulator.delay_s,
        )
        self.sagemaker = HyperPodService(
            account_id=account_id,
            lock=emulator._lock,
            timers=emulator._timers,
            rng=emulator._rng,
            delay=lambda: emulator.delay_s,
            eks_arn=self.eks.arn,
        )


class DropConnection(Exception):
    """Raised by a network-failure fault: the handler closes the connection without answering."""


class AwsEmulator:
    """SageMaker HyperPod, EKS and STS behind one local endpoint; see the module docstring."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        account_id: str = "123456789012",
        delay_s: float = 0.5,
        clock: Clock | None = None,
        seed: int = 0,
    ) -> None:
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"the AWS emulator binds to loopback only, not {host!r}")
        self.host, self.port = host, port
        self.account_id = account_id
        self.delay_s = delay_s
        self.error_rate = 0.0
        self.latency_s = 0.0
        self.request_log: list[AwsRequest] = []
        self.url = ""
        self._rng = random.Random(seed)
        self._fault_rng = random.Random(seed + 1)
        self.conflicts_left = 0
        self.conflict_operation: str | None = None
        self.drops_left = 0
        self.drop_operation: str | None = None
        self._lock = threading.RLock()
        self._timers = Timers(clock)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._codecs: dict[str, Codec] = {name: codec_for(name) for name in OWN_SERVICES}
        self._moto = MotoServices(account_id)
        self.identities = Identities(account_id)
        self.iam: IamEnforcement | None = None  # None: IAM identity policies are not enforced (enforce_iam)
        self._accounts: dict[str, _Account] = {}
        self._account(account_id)

    # --- accounts ------------------------------------------------------------------------------------------

    def _account(self, account: str | None) -> _Account:
        """The state of ``account`` (None: the base account), created empty on first use."""
        key = account or self.account_id
        with self._lock:
            state = self._accounts.get(key)
            if state is None:
                state = self._accounts[key] = _Account(key, self)
            return state

    @property
    def _eks(self) -> EksService:
        return self._account(None).eks

    @property
    def _sagemaker(self) -> HyperPodService:
        return self._account(None).sagemaker

    @property
    def accounts(self) -> list[str]:
        """The accounts that hold state (the base account first)."""
        with self._lock:
            return list(self._accounts)

    @property
    def credential_lifetime_s(self) -> float | None:
        """Credentials AssumeRole issues from now on live at most this many real seconds (None: as asked)."""
        return self.identities.lifetime_cap_s

    @credential_lifetime_s.setter
    def credential_lifetime_s(self, seconds: float | None) -> None:
        self.identities.lifetime_cap_s = seconds

    def add_account_key(self, access_key: str, account: str) -> None:
        """A long-term key of ``account`` (an account kvfleet reaches through its own Airflow connection)."""
        self.identities.add_static(access_key, account)

    def admin_key(self, account: str | None = None) -> str:
        """An access key (its secret is anything) of the sandbox's own administrator in ``account`` (None: the
        base account, whose admin key is ``sandbox-admin``): what seeding scripts call IAM and S3 with, as a
        platform team's scripts run in each account."""
        if account in (None, self.account_id):
            return ADMIN_KEY
        key = f"{ADMIN_KEY}-{account}"
        known = self.identities.resolve(key)
        if known is None or known.account != account:
            self.identities.add_static(key, str(account), user="kvfleet-sandbox-admin")
        return key

    def enforce_iam(self, on: bool = True) -> None:
        """Authorize every request from now on with the caller's IAM identity policies (aws_iam_enforce), except
        those signed with an administrator's key (``admin_key``: the sandbox's own set-up and tests); ``on`` False
        turns it off."""
        self.iam = IamEnforcement({ADMIN_KEY}, (f"{ADMIN_KEY}-",)) if on else None

    def iam_denials(self) -> list[tuple[str, str, str, str, str, str]]:
        """What IAM refused since enforcement began: (service, operation, caller ARN, action, resource, decision)."""
        return list(self.iam.denials) if self.iam is not None else []

    def _authorize(self, service: str, region: str, operation: str, params: dict[str, Any],
                   caller: Caller) -> AwsError | None:
        """None when the caller's identity policies allow the request (or enforcement is off, or the caller is an
        administrator); else the service's AccessDenied."""
        enforcement = self.iam
        if enforcement is None or enforcement.bypassed(caller):
            return None
        with self._lock:
            checks = checks_of(self, service, operation, params, region, caller)
        if not checks:
            return None
        policies = self._moto.policies_of(caller)
        base = principal_context(caller, region)
        for check in checks:
            try:
                decision = evaluate(policies, check.action, check.resource, {**base, **check.context})
            except UnmodelledCondition as exc:
                return AwsError("InternalFailure", f"the kvfleet twin does not evaluate {exc}", status=500)
            if decision != ALLOW:
                enforcement.denials.append((service, operation, caller.arn, check.action, check.resource, decision))
                return access_denied(service, caller, check, decision)
        return None

    # --- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._server is not None:
            return
        self._timers.restart()
        self._moto.acquire()
        server = _Server((self.host, self.port), _Handler)
        server.emulator = self
        self._server = server
        self.port = server.server_address[1]
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"aws-emulator:{self.port}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, close the socket and every kept-alive connection, cancel pending transitions."""
        self._timers.stop()
        server, self._server = self._server, None
        if server is None:
            return
        self._moto.release()
        server.shutdown()
        server.server_close()
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> AwsEmulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- seeding ------------------------------------------------------------------------------------------
    # Every helper takes ``account``: the 12-digit account the cluster is in (None: the base account, the hub).

    def add_eks_cluster(
        self, name: str, region: str, endpoint: str, *, ca_pem: str | None = None, account: str | None = None
    ) -> str:
        """Register an ACTIVE EKS cluster whose API server is ``endpoint``; returns its ARN."""
        with self._lock:
            return self._account(account).eks.seed(name, region, endpoint, ca_pem)

    def add_hyperpod_cluster(
        self,
        name: str,
        region: str,
        eks_cluster_name: str,
        instance_groups: list[dict[str, Any]],
        node_recovery: str = NODE_RECOVERY_DEFAULT,
        tiered_storage: dict[str, Any] | None = None,
        *,
        account: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """Register an InService HyperPod cluster (with ``tags``, as ListTags answers them); returns its ARN.

        ``instance_groups`` use the API's spelling: ``{"InstanceGroupName", "InstanceType", "InstanceCount",
        ...}``. No hook fires: seeding describes a fleet that already is, not a change.
        """
        with self._lock:
            return self._account(account).sagemaker.seed(
                name=name,
                region=region,
                eks_cluster_name=eks_cluster_name,
                instance_groups=instance_groups,
                node_recovery=node_recovery,
                tiered_storage=tiered_storage,
                tags=tags,
            )

    # --- hooks, inspection and faults ----------------------------------------------------------------------

    def on_tiered_storage(self, fn: TieredStorageHook, *, account: str | None = None) -> None:
        """``fn(hyperpod_name, eks_name, TieredStorageConfig)`` after a change to it reaches InService (in
        ``account``'s clusters only)."""
        self._account(account).sagemaker.tiered_hooks.append(fn)

    def on_addon_transition(self, fn: AddonHook, *, account: str | None = None) -> None:
        """``fn(eks_name, addon_name, addon)`` just before CREATING/UPDATING becomes ACTIVE (in ``account``).

        A returned string fails the add-on (CREATE_FAILED / UPDATE_FAILED) with that string as a health issue.
        """
        self._account(account).eks.addon_hooks.append(fn)

    def addon_status(self, eks_cluster: str, addon: str, *, account: str | None = None) -> str | None:
        with self._lock:
            found = self._account(account).eks.clusters.get(eks_cluster)
            item = found.addons.get(addon) if found else None
            return item.status if item else None

    def hyperpod_cluster(self, name: str, *, account: str | None = None) -> dict[str, Any] | None:
        """What DescribeCluster would answer (name or ARN), or None."""
        with self._lock:
            try:
                return self._account(account).sagemaker.find(name).describe()
            except AwsError:
                return None

    def hyperpod_nodes(self, name: str, *, account: str | None = None) -> list[dict[str, Any]]:
        """ListClusterNodes summaries of a cluster (the orchestrator names Kubernetes nodes after them)."""
        with self._lock:
            return [node.summary() for node in self._seeded(name, account).nodes]

    def _seeded(self, name: str, account: str | None = None) -> HyperPodCluster:
        try:
            return self._account(account).sagemaker.find(name)
        except AwsError:
            where = f" of account {account}" if account else ""
            raise KeyError(f"no HyperPod cluster {name!r}{where} in the AWS emulator") from None

    def fail_next_update(self, hyperpod_cluster: str, message: str, *, account: str | None = None) -> None:
        with self._lock:
            self._account(account).sagemaker.update_faults[self._seeded(hyperpod_cluster, account).name] = message

    def fail_addon(self, eks_cluster: str, addon: str, message: str, *, account: str | None = None) -> None:
        """The add-on's transition in flight, or else its next create/update, fails with ``message``."""
        with self._lock:
            self._account(account).eks.addon_faults[(eks_cluster, addon)] = message

    def add_addon(
        self,
        eks_cluster: str,
        addon: str,
        *,
        version: str | None = None,
        service_account_role_arn: str | None = None,
        configuration_values: str | None = None,
        replace: bool = False,
        account: str | None = None,
    ) -> str:
        """Register an ACTIVE add-on (one a platform team installed before kvfleet, such as ``vpc-cni``);
        returns its ARN. ``replace`` swaps an existing one (a test's "installed at an old version"). No hook
        fires."""
        with self._lock:
            return self._account(account).eks.seed_addon(
                eks_cluster, addon, version, service_account_role_arn, configuration_values, replace=replace
            )

    def published(self, topic_arn: str | None = None) -> list[dict[str, Any]]:
        """The SNS ``Publish`` requests received, oldest first, answered or refused (their query parameters:
        ``TopicArn`` or ``TargetArn`` — Airflow's SnsHook sends the latter —, ``Message``, ``Subject``,
        ``MessageAttributes.entry.N.*``), optionally only those for one topic or target ARN."""
        return [
            dict(entry.params)
            for entry in list(self.request_log)
            if entry.service == "sns"
            and entry.operation == "Publish"
            and (topic_arn is None or topic_arn in (entry.params.get("TopicArn"), entry.params.get("TargetArn")))
        ]

    def operations(self, service: str | None = None) -> list[str]:
        return [entry.operation for entry in list(self.request_log) if service in (None, entry.service)]

    def calls(
        self,
        *,
        account: str | None = None,
        service: str | None = None,
        mutating: bool | None = None,
        caller_arn: str | None = None,
    ) -> list[AwsRequest]:
        """The request log narrowed: answered in ``account`` (its 12-digit id), to ``service``, mutating or not
        (Create*, Update*, Delete*, ...), by the principal ``caller_arn``."""
        return [
            entry
            for entry in list(self.request_log)
            if account in (None, entry.account)
            and service in (None, entry.service)
            and mutating in (None, entry.mutating)
            and caller_arn in (None, entry.caller_arn)
        ]

    def reset_request_log(self) -> None:
        self.request_log.clear()

    # --- request handling ----------------------------------------------------------------------------------

    def _service_of(self, request: WireRequest) -> tuple[str | None, str]:
        service, region = credential_scope(request.headers)
        if service is None:
            prefix = request.headers.get("x-amz-target", "").partition(".")[0]
            service = _TARGET_PREFIXES.get(prefix)
        return service, region

    def caller_of(self, request: WireRequest) -> Caller | str:
        """Who signed ``request`` (its SigV4 access key; an unsigned request is the hub's base identity), or why
        AWS would refuse it: "unknown" (no such key, or a session token that is not the key's) or "expired"."""
        access_key = access_key_of(request.headers)
        if access_key is None:
            return self.identities.base
        caller = self.identities.resolve(access_key)
        if caller is None:
            return "unknown"
        if caller.session_token is not None and request.headers.get("x-amz-security-token") != caller.session_token:
            return "unknown"
        return "expired" if caller.expired() else caller

    def handle(self, request: WireRequest) -> WireResponse:
        """Answer one decoded HTTP request (also callable without the server, e.g. from a benchmark)."""
        service, region = self._service_of(request)
        caller = self.caller_of(request)
        if service in MOTO_SERVICES:
            if isinstance(caller, str):
                return self._moto.encode_error(service, refusal(load_model(service).protocol, caller))
            return self._answer_moto(service, region, request, caller)
        codec = self._codecs.get(service or "")
        if codec is None:
            fallback = JsonCodec(load_model("sagemaker"))
            return fallback.encode_error(
                AwsError(
                    "UnrecognizedServiceException",
                    f"the kvfleet AWS emulator serves {', '.join(SERVICES)}, not {service!r}",
                )
            )
        if isinstance(caller, str):
            return codec.encode_error(refusal(codec.model.protocol, caller))
        try:
            operation, params = codec.parse(request)
        except AwsError as error:
            return codec.encode_error(error)
        self.request_log.append(_logged(codec.service, operation, params, caller))
        denied = self._authorize(codec.service, region, operation, params, caller)
        if denied is not None:
            return codec.encode_error(denied)
        return self._answer(codec, region, operation, params, caller)

    def _handler(self, service: str, operation: str, caller: Caller) -> Callable[[str, dict[str, Any]], Any] | None:
        if service == "sts":
            sts: dict[str, Callable[[str, dict[str, Any]], Any]] = {
                "GetCallerIdentity": lambda region, params: self.identities.caller_identity(caller),
                "AssumeRole": lambda region, params: self.identities.assume_role(caller, params, self._moto.role),
            }
            return sts.get(operation)
        state = self._account(caller.account)
        return (state.sagemaker if service == "sagemaker" else state.eks).operations.get(operation)

    def _answer(
        self, codec: Codec, region: str, operation: str, params: dict[str, Any], caller: Caller
    ) -> WireResponse:
        try:
            self._inject_faults(operation)
            codec.check_required(operation, params)
            handler = self._handler(codec.service, operation, caller)
            if handler is None:
                raise AwsError(
                    "NotImplemented",
                    f"the kvfleet AWS emulator does not implement {codec.service}:{operation}",
                    status=501,
                )
            with self._lock:
                result = handler(region, params)
            return codec.encode_result(operation, result)
        except AwsError as error:
            return codec.encode_error(error)
        except (EmulatorBug, KeyError, TypeError, ValueError) as bug:
            log.exception("AWS emulator failed on %s:%s", codec.service, operation)
            return codec.encode_error(AwsError("InternalFailure", f"emulator bug: {bug!r}", status=500))

    def _answer_moto(self, service: str, region: str, request: WireRequest, caller: Caller) -> WireResponse:
        operation, params = self._moto.describe(service, request)
        self.request_log.append(_logged(service, operation, params, caller))
        denied = self._authorize(service, region, operation, params, caller)
        if denied is not None:
            return self._moto.encode_error(service, denied)
        try:
            self._inject_faults(operation)
        except AwsError as error:
            return self._moto.encode_error(service, error)
        return self._moto.handle(service, region, request, account=caller.account)

    def fail_mutations(self, kind: str, count: int, operation: str | None = None) -> None:
        """``kind`` "conflict" (409) or "drop" (no answer) for the next ``count`` mutating operations (only
        ``operation`` when given); count 0 clears that kind."""
        with self._lock:
            if kind == "conflict":
                self.conflicts_left, self.conflict_operation = count, operation
            elif kind == "drop":
                self.drops_left, self.drop_operation = count, operation
            else:
                raise ValueError(f"unknown mutation fault {kind!r}; known: conflict, drop")

    def _inject_faults(self, operation: str = "") -> None:
        self._timers.sleep(self.latency_s)
        if operation.startswith(_MUTATING_PREFIXES):
            with self._lock:
                if self.drops_left > 0 and self.drop_operation in (None, operation):
                    self.drops_left -= 1
                    raise DropConnection(operation)
                if self.conflicts_left > 0 and self.conflict_operation in (None, operation):
                    self.conflicts_left -= 1
                    raise AwsError("ConflictException", f"{operation}: injected conflict (sandbox fault "
                                                        "api_conflict)", status=409)
        if self.error_rate > 0 and self._fault_rng.random() < self.error_rate:
            raise AwsError(
                "ServiceUnavailable", "Service is unavailable (injected by the kvfleet sandbox)", status=503
            )

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


# --- IAM, S3 and SNS through moto ---------------------------------------------------------------------------

# The AWS URL each service is reached at (moto's URL patterns match these hosts).
_MOTO_HOSTS = {"iam": "iam.amazonaws.com", "s3": "s3.{region}.amazonaws.com", "sns": "sns.{region}.amazonaws.com"}
# Hop-by-hop or per-connection headers the HTTP server writes itself.
_OWN_HEADERS = frozenset({"content-length", "date", "server", "connection", "transfer-encoding", "status"})
_moto_lock = threading.RLock()  # moto's backends are process-wide and not thread-safe
_moto_users: dict[str, int] = {}  # account id -> live emulators speaking as it


def _moto_backends() -> list[Any]:
    from moto.iam.models import iam_backends
    from moto.s3.models import s3_backends
    from moto.sns.models import sns_backends

    return [iam_backends, s3_backends, sns_backends]


def _purge_moto_account(account_id: str) -> None:
    """Forget everything moto holds for ``account_id`` in IAM, S3 and SNS (bucket names are global in S3)."""
    from moto.s3.models import s3_backends

    for backends in _moto_backends():
        if account_id in list(backends.keys()):
            backends[account_id].reset()
            del backends[account_id]
    for bucket, (_, owner) in list(s3_backends.bucket_accounts.items()):
        if owner == account_id:
            s3_backends.bucket_accounts.pop(bucket, None)


def _s3_routes() -> list[tuple[int, int, str, re.Pattern[str], list[tuple[str, str | None]], str]]:
    model = load_model("s3")
    routes = []
    for name in model.operation_names:
        http = model.operation_model(name).http
        uri = http.get("requestUri", "/")
        path, _, query = uri.partition("?")
        needs = [(k, v or None) for k, _, v in (part.partition("=") for part in query.split("&") if part)]
        specificity = len(re.sub(r"\{[^}]*\}", "", path))
        routes.append((len(needs), specificity, http.get("method", "GET"), route_pattern(path), needs, name))
    routes.sort(key=lambda r: (-r[0], -r[1]))
    return routes


class MotoServices:
    """IAM, S3 and SNS answered by moto's in-process dispatcher, in the caller's account; see the module
    docstring. ``account_id`` (the hub) is acquired at start; every other account on its first request."""

    def __init__(self, account_id: str) -> None:
        self.account_id = account_id
        self._acquired = False
        self._accounts: set[str] = set()
        self._s3_routes: list[Any] | None = None
        self._error_codecs: dict[str, Codec] = {}

    def acquire(self) -> None:
        from moto.core import config
        from moto.core.botocore_stubber import BotocoreStubber

        with _moto_lock:
            if self._acquired:
                return
            # AWS managed policies (AmazonEBSCSIDriverPolicy, ...) exist in every account, as they do in AWS.
            config.default_user_config.setdefault("iam", {})["load_aws_managed_policies"] = True
            self._stubber = BotocoreStubber()
            self._stubber.enabled = True
            self._acquired = True
            self.use(self.account_id)

    def use(self, account: str) -> None:
        """Speak as ``account`` from now on: its IAM, S3 and SNS state starts empty for the first emulator of the
        process that uses it, and is forgotten when the last one stops."""
        with _moto_lock:
            if account in self._accounts:
                return
            if not _moto_users.get(account):
                _purge_moto_account(account)
            _moto_users[account] = _moto_users.get(account, 0) + 1
            self._accounts.add(account)

    def release(self) -> None:
        with _moto_lock:
            if not self._acquired:
                return
            self._acquired = False
            for account in sorted(self._accounts):
                left = _moto_users.get(account, 1) - 1
                if left <= 0:
                    _moto_users.pop(account, None)
                    _purge_moto_account(account)
                else:
                    _moto_users[account] = left
            self._accounts.clear()

    def role(self, account: str, role_arn: str) -> RoleFacts | None:
        """The role ``role_arn`` as moto's IAM of ``account`` holds it (what AssumeRole reads), or None."""
        from moto.iam.models import iam_backends

        self.use(account)
        with _moto_lock:
            backend = iam_backends[account]["aws"]
            found = next((r for r in backend.roles.values() if r.arn == role_arn), None)
            if found is None:
                return None
            return RoleFacts(found.arn, found.name, found.id, parse_policy(found.assume_role_policy_document),
                             int(found.max_session_duration or 3600))

    def role_arn(self, account: str, name: str) -> str:
        """The ARN of role ``name`` in ``account`` (with its path), or the path-less ARN when IAM has no such role."""
        from moto.iam.models import iam_backends

        self.use(account)
        with _moto_lock:
            found = next((r for r in iam_backends[account]["aws"].roles.values() if r.name == name), None)
            return str(found.arn) if found is not None else f"arn:aws:iam::{account}:role/{name}"

    def put_inline_policy(self, account: str, kind: str, name: str, policy_name: str, document: str) -> None:
        """Store an inline policy on IAM user or role ``name`` (``kind`` "user" or "role") of ``account`` as IAM's
        PutUserPolicy/PutRolePolicy would. Written into moto's model directly: moto 5.2.5's policy validator
        (moto/iam/policy_validation.py ``_validate_resource_format``) splits a resource ARN on every ``:`` and so
        refuses a policy variable with a colon in the account segment (``${aws:PrincipalAccount}``), which IAM
        accepts (tests/conformance/facts/iam_enforcement.yaml)."""
        from moto.iam.models import iam_backends

        self.use(account)
        with _moto_lock:
            backend = iam_backends[account]["aws"]
            entity = backend.get_user(name) if kind == "user" else backend.get_role(name)
            entity.put_policy(policy_name, document)

    def policies_of(self, caller: Caller) -> list[dict[str, Any]]:
        """The identity-based policies moto's IAM of the caller's account holds for it (aws_iam_enforce)."""
        from moto.iam.models import iam_backends

        self.use(caller.account)
        with _moto_lock:
            return identity_policies(iam_backends[caller.account]["aws"], caller)

    def describe(self, service: str, request: WireRequest) -> tuple[str, dict[str, Any]]:
        """(operation, params) for the request log: the query form's ``Action`` and members for IAM and SNS,
        the operation botocore's S3 model routes the method, path and query to (with Bucket and Key)."""
        if service == "s3":
            return self._s3_operation(request)
        form = parse_qs(request.body.decode("utf-8", "replace") or request.query, keep_blank_values=True)
        flat = {key: values[-1] for key, values in form.items()}
        operation = flat.pop("Action", "") or "Unknown"
        flat.pop("Version", None)
        return operation, flat

    def _s3_operation(self, request: WireRequest) -> tuple[str, dict[str, Any]]:
        if self._s3_routes is None:
            self._s3_routes = _s3_routes()
        query = parse_qs(request.query, keep_blank_values=True)
        for _, _, method, pattern, needs, name in self._s3_routes:
            found = pattern.match(request.path)
            if method != request.method or found is None:
                continue
            if all(k in query and (v is None or query[k][-1] == v) for k, v in needs):
                labels = list(found.groupdict().values())
                params = dict(zip(("Bucket", "Key"), labels, strict=False))
                return name, {k: v for k, v in params.items() if v}
        return "Unknown", {}

    def encode_error(self, service: str, error: AwsError) -> WireResponse:
        if service == "s3":
            body = (
                f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{error.code}</Code>"
                f"<Message>{error.message}</Message></Error>"
            ).encode()
            return WireResponse(error.status or 400, body, {"content-type": "application/xml"})
        codec = self._error_codecs.get(service)
        if codec is None:
            codec = self._error_codecs[service] = codec_for(service)
        return codec.encode_error(error)

    def handle(self, service: str, region: str, request: WireRequest, *, account: str | None = None) -> WireResponse:
        from botocore.awsrequest import AWSPreparedRequest

        account = account or self.account_id
        self.use(account)

        host = _MOTO_HOSTS[service].format(region=region)
        url = f"https://{host}{request.path}" + (f"?{request.query}" if request.query else "")
        headers = {k: v for k, v in request.headers.items() if k != "host"}
        headers["host"] = host
        headers["x-moto-account-id"] = account
        prepared = AWSPreparedRequest(request.method, url, headers, request.body, stream_output=False)
        with _moto_lock:
            answer = self._stubber.process_request(prepared)
        if answer is None:
            return self.encode_error(service, AwsError("NotImplemented", f"moto has no route for {url}", status=501))
        status, out_headers, body = answer
        raw = body.encode() if isinstance(body, str) else bytes(body or b"")
        clean = {str(k): str(v) for k, v in (out_headers or {}).items() if str(k).lower() not in _OWN_HEADERS}
        return WireResponse(int(status), raw, clean)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    emulator: AwsEmulator


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects
    # TCP_NODELAY: two writes per response (headers, body) on a keep-alive connection otherwise meet the client's
    # delayed ACK, up to 40 ms a call. AWS's endpoints are not known to add that; no source says either way
    # (tests/conformance/test_kube_wire.py; the Kubernetes API server's side is sourced, kube/server.py).
    disable_nagle_algorithm = True
    timeout = 60
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.emulator._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.emulator._track(self.connection, False)

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        request = WireRequest(
            self.command, url.path, url.query, {k.lower(): v for k, v in self.headers.items()}, body
        )
        try:
            response = self.server.emulator.handle(request)
        except DropConnection:  # an injected network failure: no answer, the connection closes
            self.close_connection = True
            return
        self.send_response(response.status)
        headers = {"x-amzn-requestid": str(uuid.uuid4()), **response.headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("aws-emulator %s " + format, self.address_string(), *args)
