"""SageMaker HyperPod cluster operations of the sandbox's AWS emulator.

Called from :class:`kvfleet_sandbox.aws.AwsEmulator`, which decodes the HTTP request and hands the parameters
here (``CreateCluster``, ``DescribeCluster``, ``UpdateCluster``, ``ListClusters``, ``ListClusterNodes``, and
``AddTags``/``ListTags``/``DeleteTags`` on a cluster's ARN: the tags IAM conditions read as ``aws:ResourceTag``),
and which also seeds clusters directly for ``kvfleet sandbox up``.

It exists because kvfleet's stage 1 (tiered storage) depends on behaviour no stock fake has: the
``TieredStorageConfig``, ``NodeRecovery`` and ``Orchestrator`` settings kept and returned, ``UpdateCluster``
going ``Updating`` → ``InService``, and the service-side rules the sources give
(docs/reference/hyperpod.md#noderecovery-rule): ``TieredStorageConfig`` alone is refused with ``ValidationException``,
the memory percentage must be 20..100, and ``Mode`` must be ``Enable`` or ``Disable`` (botocore checks neither the
maximum nor the enum client-side).
"""

from __future__ import annotations

import copy
import datetime as dt
import random
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvfleet.fleet.constants import (
    MEMORY_PERCENT_DEFAULT,
    MEMORY_PERCENT_MAX,
    MEMORY_PERCENT_MIN,
    NODE_RECOVERY_DEFAULT,
    NODE_RECOVERY_VALUES,
    TIERED_MODES,
)
from kvfleet_sandbox.aws_clock import Timers
from kvfleet_sandbox.aws_wire import AwsError, page_of

TieredStorageHook = Callable[[str, str, dict[str, Any]], None]

# Members of ClusterInstanceGroupSpecification that DescribeCluster returns unchanged.
_GROUP_ECHO = (
    "LifeCycleConfig",
    "ExecutionRole",
    "ThreadsPerCore",
    "InstanceStorageConfigs",
    "OnStartDeepHealthChecks",
    "TrainingPlanArn",
)
_SETTLED = ("InService", "Failed")


def _invalid(value: Any, where: str, constraint: str) -> AwsError:
    # The shape of the real service's field-validation message.
    return AwsError(
        "ValidationException",
        f"1 validation error detected: Value '{value}' at '{where}' failed to satisfy constraint: "
        f"{constraint}",
    )


def check_tiered_storage(config: dict[str, Any] | None) -> None:
    """Mode ∈ {Enable, Disable} and percentage 20..100 (AWS docs and the blog; the model only says 0..100)."""
    if config is None:
        return
    mode = config.get("Mode")
    if mode not in TIERED_MODES:
        raise _invalid(
            mode,
            "tieredStorageConfig.mode",
            f"Member must satisfy enum value set: [{', '.join(sorted(TIERED_MODES))}]",
        )
    percent = config.get("InstanceMemoryAllocationPercentage")
    if percent is not None and not MEMORY_PERCENT_MIN <= percent <= MEMORY_PERCENT_MAX:
        bound = (
            ("greater than or equal to", MEMORY_PERCENT_MIN)
            if percent < MEMORY_PERCENT_MIN
            else ("less than or equal to", MEMORY_PERCENT_MAX)
        )
        raise _invalid(
            percent,
            "tieredStorageConfig.instanceMemoryAllocationPercentage",
            f"Member must have value {bound[0]} {bound[1]}",
        )


def check_node_recovery(value: str | None) -> None:
    if value is not None and value not in NODE_RECOVERY_VALUES:
        raise _invalid(
            value,
            "nodeRecovery",
            f"Member must satisfy enum value set: [{', '.join(sorted(NODE_RECOVERY_VALUES))}]",
        )


def check_update_request(params: dict[str, Any]) -> None:
    """Service-side rules of UpdateCluster, in the order the service would report them."""
    check_tiered_storage(params.get("TieredStorageConfig"))
    check_node_recovery(params.get("NodeRecovery"))
    if "TieredStorageConfig" in params and not ("NodeRecovery" in params or "InstanceGroups" in params):
        # Blog-only rule (docs/reference/hyperpod.md#noderecovery-rule): observed service behaviour, not in the API
        # model.
        raise AwsError(
            "ValidationException",
            "UpdateCluster with TieredStorageConfig alone is not supported: also pass NodeRecovery "
            "(the cluster's current value from DescribeCluster changes nothing) or InstanceGroups.",
        )


