"""Helpers for the preflight and NodeRecovery tests: AWS clients on the twin, and an inventory whose cluster declares
``node_recovery`` or not (``Cluster.node_recovery`` None: not declared)."""

from __future__ import annotations

import boto3

from kvfleet.fleet.inventory import Inventory

CLUSTER = "ml-stage-usw2"


def aws_client(sandbox, service: str, region: str = "us-west-2"):  # type: ignore[no-untyped-def]
    return boto3.client(service, endpoint_url=sandbox.aws.url, region_name=region,
                        aws_access_key_id="sandbox-admin", aws_secret_access_key="sandbox-admin")


def declaring(inv: Inventory, name: str, *, declared: bool, node_recovery: str = "Automatic") -> Inventory:
    """``inv`` with cluster ``name`` declaring ``node_recovery`` (``declared``) or declaring none."""
    clusters = [cl.model_copy(update={"node_recovery": node_recovery if declared else None}) if cl.name == name
                else cl for cl in inv.clusters]
    return inv.model_copy(update={"clusters": clusters})
