"""boto3 clients built by Airflow's AWS hook, reused within one process for a few minutes.

Building a client is not free: ``AwsBaseHook(...).conn`` makes a new boto3 session, whose loader decodes the
service's model JSON (SageMaker's is several MB) and the endpoint rules again, and walks the call stack for its
user agent: about 0.2 s of CPU per client, 0.5 s for a ``HyperPodClient``'s three. A task builds its clients
once; the processes that run many tasks or checks in a row (``dag.test()``, so ``kvfleet demo``, and the
triggerer's trigger threads) would pay it for each. So a client is reused when everything that configures it
is the same:

- the service, the region and the Airflow connection id;
- the process (a forked child never reuses its parent's clients and their open sockets);
- the environment variables that configure boto3, its config files and Airflow's connections and secrets
  backends (``AWS_*``, ``HOME``, ``AIRFLOW_CONN_*``, ``AIRFLOW__SECRETS__*``);
- and for at most ``REUSE_S`` seconds, after which the hook reads the connection again (a connection edited in
  a secrets backend or the metadata database takes effect within that time).

boto3 clients are safe to share between threads for their calls (boto3's documentation, "Multithreading or
multiprocessing with clients"), not for changes to ``client.meta`` such as event hooks. kvfleet's hooks are
registered here, before a client is shared: on every client, the one that refuses a mutating operation once a stop
is requested (``clients.stop.refusing_changes_after_stop``: after SIGTERM no new change starts, reads go on); on an
STS client, the EKS cluster header of ``kube.eks_token`` (``with_eks_cluster_header``), which reads its cluster from
a context variable that ``eks_token`` sets in the signing thread.

Credentials that expire (an assumed role) are refreshed by botocore itself, whatever the age of the client. What the
users of one reused client share: its connection pool (``max_pool_connections``, 10 by default: more concurrent
calls open and drop extra connections, with a warning) and, in botocore's standard retry mode, its retry quota (a
throttled or failing service drains it for all of them, as it would for one long-lived client). Not in the key: the
files under ``HOME`` (a changed ``~/.aws/credentials`` takes effect within ``REUSE_S``), and the DAG run and task
that the hook writes into the client's User-Agent (``AIRFLOW_CTX_*``): a task process builds its own, but under
``dag.test()`` a later task's calls carry the first one's in CloudTrail.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from kvfleet.clients.identity import Identity
from kvfleet.clients.stop import refusing_changes_after_stop

REUSE_S = 300.0
BASE_CONN_ID = "aws_default"  # the base identity's connection; missing, the environment's credentials stand in
MAX_CLIENTS = 32

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], tuple[float, Any]] = {}


def _configuring_environment() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in list(os.environ.items())
                        if k == "HOME" or k.startswith(("AWS_", "AIRFLOW_CONN_", "AIRFLOW__SECRETS__"))))


def client(service: str, region: str, identity: Identity | str | None) -> Any:
    """The boto3 client for ``service`` in ``region`` as ``identity`` (``kvfleet.clients.identity``; a connection id
    or None stands for the base identity alone: that Airflow connection, or boto3's own chain), as
    ``AwsBaseHook(...).conn`` builds it, reused as the module docstring says."""
    who = identity if isinstance(identity, Identity) else Identity(conn_id=identity)
    key = (service, region, who, os.getpid(), _configuring_environment())
    now = time.monotonic()
    with _lock:
        hit = _clients.get(key)
        if hit is not None and now - hit[0] < REUSE_S:
            return hit[1]
    built = _build(service, region, who)
    # Both hooks before another thread can use the client (the module docstring).
    refusing_changes_after_stop(built)
    if service == "sts":
        with_eks_cluster_header(built)
    with _lock:
        for stale in [k for k, (at, _) in _clients.items() if now - at >= REUSE_S or k[3] != key[3]]:
            del _clients[stale]
        while len(_clients) >= MAX_CLIENTS:
            del _clients[min(_clients, key=lambda k: _clients[k][0])]
        _clients[key] = (now, built)
    return built


def _build(service: str, region: str, who: Identity) -> Any:
    """The base identity's client, through the AWS hook (its connection, or boto3's chain: ``profile`` when set);
    for a role, a client whose credentials AssumeRole refreshes (``_assumed``), at the connection's endpoint."""
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    if who.conn_id and who.conn_id != BASE_CONN_ID:
        _require_connection(who)
    hook = AwsBaseHook(aws_conn_id=who.conn_id, client_type=service, region_name=region)
    if who.role_arn is None and who.profile is None:
        return hook.conn
    import boto3

    from kvfleet.clients.aws_session import share_loader

    base = hook.get_session(region_name=region) if who.conn_id else share_loader(
        boto3.session.Session(profile_name=who.profile, region_name=region))
    endpoint = hook.conn_config.get_service_endpoint_url(service_name=service)
    if who.role_arn is None:
        return base.client(service, endpoint_url=endpoint, config=hook.config)
    session = _assumed(base, region, who, hook)
    built = session.client(service, endpoint_url=endpoint, config=hook.config)
    _expiries[built] = _expiries[session]
    return built


