"""SageMaker HyperPod and EKS, through boto3 clients built by Airflow's AWS hook.

Called by the stage reconcilers (tiered storage, add-ons) and by ``clients.kube`` (which needs the EKS
endpoint to build a Kubernetes client). The hook honours the Airflow connection (``aws_default`` or a named
one, from any secrets backend) including its ``endpoint_url`` — that is the only thing that differs between a
real account and the sandbox.

Thin, typed wrapper in the style of the Amazon provider's hooks: "not found" is a state (``None``), terminal
states are module-level frozensets, and waiting fails at once on a terminal state that is not the target.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from kvfleet.clients import aws, waiters
from kvfleet.clients.identity import Identity
from kvfleet.errors import ConvergenceTimeout, PermanentError, TemporaryError
from kvfleet.fleet import constants as C
from kvfleet.fleet.cluster_ref import DEFAULT_ACCOUNT

log = logging.getLogger(__name__)

# The terminal and target states, from the waiter models (``clients.waiters``: the acceptors are the source).
CLUSTER_OK = waiters.expected(waiters.CLUSTER_IN_SERVICE, "success")
CLUSTER_FAILED = waiters.expected(waiters.CLUSTER_IN_SERVICE, "failure")
ADDON_OK = waiters.expected(waiters.ADDON_ACTIVE, "success")
ADDON_FAILED = waiters.expected(waiters.ADDON_ACTIVE, "failure")
# Retrying helps: throttling, conflicts with an update in flight, 5xx.
_RETRYABLE = frozenset({"ThrottlingException", "Throttling", "TooManyRequestsException", "ConflictException",
                        "ServiceUnavailable", "InternalFailure", "ServerException", "ResourceInUse",
                        "ResourceInUseException", "RequestLimitExceeded"})
_NOT_FOUND = frozenset({"ResourceNotFound", "ResourceNotFoundException", "ValidationException"})
# Mutating operations, used by dry-run reporting and by the RBAC/IAM derivation.
MUTATING_OPS = frozenset({"UpdateCluster", "CreateAddon", "UpdateAddon", "DeleteAddon"})


def classify(exc: ClientError, what: str) -> Exception:
    """Turn a botocore ClientError into kvfleet's error model with the AWS code and message."""
    err = exc.response.get("Error", {})
    code, msg = err.get("Code", "?"), err.get("Message", str(exc))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    text = f"{what}: AWS {code}: {msg}"
    if code in _RETRYABLE or status >= 500:
        return TemporaryError(text, delay=15)
    return PermanentError(text)


@dataclass(frozen=True)
class TieredStorage:
    mode: str
    memory_percent: int | None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any] | None) -> TieredStorage:
        if not raw:
            return cls("Disable", None)
        return cls(str(raw.get("Mode", "Disable")), raw.get("InstanceMemoryAllocationPercentage"))


@dataclass(frozen=True)
class HyperPodCluster:
    name: str
    arn: str
    status: str
    failure_message: str | None
    node_recovery: str | None
    tiered_storage: TieredStorage
    eks_cluster_arn: str | None
    instance_count: int

    @property
    def eks_cluster_name(self) -> str:
        if not self.eks_cluster_arn:
            raise PermanentError(f"HyperPod cluster {self.name} has no Orchestrator.Eks.ClusterArn: kvfleet "
                                 "manages EKS-orchestrated clusters only")
        return self.eks_cluster_arn.rsplit("/", 1)[-1]


def validate_tiered_storage(mode: str, percent: int | None) -> None:
    """botocore checks neither the enum nor the 20–100 range, so kvfleet does before calling."""
    if mode not in C.TIERED_MODES:
        raise PermanentError(f"TieredStorageConfig.Mode: {mode!r} is not one of Enable, Disable")
    if mode == "Enable" and (percent is None or not C.MEMORY_PERCENT_MIN <= percent <= C.MEMORY_PERCENT_MAX):
        raise PermanentError(
            f"TieredStorageConfig.InstanceMemoryAllocationPercentage: {percent} is outside 20–100 "
            "(HyperPod accepts 20–100); fix the inventory's tiered_storage.memory_percent"
        )


