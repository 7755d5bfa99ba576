"""Kubernetes access for one HyperPod cluster: the production path, and the one place that builds a kubeconfig.

HyperPod DescribeCluster -> ``Orchestrator.Eks.ClusterArn`` -> EKS DescribeCluster (endpoint, CA) -> an EKS
bearer token (a presigned STS GetCallerIdentity URL carrying ``x-k8s-aws-id``, as ``aws eks get-token`` makes)
-> the official Kubernetes client, over TLS verified with that CA (``cluster_ca``: a cluster that reports none is
refused, the token never sent unverified). ``write_kubeconfig`` gives helm and kubectl the same credentials.

Called by every stage that touches Kubernetes, by ``clients.helm`` (kubeconfig), ``clients.inference`` and
``clients.curvine`` (pod proxy). API errors become kvfleet's error model: 404 is ``None`` where a lookup is
asked for, 409/429/5xx are ``TemporaryError``, other 4xx are ``PermanentError`` with the server's message; a call
without an answer (``clients.transient``) is a ``TemporaryError``, a certificate that fails verification permanent.

SIGTERM (``clients.stop``, re-exported here): every wait here ends with ``StopRequested``, and the ``ApiClient``
built here starts no POST, PUT, PATCH or DELETE after a stop (``StopGuardedApiClient``), reads and server dry runs
excepted, undo steps inside ``stop.allow_after_stop`` too.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kvfleet.clients import aws
from kvfleet.clients.stop import _STOP, refuse_if_stopped
from kvfleet.clients.stop import StopRequested as StopRequested
from kvfleet.clients.stop import install_sigterm_handler as install_sigterm_handler
from kvfleet.clients.stop import request_stop as request_stop
from kvfleet.clients.stop import reset_stop as reset_stop
from kvfleet.clients.stop import stop_requested as stop_requested
from kvfleet.clients.transient import certificate_refused, is_network_error
from kvfleet.errors import ConvergenceTimeout, KvfleetError, PermanentError, TemporaryError

log = logging.getLogger(__name__)
T = TypeVar("T")
TOKEN_TTL_S = 14 * 60  # EKS tokens live 15 minutes; refresh a minute early
# The exec credential plugin API helm and kubectl read a renewed token through (k8s.io/client-go
# plugin/pkg/client/auth/exec; v1 asks for interactiveMode); CREDENTIAL_CHECK_S: how often it is looked at.
EXEC_API = "client.authentication.k8s.io/v1"
CREDENTIAL_CHECK_S = 1.0


def eks_token(sts_client: Any, eks_cluster_name: str) -> str:
    """An EKS bearer token: ``k8s-aws-v1.`` + base64url(presigned GetCallerIdentity URL), no padding. The cluster
    header goes in through the client's hook (``aws.with_eks_cluster_header``: registered when
    ``aws.client`` built the client, or here for a client built elsewhere; two threads racing on such a client's
    first token may both register it, which the idempotent hook makes harmless)."""
    with aws.signing_for_eks(eks_cluster_name):
        url = aws.with_eks_cluster_header(sts_client).generate_presigned_url(
            "get_caller_identity", Params={}, ExpiresIn=60, HttpMethod="GET")
    return "k8s-aws-v1." + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def api_error(exc: ApiException, what: str) -> Exception:
    message = exc.reason or ""
    try:
        body = json.loads(exc.body or "{}")
        message = body.get("message") or message
    except (ValueError, AttributeError):
        pass
    text = f"{what}: Kubernetes {exc.status}: {message}"
    if exc.status in (409, 429) or (exc.status or 0) >= 500:
        return TemporaryError(text, delay=5)
    return PermanentError(text)


def network_error(exc: BaseException, what: str) -> TemporaryError:
    """A connection dropped without an answer, refused, reset or timed out (``clients.transient``): the API server
    may or may not have applied a write, so the reconciler observes again on retry (every stage is idempotent).
    Temporary, never a raw traceback."""
    return TemporaryError(f"{what}: the Kubernetes API did not answer ({type(exc).__name__}: "
                          f"{str(exc)[:200]}); retrying observes the live state again", delay=5)


def transport_error(exc: BaseException, what: str) -> KvfleetError | None:
    """A call that failed below HTTP, in kvfleet's error model: no answer (``clients.transient``) is temporary; an
    API server whose certificate the cluster's CA does not sign is permanent (every retry fails the same way).
    None for anything else (re-raised as it is)."""
    if certificate_refused(exc):
        return PermanentError(f"{what}: the Kubernetes API server's certificate failed verification with the "
                              f"cluster's CA ({str(exc)[:200]}); kvfleet does not send its token unverified. "
                              "Check the cluster's endpoint and certificateAuthority (EKS DescribeCluster)")
    return network_error(exc, what) if is_network_error(exc) else None


def call(fn: Callable[..., T], *args: Any, what: str = "", **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        raise api_error(exc, what or getattr(fn, "__name__", "kubernetes call")) from exc
    except Exception as exc:
        typed = transport_error(exc, what or getattr(fn, "__name__", "kubernetes call"))
        if typed is None:
            raise
        raise typed from exc


def get_or_none(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise api_error(exc, getattr(fn, "__name__", "kubernetes get")) from exc
    except Exception as exc:
        typed = transport_error(exc, getattr(fn, "__name__", "kubernetes get"))
        if typed is None:
            raise
        raise typed from exc


def cluster_ca(what: str, endpoint: str, ca_data: str | None) -> bytes:
    """The PEM of the CA that signs ``what``'s API server certificate, from EKS's ``certificateAuthority.data``
    (base64). kvfleet sends a bearer token to the API server, so it talks to it only over TLS it verifies: an
    endpoint that is not ``https://`` or a cluster that reports no CA (or one that is not base64) is a
    ``PermanentError`` naming the cluster, never a connection without verification."""
    if not endpoint.startswith("https://"):
        raise PermanentError(f"{what}: the API server endpoint {endpoint[:200]!r} is not https://; kvfleet sends "
                             "its token over verified TLS only. Check the cluster's endpoint (EKS DescribeCluster)")
    if not ca_data:
        raise PermanentError(f"{what}: the cluster reports no certificate authority (EKS certificateAuthority.data "
                             "is empty), so its API server cannot be verified; kvfleet does not send its token "
                             "unverified. Check the EKS cluster (DescribeCluster) and try again once it reports one")
    try:
        pem = base64.b64decode(ca_data, validate=True)
    except (binascii.Error, ValueError):
        raise PermanentError(f"{what}: the cluster's certificate authority (EKS certificateAuthority.data) is not "
                             "base64; kvfleet does not send its token unverified") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise PermanentError(f"{what}: the cluster's certificate authority (EKS certificateAuthority.data) holds "
                             "no PEM certificate; kvfleet does not send its token unverified")
    return pem


def https_proxy() -> tuple[str | None, str | None]:
    """(the proxy, the hosts that bypass it) for an https API server, as helm and kubectl choose them (Go's
    ``net/http.ProxyFromEnvironment``, golang.org/x/net/http/httpproxy ``FromEnvironment``: ``HTTPS_PROXY`` then
    ``https_proxy``, ``NO_PROXY`` then ``no_proxy``; ``HTTP_PROXY`` is for http:// URLs only). The Kubernetes
    Python client's own reading of the environment lets ``HTTP_PROXY`` and the lowercase names win (kubernetes
    36.0.3, ``client/configuration.py``), so kvfleet sets both explicitly: the three agree."""
    env = os.environ
    return (env.get("HTTPS_PROXY") or env.get("https_proxy") or None,
            env.get("NO_PROXY") or env.get("no_proxy") or None)


_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class StopGuardedApiClient(k8s.ApiClient):  # type: ignore[misc]
    """The official ``ApiClient``, refusing to start a write once a stop is requested (``clients.stop``): every
    request of every API group, and the pod proxy, leaves through ``request``. A server dry run (``dryRun=All``)
    persists nothing and stays allowed, as reads do."""

    # Set by ClusterAccess: a fresh token, made now. A request answered 401 (its token expired on the way: a token
    # lives no longer than the credentials that signed it) is sent once more with it, as client-go does for an exec
    # credential; a 401 means the server authenticated nothing, so nothing of the request was applied.
    renew_token: Callable[[], str] | None = None

    def request(self, method: str, url: str, query_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        if str(method).upper() in _WRITE_METHODS and _STOP.is_set() and not _dry_run(query_params):
            path = url.split("://", 1)[-1].partition("/")[2]
            refuse_if_stopped(f"Kubernetes {str(method).upper()} /{path.partition('?')[0]}")
        try:
            return super().request(method, url, query_params, *args, **kwargs)
        except ApiException as exc:
            if exc.status != 401 or self.renew_token is None or not isinstance(kwargs.get("headers"), dict):
                raise
            log.info("Kubernetes answered 401 to %s: sending it once more with a fresh EKS token", method)
            kwargs["headers"] = {**{k: v for k, v in kwargs["headers"].items() if k.lower() != "authorization"},
                                 "authorization": f"Bearer {self.renew_token()}"}
            return super().request(method, url, query_params, *args, **kwargs)


def _dry_run(query_params: Any) -> bool:
    """A server dry run: ``dryRun=All`` among the query parameters (a list of pairs, or a mapping)."""
    pairs = query_params.items() if isinstance(query_params, dict) else (query_params or ())
    return any(str(k) == "dryRun" and str(v) == "All" for k, v in pairs)


class ClusterAccess:
    """Clients for one EKS cluster, with a self-refreshing EKS token, over TLS verified with the cluster's CA
    (``cluster_ca``: no CA, no access)."""

    def __init__(self, *, eks_name: str, endpoint: str, ca_data: str | None, token_source: Callable[[], str],
                 what: str | None = None, expiry_source: Callable[[], float | None] | None = None) -> None:
        """``expiry_source``: when the credentials the last token was signed with expire (epoch seconds; None:
        unknown), which bounds the token's life (``token``)."""
        pem = cluster_ca(what or f"EKS cluster {eks_name}", endpoint, ca_data)
        self.eks_name = eks_name
        self.endpoint = endpoint
        self._token_source = token_source
        self._expiry_source = expiry_source
        self._token = ""
        self._token_until = 0.0  # epoch seconds
        self._lock = threading.Lock()
        fd, self._ca_file = tempfile.mkstemp(prefix="kvfleet-ca-", suffix=".pem")
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        self.ca_data = ca_data
        cfg = k8s.Configuration()
        cfg.host = endpoint
        cfg.verify_ssl = True
        cfg.ssl_ca_cert = self._ca_file
        cfg.proxy, cfg.no_proxy = https_proxy()
        # kubernetes 36 reads the key and its prefix under "BearerToken" (the old "authorization" key loses
        # its prefix there).
        try:
            cfg.api_key = {"BearerToken": self.token()}
        except BaseException:
            Path(self._ca_file).unlink(missing_ok=True)
            raise
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        cfg.refresh_api_key_hook = self._refresh
        # The hourly verification probes up to 32 endpoints of a cluster at once (its max_parallel Param); the
        # client's default pool (5 x CPUs) would drop the extra connections with "Connection pool is full".
        cfg.connection_pool_maxsize = 32
        self.api_client = StopGuardedApiClient(cfg)
        self.api_client.renew_token = self.renew
        # The API server records the user agent's product as the field manager of a write that names none, so
        # kvfleet's own changes are told apart from changes by hand (the drift watch's filter, managedFields).
        self.api_client.user_agent = "kvfleet/0.1"
        self.core = k8s.CoreV1Api(self.api_client)
        self.apps = k8s.AppsV1Api(self.api_client)
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.storage = k8s.StorageV1Api(self.api_client)
        self.apiext = k8s.ApiextensionsV1Api(self.api_client)

    @classmethod
    def from_hyperpod(cls, hyperpod: Any, cluster_name: str) -> ClusterAccess:
        """Build from a ``HyperPodClient`` and the HyperPod cluster name (the production path)."""
        cluster = hyperpod.require_cluster(cluster_name)
        eks_name = cluster.eks_cluster_name
        eks = hyperpod.describe_eks(eks_name)
        endpoint = eks.get("endpoint")
        if not endpoint:
            raise TemporaryError(f"EKS cluster {eks_name} has no endpoint yet (status {eks.get('status')})")
        return cls(eks_name=eks_name, endpoint=endpoint,
                   ca_data=(eks.get("certificateAuthority") or {}).get("data"),
                   token_source=lambda: eks_token(hyperpod.sts, eks_name),
                   expiry_source=lambda: aws.expires_at(hyperpod.sts),
                   what=f"HyperPod cluster {cluster_name} (EKS cluster {eks_name})")

    def token(self) -> str:
        """The EKS token, made again a minute before its 15 minutes are up, or before the credentials it was
        signed with expire (an assumed role's: the last quarter of what they had left, at most a minute early)."""
        return self.token_until()[0]

    def token_until(self, ahead_s: float = 0.0) -> tuple[str, float]:
        """(the token, until when it is used: epoch seconds); renewed already when that is less than ``ahead_s``
        away."""
        with self._lock:
            now = time.time()
            if not self._token or now + ahead_s >= self._token_until:
                self._token = self._token_source()
                until = now + TOKEN_TTL_S
                expires = self._expiry_source() if self._expiry_source is not None else None
                if expires is not None:
                    left = max(0.0, expires - now)
                    until = min(until, now + left - min(60.0, left / 4))
                self._token_until = until
            return self._token, self._token_until

    def _refresh(self, cfg: k8s.Configuration) -> None:
        cfg.api_key = {"BearerToken": self.token()}

    def renew(self) -> str:
        """A token made now (the server refused the last one), which later requests use too."""
        with self._lock:
            self._token_until = 0.0
        return self.token()

    def kubeconfig(self, credential_file: str | Path | None = None) -> dict[str, Any]:
        """The kubeconfig of this access: the current token, or with ``credential_file`` an exec credential plugin
        that reads the token from that file (``write_credential``), so a long helm or kubectl command picks up
        the token renewed meanwhile (client-go runs the plugin again when the credential's
        ``expirationTimestamp`` passes, or on a 401)."""
        cluster: dict[str, Any] = {"server": self.endpoint, "certificate-authority-data": self.ca_data}
        user: dict[str, Any] = {"token": self.token()} if credential_file is None else {"exec": {
            "apiVersion": EXEC_API, "command": "cat", "args": [str(credential_file)], "interactiveMode": "Never"}}
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": self.eks_name,
            "clusters": [{"name": self.eks_name, "cluster": cluster}],
            "users": [{"name": "kvfleet", "user": user}],
            "contexts": [{"name": self.eks_name, "context": {"cluster": self.eks_name, "user": "kvfleet"}}],
        }

    def write_kubeconfig(self, directory: str | Path | None = None,
                         credential_file: str | Path | None = None) -> Path:
        """A private kubeconfig file (0600) for helm/kubectl; the caller deletes it."""
        fd, path = tempfile.mkstemp(prefix=f"kubeconfig-{self.eks_name}-", dir=directory)
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(self.kubeconfig(credential_file), fh)
        return Path(path)

    def write_credential(self, path: str | Path) -> str:
        """Write the current token as an ExecCredential (0600, replaced atomically) to ``path``; the token."""
        token, until = self.token_until()
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
        body = json.dumps({"apiVersion": EXEC_API, "kind": "ExecCredential",
                           "status": {"token": token, "expirationTimestamp": expires}})
        fd, tmp = tempfile.mkstemp(prefix=".credential-", dir=str(Path(path).parent))
        with os.fdopen(fd, "w") as fh:
            fh.write(body)
        os.replace(tmp, path)
        return token

    @contextlib.contextmanager
    def fresh_credential(self, directory: str | Path) -> Iterator[Path]:
        """An ExecCredential file in ``directory`` kept current while the block runs (a thread writes the renewed
        token as soon as ``token`` renews it), removed afterwards: what ``kubeconfig(credential_file)`` reads."""
        fd, name = tempfile.mkstemp(prefix=f"credential-{self.eks_name}-", dir=str(directory))
        os.close(fd)
        path = Path(name)
        stop = threading.Event()
        last = self.write_credential(path)

        def keep() -> None:
            # Renewed ahead of its time (a third of the token's life, at most two looks), and looked at more often
            # as that nears, so the file never holds a token whose time has passed, however short the
            # credentials' life.
            nonlocal last
            life = max(0.05, self._token_until - time.time())
            while not stop.wait(max(0.05, min(CREDENTIAL_CHECK_S, (self._token_until - time.time()) / 3))):
                try:
                    token, until = self.token_until(min(2 * CREDENTIAL_CHECK_S, life / 3))
                    if token != last:
                        life = max(0.05, until - time.time())
                        last = self.write_credential(path)
                except Exception as exc:  # the command then fails on its own 401, naming it; never silently
                    log.warning("renewing the EKS token of %s for helm failed: %s", self.eks_name, exc)

        thread = threading.Thread(target=keep, name=f"kvfleet-credential-{self.eks_name}", daemon=True)
        thread.start()
        try:
            yield path
        finally:
            stop.set()
            thread.join(timeout=10)
            path.unlink(missing_ok=True)

    # ---- pod proxy (vLLM API, Curvine master API) ---------------------------------------------------------
    def proxy_path(self, namespace: str, pod: str, port: int, path: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/{path.lstrip('/')}"

    def proxy_get_json(self, namespace: str, pod: str, port: int, path: str, timeout: float = 30) -> Any:
        resp = self._proxy("GET", namespace, pod, port, path, None, timeout)
        try:
            return json.loads(resp.data or b"null")
        finally:
            resp.release_conn()

    def proxy_stream(self, namespace: str, pod: str, port: int, path: str, body: dict[str, Any],
                     timeout: float = 120) -> Iterator[bytes]:
        """POST through the API-server pod proxy and yield the response body as it arrives."""
        resp = self._proxy("POST", namespace, pod, port, path, body, timeout)
        try:
            yield from resp.stream(4096, decode_content=False)
        finally:
            resp.release_conn()

    def _proxy(self, method: str, namespace: str, pod: str, port: int, path: str, body: Any, timeout: float) -> Any:
        what = f"{method} pod proxy {namespace}/{pod}:{port}/{path.lstrip('/')}"
        try:
            resp = self.api_client.call_api(
                self.proxy_path(namespace, pod, port, path), method,
                header_params={"Content-Type": "application/json", "Accept": "*/*"},
                body=body, auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=timeout, _return_http_data_only=True,
            )
        except ApiException as exc:
            raise api_error(exc, what) from exc
        return resp

    def close(self) -> None:
        self.api_client.close()
        Path(self._ca_file).unlink(missing_ok=True)


def sleep_or_stop(seconds: float, what: str) -> None:
    """Sleep, unless a stop is requested before (or during) the sleep: then raise ``StopRequested``."""
    if _STOP.wait(max(seconds, 0.0)):
        raise StopRequested(f"{what}: stopped waiting (SIGTERM)")


def wait_for(check: Callable[[], tuple[bool, str]], *, timeout_s: float, poll_s: float = 2.0, what: str,
             progress: Callable[[str], None] = log.info) -> str:
    """Poll ``check`` (returns done, observed-state text) until done; ``ConvergenceTimeout`` (temporary: the task
    is retried and observes again, see ``kvfleet.errors``) on timeout, with the last observed state. A check
    that sees a terminal failure raises a PermanentError itself. Logs progress with elapsed time."""
    started = time.monotonic()
    last_logged = -1e9
    while True:
        if _STOP.is_set():
            raise StopRequested(f"{what}: stopped waiting (SIGTERM)")
        done, state = check()
        elapsed = time.monotonic() - started
        if done:
            progress(f"{what}: {state} ({elapsed:.1f}s)")
            return state
        if elapsed > timeout_s:
            raise ConvergenceTimeout(f"{what}: not done after {timeout_s:.0f}s; last observed: {state}")
        if elapsed - last_logged >= 10:
            progress(f"{what}: waiting ({elapsed:.0f}s): {state}")
            last_logged = elapsed
        sleep_or_stop(poll_s, what)
