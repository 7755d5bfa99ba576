"""Drift-check scenarios share one sandbox per module: converging a cluster and rolling endpoints out is the
expensive part, and every scenario puts back what it broke (or the next check proves it did, by resolving).

The process environment points kvfleet's clients at the sandbox exactly as Airflow connections would."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from driftkit import PROD, small_inventory

from kvfleet.fleet.inventory import Inventory
from kvfleet.stages.base import StageContext, Timeouts


@pytest.fixture(scope="module")
def drift_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    inv = small_inventory()
    sandbox = start_sandbox(inv, tmp_path_factory.mktemp("drift-sandbox"), SandboxSettings(time_scale=0.005))
    with pytest.MonkeyPatch.context() as mp:
        for key, value in sandbox.exports().items():
            mp.setenv(key, value)
        mp.setenv("KVFLEET_POLL_SECONDS", "0.05")
        mp.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)  # boto3 reads AWS_ENDPOINT_URL natively
        try:
            yield sandbox
        finally:
            sandbox.stop()


@pytest.fixture(scope="module")
def drift_history(pg) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """A migrated history database for the module (findings carry over between a module's checks)."""
    from sqlalchemy import create_engine, text

    from kvfleet.history.db import dispose_engines, get_engine
    from kvfleet.history.repos import HistoryRepos

    name = f"t_{uuid.uuid4().hex[:12]}"
    pg.ensure_database(name)
    yield HistoryRepos.on(get_engine(pg.url(name)))
    dispose_engines()
    admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="module")
def drift_ctx(drift_sandbox) -> Iterator[Callable[..., StageContext]]:  # type: ignore[no-untyped-def]
    """``make(cluster, *, inv=None, history=None, step_key=None)``: one context per cluster (and inventory) for
    the module, so its AWS and Kubernetes clients are built once; each call sets the run it records into."""
    made: dict[tuple[str, int], StageContext] = {}

    def make(cluster: str = PROD, *, inv: Inventory | None = None, history: Any = None,
             step_key: Any = None) -> StageContext:
        inv = inv or drift_sandbox.inventory
        key = (cluster, id(inv))
        if key not in made:
            made[key] = StageContext(inventory=inv, cluster=inv.cluster(cluster), aws_conn_id=None,
                                     timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=60, pvc_s=30))
        ctx = made[key]
        ctx.history, ctx.step_key = history, step_key
        return ctx

    yield make
    for ctx in made.values():
        ctx.close()