class HyperPodClient:
    """SageMaker (HyperPod) and EKS for one region."""

    def __init__(self, region: str, identity: Identity | str | None = "aws_default") -> None:
        self.region = region
        self.identity = identity if isinstance(identity, Identity) else Identity(conn_id=identity)
        self.sagemaker = aws.client("sagemaker", region, self.identity)
        self.eks = aws.client("eks", region, self.identity)
        self.sts = aws.client("sts", region, self.identity)

    # ---- HyperPod -----------------------------------------------------------------------------------------
    def _describe_cluster_raw(self, name: str) -> dict[str, Any]:
        """The DescribeCluster response, or the error response when the cluster does not exist (other errors are
        raised, classified)."""
        try:
            return dict(self.sagemaker.describe_cluster(ClusterName=name))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                return dict(exc.response)
            raise classify(exc, f"DescribeCluster {name}") from exc

    def describe_cluster(self, name: str) -> HyperPodCluster | None:
        raw = self._describe_cluster_raw(name)
        return None if "Error" in raw else _cluster_of(raw, name)

    def cluster_wait_state(self, name: str) -> tuple[waiters.State, HyperPodCluster | None]:
        """One look at the cluster, judged by the ``ClusterInService`` waiter model: (verdict, the cluster or
        None when it does not exist)."""
        raw = self._describe_cluster_raw(name)
        return waiters.state_of(waiters.CLUSTER_IN_SERVICE, raw), None if "Error" in raw else _cluster_of(raw, name)

    def require_cluster(self, name: str) -> HyperPodCluster:
        cluster = self.describe_cluster(name)
        if cluster is None:
            raise PermanentError(f"HyperPod cluster {name!r} not found in {self.region}; check the inventory's "
                                 "cluster name and region")
        return cluster

    def update_tiered_storage(self, name: str, mode: str, percent: int | None, node_recovery: str) -> None:
        """UpdateCluster with TieredStorageConfig, always sending NodeRecovery back: the service rejects
        tiered storage alone with ValidationException (observed behaviour,
        docs/reference/hyperpod.md#noderecovery-rule)."""
        validate_tiered_storage(mode, percent)
        if node_recovery not in C.NODE_RECOVERY_VALUES:
            raise PermanentError(f"NodeRecovery: {node_recovery!r} is not one of Automatic, None")
        config: dict[str, Any] = {"Mode": mode}
        if mode == "Enable":
            config["InstanceMemoryAllocationPercentage"] = percent
        try:
            self.sagemaker.update_cluster(ClusterName=name, TieredStorageConfig=config, NodeRecovery=node_recovery)
        except ClientError as exc:
            raise classify(exc, f"UpdateCluster {name}") from exc

    def list_cluster_nodes(self, name: str) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"ClusterName": name}
        while True:
            try:
                page = self.sagemaker.list_cluster_nodes(**kwargs)
            except ClientError as exc:
                raise classify(exc, f"ListClusterNodes {name}") from exc
            nodes.extend(page.get("ClusterNodeSummaries", []))
            if not page.get("NextToken"):
                return nodes
            kwargs["NextToken"] = page["NextToken"]

    def wait_cluster(self, name: str, *, timeout_s: float, poll_s: float = 5.0,
                     progress: Callable[[str], None] = log.info) -> HyperPodCluster:
        """Until the ``ClusterInService`` waiter model says success (``clients.waiters``; SageMaker has no
        cluster waiter of its own); fail at once on its failure states with the cluster's FailureMessage."""
        started = time.monotonic()
        while True:
            state, cluster = self.cluster_wait_state(name)
            elapsed = time.monotonic() - started
            if cluster is None:
                raise PermanentError(f"HyperPod cluster {name!r} not found in {self.region}; check the inventory's "
                                     "cluster name and region")
            if state == "success":
                progress(f"HyperPod {name}: {cluster.status} after {elapsed:.0f}s")
                return cluster
            if state == "failure":
                raise PermanentError(f"HyperPod cluster {name} is {cluster.status}: "
                                     f"{cluster.failure_message or 'no FailureMessage'}")
            if elapsed > timeout_s:
                raise ConvergenceTimeout(f"HyperPod cluster {name} still {cluster.status} after {timeout_s:.0f}s")
            progress(f"HyperPod {name}: {cluster.status}, waiting for InService ({elapsed:.0f}s)")
            time.sleep(poll_s)

    # ---- EKS ---------------------------------------------------------------------------------------------
    def describe_eks(self, name: str) -> dict[str, Any]:
        try:
            return dict(self.eks.describe_cluster(name=name)["cluster"])
        except ClientError as exc:
            raise classify(exc, f"EKS DescribeCluster {name}") from exc

    def _describe_addon_raw(self, cluster: str, addon: str) -> dict[str, Any]:
        try:
            return dict(self.eks.describe_addon(clusterName=cluster, addonName=addon))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("ResourceNotFoundException", "ResourceNotFound"):
                return dict(exc.response)
            raise classify(exc, f"DescribeAddon {addon}") from exc

    def describe_addon(self, cluster: str, addon: str) -> dict[str, Any] | None:
        raw = self._describe_addon_raw(cluster, addon)
        return None if "Error" in raw else dict(raw["addon"])

    def addon_wait_state(self, cluster: str, addon: str) -> tuple[waiters.State, dict[str, Any] | None]:
        """One look at the add-on, judged by the ``AddonActive`` waiter model: (verdict, the add-on or None)."""
        raw = self._describe_addon_raw(cluster, addon)
        return waiters.state_of(waiters.ADDON_ACTIVE, raw), None if "Error" in raw else dict(raw["addon"])

    def list_addons(self, cluster: str) -> list[str]:
        try:
            return list(self.eks.list_addons(clusterName=cluster).get("addons", []))
        except ClientError as exc:
            raise classify(exc, f"ListAddons {cluster}") from exc

    def create_addon(self, cluster: str, addon: str, version: str | None,
                     configuration: Mapping[str, Any] | None, resolve_conflicts: str) -> None:
        kwargs: dict[str, Any] = {"clusterName": cluster, "addonName": addon, "resolveConflicts": resolve_conflicts}
        if version:
            kwargs["addonVersion"] = version
        if configuration:
            kwargs["configurationValues"] = json.dumps(configuration, sort_keys=True)
        try:
            self.eks.create_addon(**kwargs)
        except ClientError as exc:
            raise classify(exc, f"CreateAddon {addon}") from exc

    def update_addon(self, cluster: str, addon: str, version: str | None,
                     configuration: Mapping[str, Any] | None, resolve_conflicts: str) -> None:
        kwargs: dict[str, Any] = {"clusterName": cluster, "addonName": addon, "resolveConflicts": resolve_conflicts}
        if version:
            kwargs["addonVersion"] = version
        if configuration is not None:
            kwargs["configurationValues"] = json.dumps(configuration, sort_keys=True)
        try:
            self.eks.update_addon(**kwargs)
        except ClientError as exc:
            raise classify(exc, f"UpdateAddon {addon}") from exc

    def wait_addon(self, cluster: str, addon: str, *, timeout_s: float, poll_s: float = 5.0,
                   progress: Callable[[str], None] = log.info) -> dict[str, Any]:
        """Until the ``AddonActive`` waiter model says success (``clients.waiters``: botocore's, plus the failure
        states it lacks), failing at once with the add-on's health issues."""
        started = time.monotonic()
        while True:
            verdict, state = self.addon_wait_state(cluster, addon)
            elapsed = time.monotonic() - started
            status = (state or {}).get("status", "MISSING")
            if verdict == "success":
                progress(f"add-on {addon}: {status} after {elapsed:.0f}s")
                return state or {}
            if verdict == "failure":
                raise PermanentError(f"EKS add-on {addon} on {cluster} is {status}: {health_issues(state)}")
            if elapsed > timeout_s:
                raise ConvergenceTimeout(f"EKS add-on {addon} on {cluster} still {status} after {timeout_s:.0f}s")
            progress(f"add-on {addon}: {status}, waiting for ACTIVE ({elapsed:.0f}s)")
            time.sleep(poll_s)

    def caller_identity(self) -> dict[str, Any]:
        try:
            return dict(self.sts.get_caller_identity())
        except ClientError as exc:
            raise classify(exc, "GetCallerIdentity") from exc

    def account_problem(self, name: str) -> str | None:
        """The account guard, read-only: why acting on HyperPod cluster ``name`` as this client would reach another
        account than the inventory's (``identity.account``; ``default``: the caller's own, whatever it is), or
        None. Both must agree with it: GetCallerIdentity's account, and the account in the cluster's ARN. A
        cluster that does not exist is left to the stages (they say it is not found)."""
        caller = self.caller_identity()
        acting, who = str(caller.get("Account", "")), str(caller.get("Arn", "?"))
        expected = acting if self.identity.account == DEFAULT_ACCOUNT else self.identity.account
        if acting != expected:
            return (f"the credentials ({self.identity.describe()}) act as {who} in account {acting}, but the "
                    f"inventory puts cluster {name} in account {expected}: fix the account's role_arn or "
                    "aws_conn_id (or the run's aws_conn_id); nothing was changed")
        cluster = self.describe_cluster(name)
        owner = cluster.arn.split(":")[4] if cluster is not None and cluster.arn.count(":") >= 5 else expected
        if owner != expected:
            return (f"HyperPod cluster {name} ({cluster.arn if cluster else '?'}) is in account {owner}, not the "
                    f"inventory's {expected} that the credentials act in ({who}); nothing was changed")
        return None


def _cluster_of(raw: Mapping[str, Any], name: str) -> HyperPodCluster:
    groups = raw.get("InstanceGroups") or []
    return HyperPodCluster(
        name=raw.get("ClusterName", name),
        arn=raw["ClusterArn"],
        status=raw["ClusterStatus"],
        failure_message=raw.get("FailureMessage") or None,
        node_recovery=raw.get("NodeRecovery"),
        tiered_storage=TieredStorage.from_api(raw.get("TieredStorageConfig")),
        eks_cluster_arn=(raw.get("Orchestrator") or {}).get("Eks", {}).get("ClusterArn"),
        instance_count=sum(int(g.get("CurrentCount") or 0) for g in groups),
    )


def health_issues(addon: Mapping[str, Any] | None) -> str:
    """An add-on's health issues, one line (``code: message; ...``)."""
    issues = "; ".join(f"{i.get('code')}: {i.get('message')}"
                       for i in ((addon or {}).get("health") or {}).get("issues", []))
    return issues or "no health issues"
