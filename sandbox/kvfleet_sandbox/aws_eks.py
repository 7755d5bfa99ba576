"""Amazon EKS operations of the sandbox's AWS emulator: ``DescribeCluster`` and the add-on calls.

Called from :class:`kvfleet_sandbox.aws.AwsEmulator` for requests whose credential scope names ``eks``, and
for seeding (``kvfleet sandbox up`` registers each EKS cluster with the URL of its Kubernetes API emulator as
the ``endpoint``, which is how the production path HyperPod → EKS → Kubernetes reaches the sandbox unchanged).

Stage 2 of a rollout installs add-ons in order and waits for ``ACTIVE``; the Inference Operator add-on fails
when cert-manager is missing. Add-on transitions therefore pass through hooks (``on_addon_transition``) that
the simulated controllers use to decide success, and through injected faults. moto 5.2.5 has no add-on calls
at all.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import hashlib
import json
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvfleet.fleet.constants import OPERATOR_ADDON
from kvfleet_sandbox.aws_clock import Timers
from kvfleet_sandbox.aws_wire import AwsError, page_of

AddonHook = Callable[[str, str, dict[str, Any]], "str | None"]

KUBERNETES_VERSION = "1.31"
# Add-ons the sandbox's EKS knows, with the version installed when the request names none. Real EKS refuses a
# name outside its catalogue with InvalidParameterException; so does this one, so a typo fails here too.
DEFAULT_ADDON_VERSIONS: dict[str, str] = {
    "aws-mountpoint-s3-csi-driver": "v1.14.1-eksbuild.1",
    "aws-fsx-csi-driver": "v1.5.0-eksbuild.1",
    "metrics-server": "v0.7.2-eksbuild.1",
    "cert-manager": "v1.17.2-eksbuild.1",
    OPERATOR_ADDON: "v1.0.0-eksbuild.1",
    "vpc-cni": "v1.19.2-eksbuild.1",
    "aws-ebs-csi-driver": "v1.41.0-eksbuild.1",
    "coredns": "v1.11.4-eksbuild.2",
    "kube-proxy": "v1.31.3-eksbuild.2",
    "eks-pod-identity-agent": "v1.3.4-eksbuild.1",
}
RESOLVE_CONFLICTS = frozenset({"OVERWRITE", "NONE", "PRESERVE"})
_IN_FLIGHT = frozenset({"CREATING", "UPDATING", "DELETING"})
_PLACEHOLDER_CA = "-----BEGIN CERTIFICATE-----\nkvfleet-sandbox-placeholder-ca\n-----END CERTIFICATE-----\n"


def check_addon_request(params: dict[str, Any]) -> None:
    values = params.get("configurationValues")
    if values:
        try:
            json.loads(values)
        except ValueError as exc:
            raise AwsError(
                "InvalidParameterException",
                f"configurationValues is not valid JSON: {exc}",
                addonName=params.get("addonName"),
            ) from None
    conflicts = params.get("resolveConflicts")
    if conflicts is not None and conflicts not in RESOLVE_CONFLICTS:
        raise AwsError(
            "InvalidParameterException",
            f"resolveConflicts must be one of {sorted(RESOLVE_CONFLICTS)}, not {conflicts!r}",
        )


@dataclass
class Addon:
    name: str
    cluster: str
    arn: str
    version: str
    created_at: dt.datetime
    status: str = "CREATING"
    modified_at: dt.datetime | None = None
    configuration_values: str | None = None
    service_account_role_arn: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    issues: list[dict[str, Any]] = field(default_factory=list)
    generation: int = 0
    update_id: str | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "addonName": self.name,
            "clusterName": self.cluster,
            "status": self.status,
            "addonVersion": self.version,
            "health": {"issues": copy.deepcopy(self.issues)},
            "addonArn": self.arn,
            "createdAt": self.created_at,
            "modifiedAt": self.modified_at or self.created_at,
            "serviceAccountRoleArn": self.service_account_role_arn,
            "tags": dict(self.tags),
            "configurationValues": self.configuration_values,
        }


@dataclass
class EksCluster:
    name: str
    arn: str
    region: str
    endpoint: str
    created_at: dt.datetime
    ca_pem: str
    addons: dict[str, Addon] = field(default_factory=dict)
    updates: dict[str, dict[str, Any]] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "arn": self.arn,
            "createdAt": self.created_at,
            "version": KUBERNETES_VERSION,
            "endpoint": self.endpoint,
            "status": "ACTIVE",
            "platformVersion": "eks.20",
            "roleArn": f"arn:aws:iam::{self.arn.split(':')[4]}:role/{self.name}-eks-cluster-role",
            "certificateAuthority": {"data": base64.b64encode(self.ca_pem.encode()).decode()},
            "identity": {
                "oidc": {
                    "issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/"
                    f"{hashlib.md5(self.arn.encode()).hexdigest().upper()}"
                }
            },
            "kubernetesNetworkConfig": {"serviceIpv4Cidr": "172.20.0.0/16", "ipFamily": "ipv4"},
            "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP"},
            "tags": {},
        }


class EksService:
    """State and operations of EKS clusters and their add-ons; every method runs under the emulator's lock."""

    def __init__(
        self,
        *,
        account_id: str,
        lock: threading.RLock,
        timers: Timers,
        rng: random.Random,
        delay: Callable[[], float],
    ) -> None:
        self._account = account_id
        self._lock = lock
        self._timers = timers
        self._rng = rng
        self._delay = delay
        self.clusters: dict[str, EksCluster] = {}
        self.addon_hooks: list[AddonHook] = []
        self.addon_faults: dict[tuple[str, str], str] = {}
        self.operations: dict[str, Callable[[str, dict[str, Any]], dict[str, Any]]] = {
            "DescribeCluster": self.describe_cluster,
            "CreateAddon": self.create_addon,
            "DescribeAddon": self.describe_addon,
            "UpdateAddon": self.update_addon,
            "ListAddons": self.list_addons,
            "DeleteAddon": self.delete_addon,
            "DescribeUpdate": self.describe_update,
        }

    def arn(self, name: str, region: str) -> str:
        known = self.clusters.get(name)
        return known.arn if known else f"arn:aws:eks:{region}:{self._account}:cluster/{name}"

    def seed(self, name: str, region: str, endpoint: str, ca_pem: str | None) -> str:
        if name in self.clusters:
            raise ValueError(f"EKS cluster {name!r} already exists")
        cluster = EksCluster(
            name,
            f"arn:aws:eks:{region}:{self._account}:cluster/{name}",
            region,
            endpoint,
            self._timers.now(),
            ca_pem or _PLACEHOLDER_CA,
        )
        self.clusters[name] = cluster
        return cluster.arn

    def seed_addon(
        self,
        cluster_name: str,
        name: str,
        version: str | None,
        service_account_role_arn: str | None,
        configuration_values: str | None,
        *,
        replace: bool = False,
    ) -> str:
        """An add-on that is already ACTIVE (installed before kvfleet arrived); no hook fires."""
        cluster = self.find(cluster_name)
        if name not in DEFAULT_ADDON_VERSIONS:
            raise ValueError(f"the sandbox's EKS has no add-on {name!r}")
        if name in cluster.addons and not replace:
            raise ValueError(f"add-on {name!r} already exists on {cluster_name!r}")
        now = self._timers.now()
        addon = Addon(
            name=name,
            cluster=cluster.name,
            arn=f"arn:aws:eks:{cluster.region}:{self._account}:addon/{cluster.name}/{name}/{self._uuid()}",
            version=version or DEFAULT_ADDON_VERSIONS[name],
            created_at=now,
            status="ACTIVE",
            modified_at=now,
            configuration_values=configuration_values,
            service_account_role_arn=service_account_role_arn,
        )
        cluster.addons[name] = addon
        return addon.arn

    def find(self, name: str, region: str | None = None) -> EksCluster:
        cluster = self.clusters.get(name)
        if cluster is None or (region is not None and cluster.region != region):
            raise AwsError(
                "ResourceNotFoundException", f"No cluster found for name: {name}.", clusterName=name
            )
        return cluster

    def find_addon(self, cluster: EksCluster, name: str) -> Addon:
        addon = cluster.addons.get(name)
        if addon is None:
            raise AwsError(
                "ResourceNotFoundException",
                f"No addon: {name} found in cluster: {cluster.name}",
                clusterName=cluster.name,
                addonName=name,
            )
        return addon

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    # --- operations ----------------------------------------------------------------------------------------

    def describe_cluster(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"cluster": self.find(params["name"], region).describe()}

    def create_addon(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self.find(params["clusterName"], region)
        name = params["addonName"]
        if name not in DEFAULT_ADDON_VERSIONS:
            raise AwsError(
                "InvalidParameterException",
                f"Addon {name} specified is not supported in {KUBERNETES_VERSION} kubernetes version",
                clusterName=cluster.name,
                addonName=name,
            )
        if name in cluster.addons:
            raise AwsError(
                "ResourceInUseException",
                f"Addon already exists: {name}",
                clusterName=cluster.name,
                addonName=name,
            )
        check_addon_request(params)
        addon = Addon(
            name=name,
            cluster=cluster.name,
            arn=f"arn:aws:eks:{cluster.region}:{self._account}:addon/{cluster.name}/{name}/{self._uuid()}",
            version=params.get("addonVersion") or DEFAULT_ADDON_VERSIONS[name],
            created_at=self._timers.now(),
            configuration_values=params.get("configurationValues") or None,
            service_account_role_arn=params.get("serviceAccountRoleArn"),
            tags=dict(params.get("tags") or {}),
        )
        cluster.addons[name] = addon
        self._schedule(addon, "CREATE_FAILED")
        return {"addon": addon.describe()}

    def describe_addon(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self.find(params["clusterName"], region)
        return {"addon": self.find_addon(cluster, params["addonName"]).describe()}

    def update_addon(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self.find(params["clusterName"], region)
        addon = self.find_addon(cluster, params["addonName"])
        if addon.status in _IN_FLIGHT:
            raise AwsError(
                "ResourceInUseException",
                f"Addon {addon.name} is in {addon.status} state; wait until it settles.",
                clusterName=cluster.name,
                addonName=addon.name,
            )
        check_addon_request(params)
        update = self._record_update(cluster, params)
        addon.version = params.get("addonVersion") or addon.version
        if "configurationValues" in params:
            addon.configuration_values = params["configurationValues"] or None
        if "serviceAccountRoleArn" in params:
            addon.service_account_role_arn = params["serviceAccountRoleArn"] or None
        addon.status, addon.modified_at, addon.update_id = "UPDATING", self._timers.now(), update["id"]
        self._schedule(addon, "UPDATE_FAILED")
        return {"update": copy.deepcopy(update)}

    def _record_update(self, cluster: EksCluster, params: dict[str, Any]) -> dict[str, Any]:
        wire = (
            ("addonVersion", "AddonVersion"),
            ("serviceAccountRoleArn", "ServiceAccountRoleArn"),
            ("resolveConflicts", "ResolveConflicts"),
            ("configurationValues", "ConfigurationValues"),
        )
        update = {
            "id": self._uuid(),
            "status": "InProgress",
            "type": "AddonUpdate",
            "params": [{"type": kind, "value": params[key]} for key, kind in wire if key in params],
            "createdAt": self._timers.now(),
            "errors": [],
        }
        cluster.updates[str(update["id"])] = update
        return update

    def list_addons(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self.find(params["clusterName"], region)
        page, token = page_of(
            sorted(cluster.addons),
            params.get("maxResults"),
            params.get("nextToken"),
            code="InvalidParameterException",
        )
        return {"addons": page, "nextToken": token}

    def delete_addon(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self.find(params["clusterName"], region)
        addon = self.find_addon(cluster, params["addonName"])
        addon.status, addon.generation = "DELETING", addon.generation + 1
        generation = addon.generation
        self._timers.after(
            self._delay(),
            lambda: self._remove(cluster.name, addon.name, generation),
            f"delete addon {cluster.name}/{addon.name}",
        )
        return {"addon": addon.describe()}

    def describe_update(self, region: str, params: dict[str, Any]) -> dict[str, Any]:
        cluster = self.find(params["name"], region)
        update = cluster.updates.get(params["updateId"])
        if update is None:
            raise AwsError(
                "ResourceNotFoundException",
                f"No update found for ID: {params['updateId']}",
                clusterName=cluster.name,
            )
        return {"update": copy.deepcopy(update)}

    # --- transitions ---------------------------------------------------------------------------------------

    def _schedule(self, addon: Addon, failed_status: str) -> None:
        addon.generation += 1
        generation, cluster, name = addon.generation, addon.cluster, addon.name
        self._timers.after(
            self._delay(),
            lambda: self._settle(cluster, name, generation, failed_status),
            f"addon {cluster}/{name}",
        )

    def _current(self, cluster: str, name: str, generation: int) -> Addon | None:
        found = self.clusters.get(cluster)
        addon = found.addons.get(name) if found else None
        return addon if addon is not None and addon.generation == generation else None

    def _settle(self, cluster: str, name: str, generation: int, failed_status: str) -> None:
        with self._lock:
            addon = self._current(cluster, name, generation)
            if addon is None:
                return
            snapshot = addon.describe()
            problem = self.addon_faults.pop((cluster, name), None)
        # Hooks run without the lock: they may ask the emulator about other add-ons (cert-manager's status).
        for hook in list(self.addon_hooks):
            if problem is not None:
                break
            problem = hook(cluster, name, copy.deepcopy(snapshot))
        with self._lock:
            addon = self._current(cluster, name, generation)
            if addon is None:
                return
            addon.modified_at = self._timers.now()
            addon.status = "ACTIVE" if problem is None else failed_status
            addon.issues = (
                []
                if problem is None
                else [{"code": "InternalFailure", "message": problem, "resourceIds": []}]
            )
            self._close_update(self.clusters[cluster], addon, problem)

    def _close_update(self, cluster: EksCluster, addon: Addon, problem: str | None) -> None:
        update = cluster.updates.get(addon.update_id or "")
        if update is None or update["status"] != "InProgress":
            return
        update["status"] = "Successful" if problem is None else "Failed"
        if problem is not None:
            update["errors"] = [
                {"errorCode": "Unknown", "errorMessage": problem, "resourceIds": [addon.name]}
            ]

    def _remove(self, cluster: str, name: str, generation: int) -> None:
        with self._lock:
            if self._current(cluster, name, generation) is not None:
                del self.clusters[cluster].addons[name]