def normalised_tiered(config: dict[str, Any] | None) -> dict[str, Any] | None:
    if config is None:
        return None
    kept = copy.deepcopy(config)
    if kept.get("Mode") == "Enable":
        # Assumption: the service fills the documented default when Enable comes without a percentage.
        kept.setdefault("InstanceMemoryAllocationPercentage", MEMORY_PERCENT_DEFAULT)
    return kept


@dataclass
class Node:
    instance_id: str
    group: str
    instance_type: str
    launch_time: dt.datetime
    private_dns: str

    def summary(self) -> dict[str, Any]:
        return {
            "InstanceGroupName": self.group,
            "InstanceId": self.instance_id,
            "InstanceType": self.instance_type,
            "LaunchTime": self.launch_time,
            "InstanceStatus": {"Status": "Running", "Message": ""},
            "PrivateDnsHostname": self.private_dns,
        }


@dataclass
class InstanceGroup:
    name: str
    instance_type: str
    target: int
    current: int = 0
    status: str = "InService"
    echo: dict[str, Any] = field(default_factory=dict)

    def details(self) -> dict[str, Any]:
        return {
            "InstanceGroupName": self.name,
            "InstanceType": self.instance_type,
            "CurrentCount": self.current,
            "TargetCount": self.target,
            "Status": self.status,
            **copy.deepcopy(self.echo),
        }


@dataclass
class HyperPodCluster:
    name: str
    arn: str
    region: str
    creation_time: dt.datetime
    groups: dict[str, InstanceGroup]
    orchestrator: dict[str, Any] | None
    node_recovery: str | None
    tiered_storage: dict[str, Any] | None
    status: str = "InService"
    failure_message: str | None = None
    nodes: list[Node] = field(default_factory=list)
    generation: int = 0
    tags: dict[str, str] = field(default_factory=dict)  # CreateCluster's Tags and AddTags (what ListTags answers)

    @property
    def eks_cluster_name(self) -> str | None:
        arn = ((self.orchestrator or {}).get("Eks") or {}).get("ClusterArn")
        return arn.rsplit("/", 1)[-1] if arn else None

    def describe(self) -> dict[str, Any]:
        return {
            "ClusterArn": self.arn,
            "ClusterName": self.name,
            "ClusterStatus": self.status,
            "CreationTime": self.creation_time,
            "FailureMessage": self.failure_message,
            "InstanceGroups": [g.details() for g in self.groups.values()],
            "Orchestrator": copy.deepcopy(self.orchestrator),
            "NodeRecovery": self.node_recovery,
            "TieredStorageConfig": copy.deepcopy(self.tiered_storage),
        }

    def summary(self) -> dict[str, Any]:
        return {
            "ClusterArn": self.arn,
            "ClusterName": self.name,
            "CreationTime": self.creation_time,
            "ClusterStatus": self.status,
        }


@dataclass
class _PendingUpdate:
    generation: int
    groups: dict[str, InstanceGroup]
    node_recovery: str | None
    tiered_storage: dict[str, Any] | None
    failure: str | None


