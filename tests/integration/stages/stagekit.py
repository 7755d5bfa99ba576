"""Helpers for stage tests: mutating-call counters and inventory tweaks."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvfleet.fleet.inventory import Inventory

MUTATING_K8S = {"create", "update", "patch", "delete", "deletecollection"}
MUTATING_AWS = {"UpdateCluster", "CreateAddon", "UpdateAddon", "DeleteAddon", "CreateCluster"}


def mutating_calls(sandbox, cluster: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    store = sandbox.twin(cluster).store
    k8s = [r for r in store.request_log if r.verb in MUTATING_K8S and not r.dry_run]
    aws = [op for op in sandbox.aws.operations() if op in MUTATING_AWS]
    return {"k8s": [(r.verb, r.resource, r.namespace, r.name) for r in k8s], "aws": aws}


def reset_counters(sandbox) -> None:  # type: ignore[no-untyped-def]
    for twin in sandbox.twins.values():
        twin.store.reset_request_log()
    sandbox.aws.reset_request_log()


def with_cluster(inv: Inventory, name: str, **changes: Any) -> Inventory:
    clusters = tuple(dataclasses.replace(c, **changes) if c.name == name else c for c in inv.clusters)
    return dataclasses.replace(inv, clusters=clusters)
