"""Preflight and NodeRecovery against the twin: the process environment points kvfleet's clients at the sandbox
exactly as the Airflow connections would in production (AWS endpoint, credentials); nothing else differs.

``prepared`` is the example fleet's sandbox with every prerequisite of ``kvfleet_sandbox.aws_prereqs`` created
(idempotent, so it holds whether or not the sandbox's start-up already seeded them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from preflightkit import CLUSTER

from kvfleet.fleet.inventory import Inventory, load_inventory
from kvfleet.stages.base import StageContext, Timeouts
from kvfleet_sandbox.aws_prereqs import seed_prerequisites


@pytest.fixture
def fleet_env(sandbox, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for key, value in sandbox.exports().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KVFLEET_POLL_SECONDS", "0.1")
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)  # boto3 reads AWS_ENDPOINT_URL natively
    return sandbox


@pytest.fixture
def inventory(example_fleet) -> Inventory:  # type: ignore[no-untyped-def]
    return load_inventory(example_fleet)


@pytest.fixture
def prepared(fleet_env, inventory):  # type: ignore[no-untyped-def]
    seed_prerequisites(fleet_env.aws, inventory.clusters)
    return fleet_env


@pytest.fixture
def make_ctx(fleet_env, inventory) -> Iterator[Callable[..., StageContext]]:  # type: ignore[no-untyped-def]
    made: list[StageContext] = []

    def make(cluster: str = CLUSTER, *, inv: Inventory | None = None, **kw: Any) -> StageContext:
        inv = inv or inventory
        ctx = StageContext(inventory=inv, cluster=inv.cluster(cluster), aws_conn_id=None,
                           timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=60, pvc_s=30), **kw)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        ctx.close()
