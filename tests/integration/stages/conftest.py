"""Stage reconcilers against the sandbox: the process environment points kvfleet's clients at the sandbox
exactly as the Airflow connections would in production (AWS endpoint, credentials); nothing else differs."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from twinenv import stage_contexts, use_twin

from kvfleet.fleet.inventory import Inventory, load_inventory
from kvfleet.stages.base import StageContext


@pytest.fixture
def fleet_env(sandbox, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return use_twin(sandbox, monkeypatch)


@pytest.fixture
def inventory(example_fleet) -> Inventory:  # type: ignore[no-untyped-def]
    return load_inventory(example_fleet)


@pytest.fixture
def make_ctx(fleet_env, inventory) -> Iterator[Callable[..., StageContext]]:  # type: ignore[no-untyped-def]
    with stage_contexts(inventory, "ml-stage-usw2") as make:
        yield make
