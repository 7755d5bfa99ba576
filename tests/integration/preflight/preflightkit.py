"""Helpers for the preflight and NodeRecovery tests: AWS clients on the twin, and an inventory whose cluster says
whether ``node_recovery`` was declared."""

from __future__ import annotations

import dataclasses

import boto3

from kvfleet.fleet.inventory import Cluster, Inventory

CLUSTER = "ml-stage-usw2"


def aws_client(sandbox, service: str, region: str = "us-west-2"):  # type: ignore[no-untyped-def]
    return boto3.client(service, endpoint_url=sandbox.aws.url, region_name=region,
                        aws_access_key_id="sandbox-admin", aws_secret_access_key="sandbox-admin")


@dataclasses.dataclass(frozen=True)
class DeclaringCluster(Cluster):
    """A Cluster that says whether its ``node_recovery`` was written in the inventory (the field the
    inventory is to carry; until it does, this subclass stands in for a loaded one)."""

    node_recovery_declared: bool = False


def declaring(inv: Inventory, name: str, *, declared: bool, node_recovery: str | None = None) -> Inventory:
    clusters = []
    for cl in inv.clusters:
        if cl.name == name:
            values = {f.name: getattr(cl, f.name) for f in dataclasses.fields(Cluster)}
            values.pop("node_recovery_declared", None)  # once the inventory models it itself
            if node_recovery is not None:
                values["node_recovery"] = node_recovery
            cl = DeclaringCluster(**values, node_recovery_declared=declared)
        clusters.append(cl)
    return dataclasses.replace(inv, clusters=tuple(clusters))