class HyperPodService:
    """State and operations of SageMaker HyperPod clusters; every method runs under the emulator's lock."""

    def __init__(
        self,
        *,
        account_id: str,
        lock: threading.RLock,
        timers: Timers,
        rng: random.Random,
        delay: Callable[[], float],
        eks_arn: Callable[[str, str], str],
    ) -> None:
        self._account = account_id
        self._lock = lock
        self._timers = timers
        self._rng = rng
        self._delay = delay
        self._eks_arn = eks_arn
        self.clusters: dict[str, HyperPodCluster] = {}
        self.tiered_hooks: list[TieredStorageHook] = []
        self.update_faults: dict[str, str] = {}
        self.operations: dict[str, Callable[[str, dict[str, Any]], dict[str, Any]]] = {
            "CreateCluster": self.create_cluster,
            "DescribeCluster": self.describe_cluster,
            "UpdateCluster": self.update_cluster,
            "ListClusters": self.list_clusters,
            "ListClusterNodes": self.list_cluster_nodes,
            "AddTags": self.add_tags,
            "ListTags": self.list_tags,
            "DeleteTags": self.delete_tags,
        }

    # --- lookups and construction --------------------------------------------------------------------------

    def find(self, name_or_arn: str, region: str | None = None) -> HyperPodCluster:
        name = name_or_arn
        if name_or_arn.startswith("arn:"):
            name = next((c.name for c in self.clusters.values() if c.arn == name_or_arn), name_or_arn)
        cluster = self.clusters.get(name)
        if cluster is None or (region is not None and cluster.region != region):
            raise AwsError("ResourceNotFound", f"Cluster '{name_or_arn}' not found.")
        return cluster

    def lookup(self, name_or_arn: str) -> HyperPodCluster | None:
        """The cluster by name or ARN, or None (IAM authorization reads its ARN and tags)."""
        try:
            return self.find(name_or_arn)
        except AwsError:
            return None

    def _arn(self, region: str) -> str:
        suffix = "".join(self._rng.choices(string.ascii_lowercase + string.digits, k=12))
        return f"arn:aws:sagemaker:{region}:{self._account}:cluster/{suffix}"

    def _new_node(self, group: InstanceGroup, region: str, now: dt.datetime) -> Node:
        instance_id = "i-" + "".join(self._rng.choices("0123456789abcdef", k=17))
        ip = ".".join(str(self._rng.randint(1, 254)) for _ in range(2))
        return Node(
            instance_id,
            group.name,
            group.instance_type,
            now,
            f"ip-10-1-{ip.replace('.', '-')}.{region}.compute.internal",
        )

    def _scale_nodes(self, cluster: HyperPodCluster) -> None:
        now = self._timers.now()
        kept: list[Node] = []
        for group in cluster.groups.values():
            mine = [n for n in cluster.nodes if n.group == group.name][: group.target]
            mine += [self._new_node(group, cluster.region, now) for _ in range(group.target - len(mine))]
            group.current = len(mine)
            kept += mine
        cluster.nodes = kept

    def _groups_from(
        self, specs: list[dict[str, Any]], existing: dict[str, InstanceGroup]
    ) -> dict[str, InstanceGroup]:
        groups = {name: copy.deepcopy(group) for name, group in existing.items()}
        for spec in specs:
            name = spec["InstanceGroupName"]
            old = groups.get(name)
            instance_type = spec.get("InstanceType") or (old.instance_type if old else None)
            if instance_type is None:
                raise AwsError(
                    "ValidationException", f"InstanceType is required for instance group '{name}'."
                )
            if old is not None and instance_type != old.instance_type:
                raise AwsError(
                    "ValidationException",
                    f"InstanceType of instance group '{name}' cannot be changed "
                    f"({old.instance_type} -> {instance_type}).",
                )
            echo = {k: copy.deepcopy(spec[k]) for k in _GROUP_ECHO if k in spec}
            groups[name] = InstanceGroup(
                name,
                instance_type,
                int(spec["InstanceCount"]),
                current=old.current if old else 0,
                echo=echo or (old.echo if old else {}),
            )
        return groups

    def seed(
        self,
        *,
        name: str,
        region: str,
        eks_cluster_name: str,
        instance_groups: list[dict[str, Any]],
        node_recovery: str,
        tiered_storage: dict[str, Any] | None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """A cluster that already exists and is InService (no request is logged and no hook fires)."""
        if name in self.clusters:
            raise ValueError(f"HyperPod cluster {name!r} already exists")
        check_node_recovery(node_recovery)
        check_tiered_storage(tiered_storage)
        cluster = HyperPodCluster(
            name=name,
            arn=self._arn(region),
            region=region,
            creation_time=self._timers.now(),
            groups=self._groups_from(instance_groups, {}),
            orchestrator={"Eks": {"ClusterArn": self._eks_arn(eks_cluster_name, region)}},
            node_recovery=node_recovery,
            tiered_storage=normalised_tiered(tiered_storage),
            tags=dict(tags or {}),
        )
        self._scale_nodes(cluster)
        self.clusters[name] = cluster
        return cluster.arn

    # --- operations ----------------------------------------------------------------------------------------

    def create_cluster(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        name = params["ClusterName"]
        if name in self.clusters:
            raise AwsError("ResourceInUse", f"Cluster '{name}' already exists.")
        check_tiered_storage(params.get("TieredStorageConfig"))
        check_node_recovery(params.get("NodeRecovery"))
        groups = self._groups_from(params.get("InstanceGroups", []), {})
        for group in groups.values():
            group.status = "Creating"
        cluster = HyperPodCluster(
            name=name,
            arn=self._arn(region),
            region=region,
            creation_time=self._timers.now(),
            groups=groups,
            orchestrator=copy.deepcopy(params.get("Orchestrator")),
            node_recovery=params.get("NodeRecovery", NODE_RECOVERY_DEFAULT),
            tiered_storage=None,
            status="Creating",
            tags={str(t["Key"]): str(t.get("Value", "")) for t in params.get("Tags") or []},
        )
        self.clusters[name] = cluster
        pending = _PendingUpdate(
            cluster.generation,
            groups,
            cluster.node_recovery,
            normalised_tiered(params.get("TieredStorageConfig")),
            None,
        )
        self._timers.after(self._delay(), lambda: self._finish(name, pending), f"create {name}")
        return {"ClusterArn": cluster.arn}

    def describe_cluster(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.find(params["ClusterName"], region).describe()

    def update_cluster(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self.find(params["ClusterName"], region)
        check_update_request(params)
        if cluster.status not in _SETTLED:
            raise AwsError(
                "ConflictException",
                f"Cluster '{cluster.name}' is in {cluster.status} status; wait until it is InService.",
            )
        groups = self._groups_from(params.get("InstanceGroups", []), cluster.groups)
        for doomed in params.get("InstanceGroupsToDelete", []):
            if groups.pop(doomed, None) is None:
                raise AwsError("ValidationException", f"Instance group '{doomed}' does not exist.")
        cluster.generation += 1
        cluster.status, cluster.failure_message = "Updating", None
        for name in {g["InstanceGroupName"] for g in params.get("InstanceGroups", [])} & set(cluster.groups):
            cluster.groups[name].status, cluster.groups[name].target = "Updating", groups[name].target
        pending = _PendingUpdate(
            cluster.generation,
            groups,
            params.get("NodeRecovery", cluster.node_recovery),
            normalised_tiered(params["TieredStorageConfig"]) if "TieredStorageConfig" in params else None,
            self.update_faults.pop(cluster.name, None),
        )
        self._timers.after(
            self._delay(), lambda: self._finish(cluster.name, pending), f"update {cluster.name}"
        )
        return {"ClusterArn": cluster.arn}

    def list_clusters(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        found = [
            c
            for c in self.clusters.values()
            if c.region == region and params.get("NameContains", "") in c.name
        ]
        by_name = params.get("SortBy") == "Name"
        found.sort(
            key=lambda c: c.name if by_name else c.creation_time.timestamp(),
            reverse=params.get("SortOrder", "Descending") == "Descending",
        )
        page, token = page_of(
            [c.summary() for c in found],
            params.get("MaxResults"),
            params.get("NextToken"),
            code="ValidationException",
        )
        return {"ClusterSummaries": page, "NextToken": token}

    def list_cluster_nodes(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self.find(params["ClusterName"], region)
        wanted = params.get("InstanceGroupNameContains", "")
        nodes = [n.summary() for n in cluster.nodes if wanted in n.group]
        if params.get("SortBy") == "Name":
            nodes.sort(key=lambda n: n["InstanceId"], reverse=params.get("SortOrder") == "Descending")
        page, token = page_of(
            nodes, params.get("MaxResults"), params.get("NextToken"), code="ValidationException"
        )
        return {"ClusterNodeSummaries": page, "NextToken": token}

    # SageMaker's tagging calls (AddTags, ListTags, DeleteTags) on a HyperPod cluster's ARN; other resource types
    # are not emulated.
    def _tagged(self, arn: str) -> HyperPodCluster:
        cluster = next((c for c in self.clusters.values() if c.arn == arn), None)
        if cluster is None:
            raise AwsError("ResourceNotFound", f"Resource '{arn}' not found.")
        return cluster

    def add_tags(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self._tagged(params["ResourceArn"])
        cluster.tags.update({str(t["Key"]): str(t.get("Value", "")) for t in params.get("Tags") or []})
        return {"Tags": [{"Key": k, "Value": v} for k, v in cluster.tags.items()]}

    def list_tags(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        tags = [{"Key": k, "Value": v} for k, v in self._tagged(params["ResourceArn"]).tags.items()]
        page, token = page_of(tags, params.get("MaxResults"), params.get("NextToken"), code="ValidationException")
        return {"Tags": page, "NextToken": token}

    def delete_tags(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self._tagged(params["ResourceArn"])
        for key in params.get("TagKeys") or []:
            cluster.tags.pop(str(key), None)
        return {}

    # --- transitions ---------------------------------------------------------------------------------------

    def _finish(self, name: str, pending: _PendingUpdate) -> None:
        with self._lock:
            cluster = self.clusters.get(name)
            if cluster is None or cluster.generation != pending.generation:
                return  # superseded by a later request
            if pending.failure is not None:
                cluster.status, cluster.failure_message = "Failed", pending.failure
                for group in cluster.groups.values():
                    group.status, group.target = "InService", group.current
                return
            cluster.groups = pending.groups
            for group in cluster.groups.values():
                group.status = "InService"
            self._scale_nodes(cluster)
            cluster.node_recovery = pending.node_recovery
            if pending.tiered_storage is not None:
                cluster.tiered_storage = pending.tiered_storage
            cluster.status = "InService"
            eks_name = cluster.eks_cluster_name or ""
        if pending.tiered_storage is not None:
            for hook in list(self.tiered_hooks):
                hook(name, eks_name, copy.deepcopy(pending.tiered_storage))