def _require_connection(who: Identity) -> None:
    """A connection named for an account or a run must exist: the AWS hook would fall back to the environment's
    credentials without it (only ``aws_default`` may be missing: then the environment's credentials are the base
    identity, as the Amazon provider documents)."""
    from airflow.sdk.bases.hook import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from kvfleet.errors import PermanentError

    try:
        BaseHook.get_connection(str(who.conn_id))
    except AirflowNotFoundException:
        raise PermanentError(f"the Airflow connection {who.conn_id} (account {who.account}) does not exist: define "
                             "it, or fix the inventory's accounts[].aws_conn_id or the run's aws_conn_id; nothing "
                             "was called with other credentials") from None


_assumed_lock = threading.Lock()
_assumed_sessions: dict[tuple[Any, ...], Any] = {}
# The expiry of the credentials an assumed session's clients last signed with (``expires_at``).
_expiries: weakref.WeakKeyDictionary[Any, list[float]] = weakref.WeakKeyDictionary()


def expires_at(client: Any) -> float | None:
    """When the credentials ``client`` last signed with expire (epoch seconds), for a client of an assumed role;
    None for the base identity's (whose expiry botocore keeps to itself, or which never expire). An EKS token made
    with the client is worth no more than them (``kube.ClusterAccess``)."""
    holder = _expiries.get(client)
    return holder[0] or None if holder is not None else None


