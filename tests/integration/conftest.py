"""Fixtures shared by every integration test: sandboxes started from an inventory, and Kubernetes clients for them.

A sandbox is cheap (about 0.2 s for the example fleet) and its controllers mutate cluster state, so every fixture
here is function-scoped: no test sees another test's pods, faults or request counters. Whatever a fixture
starts, it stops at teardown, so no port is left listening.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvfleet.fleet.inventory import Inventory
from kvfleet_sandbox.runtime import Sandbox, eks_token, start_sandbox
from kvfleet_sandbox.twin import SandboxSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_FLEET = ROOT / "tests" / "fleets" / "twin.yaml"

SandboxFactory = Callable[..., Sandbox]


@pytest.fixture
def sandbox_factory(tmp_path: Path) -> Iterator[SandboxFactory]:
    """``make(fleet_text_or_path=None, *, controllers=None, **settings_overrides) -> Sandbox``.

    ``fleet_text_or_path``: None (the suite's fleet, tests/fleets/twin.yaml), a path, YAML text (anything with a newline) or
    an :class:`Inventory`. ``controllers``: a tuple of controller module names (default all of
    ``CONTROLLER_MODULES``; ``()`` for bare emulators). Other keywords override :class:`SandboxSettings` fields.
    """
    made: list[Sandbox] = []

    def make(fleet_text_or_path: str | Path | Inventory | None = None, *,
             controllers: tuple[str, ...] | None = None, **settings_overrides: Any) -> Sandbox:
        index = len(made)
        fleet: str | Path | Inventory
        if fleet_text_or_path is None:
            fleet = EXAMPLE_FLEET
        elif isinstance(fleet_text_or_path, str) and "\n" in fleet_text_or_path:
            fleet = tmp_path / f"fleet-{index}.yaml"
            fleet.write_text(fleet_text_or_path)
        else:
            fleet = fleet_text_or_path
        sandbox = start_sandbox(fleet, tmp_path / f"sandbox-{index}", SandboxSettings(**settings_overrides),
                                controllers=controllers)
        made.append(sandbox)
        return sandbox

    try:
        yield make
    finally:
        for sandbox in reversed(made):
            sandbox.stop()


@pytest.fixture
def sandbox(sandbox_factory: SandboxFactory) -> Sandbox:
    """The example fleet (2 clusters, 28 GPU nodes) with every controller attached."""
    return sandbox_factory()


KubeApi = Callable[[Sandbox, str], Any]


@pytest.fixture
def kube_api() -> Iterator[KubeApi]:
    """``kube_api(sandbox, cluster) -> kubernetes.client.ApiClient`` with an EKS-style bearer token, as kvfleet's
    own client would build it from EKS DescribeCluster; closed at teardown."""
    from kubernetes import client

    clients: list[Any] = []

    def make(sandbox: Sandbox, cluster: str) -> Any:
        twin = sandbox.twin(cluster)
        config = client.Configuration()
        config.host = sandbox.servers[cluster].url
        config.api_key = {"authorization": f"Bearer {eks_token(twin.region)}"}
        api = client.ApiClient(config)
        clients.append(api)
        return api

    try:
        yield make
    finally:
        for api in clients:
            api.close()
