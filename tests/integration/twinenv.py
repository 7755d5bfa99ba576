"""Pointing this process at a sandbox (the twin) the way the Airflow connections point kvfleet at a real fleet,
and the stage contexts the integration tests work with. Shared by the fixtures of tests/integration/stages,
tests/integration/preflight and test_kyverno_install.py (importable from any test under tests/integration:
pytest puts this directory on ``sys.path`` with its conftest)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvfleet.fleet.inventory import Inventory
from kvfleet.stages.base import StageContext, Timeouts
from kvfleet_sandbox.runtime import Sandbox


def use_twin(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    """The sandbox's exports in the environment (AWS endpoint, credentials, kube access), a 0.1 s poll, and no
    Airflow AWS connection (boto3 reads ``AWS_ENDPOINT_URL`` natively)."""
    for key, value in sandbox.exports().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KVFLEET_POLL_SECONDS", "0.1")
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
    return sandbox


@contextlib.contextmanager
def stage_contexts(inventory: Inventory, default_cluster: str) -> Iterator[Callable[..., StageContext]]:
    """``make(cluster=default_cluster, *, inv=None, **kw) -> StageContext`` (no Airflow AWS connection, 60 s
    waits); every context made is closed on exit."""
    made: list[StageContext] = []

    def make(cluster: str = default_cluster, *, inv: Inventory | None = None, **kw: Any) -> StageContext:
        inv = inv or inventory
        ctx = StageContext(inventory=inv, cluster=inv.cluster(cluster), aws_conn_id=None,
                           timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=60, pvc_s=30), **kw)
        made.append(ctx)
        return ctx

    try:
        yield make
    finally:
        for ctx in made:
            ctx.close()