def _assumed(base: Any, region: str, who: Identity, hook: Any) -> Any:
    """A boto3 session whose credentials are ``who``'s role, assumed from ``base`` (a boto3 session of the base
    identity) and assumed again by botocore before they expire (``DeferredRefreshableCredentials``: the first
    AssumeRole happens at the first call). One per identity, region and process, so a HyperPod client's SageMaker,
    EKS and STS clients share one session (and boto3 registers its client customizations on it once). A refused
    AssumeRole is a PermanentError naming the role, the base identity and what the role's trust policy must
    allow."""
    import boto3
    import botocore.session
    from botocore.credentials import CredentialProvider, DeferredRefreshableCredentials
    from botocore.exceptions import BotoCoreError, ClientError

    from kvfleet.clients.aws_session import share_loader
    from kvfleet.errors import PermanentError, TemporaryError

    key = (who, region, os.getpid(), _configuring_environment())
    with _assumed_lock:
        if key in _assumed_sessions:
            return _assumed_sessions[key]
    sts = base.client("sts", endpoint_url=hook.conn_config.get_service_endpoint_url(
        service_name="sts", sts_connection_assume=True), config=hook.config)
    expires = [0.0]  # when the credentials last assumed expire (epoch seconds): ``expires_at``

    def refresh() -> dict[str, Any]:
        try:
            found = sts.assume_role(**who.assume_role_args())["Credentials"]
            expires[0] = found["Expiration"].timestamp()
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code, status = err.get("Code", "?"), exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            text = (f"AssumeRole {who.role_arn} (account {who.account}, session {who.session_name}) from "
                    f"{who.base()}: AWS {code}: {err.get('Message', exc)}")
            if code in ("AccessDenied", "AccessDeniedException"):
                raise PermanentError(text + "; the role's trust policy must allow the base identity sts:AssumeRole"
                                     + (" and sts:TagSession" if who.tags else "")
                                     + (" with the account's external id (sts:ExternalId)" if who.external_id
                                        else "")) from None
            if status >= 500 or code in ("Throttling", "ThrottlingException", "RequestLimitExceeded"):
                raise TemporaryError(text, delay=15) from None
            raise PermanentError(text) from None
        except BotoCoreError as exc:
            raise TemporaryError(f"AssumeRole {who.role_arn}: {exc}", delay=15) from None
        return {"access_key": found["AccessKeyId"], "secret_key": found["SecretAccessKey"],
                "token": found["SessionToken"], "expiry_time": found["Expiration"].isoformat()}

    credentials = DeferredRefreshableCredentials(refresh_using=refresh, method="assume-role")
    # botocore assumes again 15 minutes before the credentials expire and insists at 10: for a 900 s session that
    # is before every call. Scaled to the session's length instead (a quarter and a sixth of it, never later than
    # botocore's own). RefreshableCredentials takes them as its advisory_timeout / mandatory_timeout arguments;
    # DeferredRefreshableCredentials does not pass them on, so they are set as the attributes those arguments set
    # (botocore 1.44.8, botocore/credentials.py; tests/unit/test_aws_clients.py pins both names).
    credentials._advisory_refresh_timeout = min(15 * 60, who.duration_s // 4)
    credentials._mandatory_refresh_timeout = min(10 * 60, who.duration_s // 6)

    class Assumed(CredentialProvider):  # type: ignore[misc]
        METHOD = CANONICAL_NAME = "kvfleet-assume-role"

        def load(self) -> Any:
            return credentials

    core = botocore.session.Session()
    core.get_component("credential_provider").insert_before("env", Assumed())
    session = share_loader(boto3.session.Session(botocore_session=core, region_name=region))
    _expiries[session] = expires
    with _assumed_lock:
        while len(_assumed_sessions) >= MAX_CLIENTS:  # one per run and cluster: the oldest goes first
            del _assumed_sessions[next(iter(_assumed_sessions))]
        return _assumed_sessions.setdefault(key, session)


# The EKS cluster a presigned GetCallerIdentity is being made for (``kube.eks_token``), per thread and task.
EKS_CLUSTER_HEADER = "x-k8s-aws-id"
_EKS_CLUSTER: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvfleet_eks_cluster", default=None)
_EKS_HOOK_ID = "kvfleet-eks-cluster-header"


def _add_eks_cluster_header(request: Any, **_: Any) -> None:
    cluster = _EKS_CLUSTER.get()
    if cluster is not None:  # any other presigned GetCallerIdentity on the client: left alone
        request.headers[EKS_CLUSTER_HEADER] = cluster


def with_eks_cluster_header(sts_client: Any) -> Any:
    """``sts_client`` with the hook that signs the EKS cluster header into a presigned GetCallerIdentity made
    inside ``signing_for_eks``. Registered once: botocore ignores a second registration with the same unique id,
    so calling it again on a client already shared changes nothing."""
    sts_client.meta.events.register_first("before-sign.sts.GetCallerIdentity", _add_eks_cluster_header,
                                          unique_id=_EKS_HOOK_ID)
    return sts_client


@contextlib.contextmanager
def signing_for_eks(cluster: str) -> Iterator[None]:
    """Within it, this thread's (or task's) presigned GetCallerIdentity calls carry ``cluster``'s header."""
    token = _EKS_CLUSTER.set(cluster)
    try:
        yield
    finally:
        _EKS_CLUSTER.reset(token)


def forget() -> None:
    """Drop every reused client (the next ``client`` call builds afresh)."""
    with _lock:
        _clients.clear()
    with _assumed_lock:
        _assumed_sessions.clear()
