"""Preflight and NodeRecovery against the twin: the process environment points kvfleet's clients at the sandbox
exactly as the Airflow connections would in production (AWS endpoint, credentials); nothing else differs.

``prepared`` is the example fleet's sandbox with every prerequisite of ``kvfleet_sandbox.aws_prereqs`` created
(idempotent, so it holds whether or not the sandbox's start-up already seeded them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from preflightkit import CLUSTER
from twinenv import stage_contexts, use_twin

from kvfleet.fleet.inventory import Inventory, load_inventory
from kvfleet.stages.base import StageContext
from kvfleet_sandbox.aws_prereqs import seed_prerequisites


@pytest.fixture
def fleet_env(sandbox, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return use_twin(sandbox, monkeypatch)


@pytest.fixture
def inventory(example_fleet) -> Inventory:  # type: ignore[no-untyped-def]
    return load_inventory(example_fleet)


@pytest.fixture
def prepared(fleet_env, inventory):  # type: ignore[no-untyped-def]
    seed_prerequisites(fleet_env.aws, inventory.clusters)
    return fleet_env


@pytest.fixture
def make_ctx(fleet_env, inventory) -> Iterator[Callable[..., StageContext]]:  # type: ignore[no-untyped-def]
    with stage_contexts(inventory, CLUSTER) as make:
        yield make
