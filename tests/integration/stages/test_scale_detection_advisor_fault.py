"""The scale-out detection when the L2 advisor fails (``curvine_scale.detect``): the advisor can only raise the
target, so its failure never blocks what the judge found on GPU nodes and usage; the decision says the advisor
failed and why.

The fault is a real one, in the advisor's first read: its previous observations (named query ``advise_previous``
on ``step_events``) cannot be read because another session holds the table's lock (what a migration's ``ALTER
TABLE`` or a ``VACUUM FULL`` does) and the history store's connections give up after a lock timeout. The
detection's own read (the previous capacity snapshot, ``capacity_snapshots``) is not blocked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from kvfleet.fleet.inventory import load_inventory
from kvfleet.history.repos import HistoryRepos
from kvfleet.stages import advise, curvine_scale
from kvfleet.stages.base import StageContext

CLUSTER = "ml-stage-usw2"
GIB = 2**30


@pytest.fixture
def step_events_locked(history: HistoryRepos, fresh_db_url: str) -> Iterator[HistoryRepos]:
    """A history store whose statements wait at most 0.5 s for a lock, while another session holds
    ``step_events`` exclusively (an open transaction); released at the end."""
    holder = create_engine(fresh_db_url)
    impatient = create_engine(fresh_db_url, connect_args={"options": "-c lock_timeout=500"})
    with holder.connect() as conn:
        tx = conn.begin()
        conn.execute(text("LOCK TABLE step_events IN ACCESS EXCLUSIVE MODE"))
        try:
            yield HistoryRepos.on(impatient)
        finally:
            tx.rollback()
    impatient.dispose()
    holder.dispose()


def _state(*, usage: float) -> curvine_scale.PoolState:
    """Two workers on three eligible GPU nodes (one joined without a worker), at ``usage`` of the capacity."""
    capacity = 2 * 100 * GIB
    return curvine_scale.PoolState(
        revision=3, chart_version="0.2.1", values={}, replicas=2,
        eligible=["gpu-0", "gpu-1", "gpu-2"], ineligible={},
        with_worker={"curvine-worker-0": "gpu-0", "curvine-worker-1": "gpu-1"}, worker_bytes=100 * GIB,
        overview={"capacity": capacity, "fs_used": int(usage * capacity), "live_workers": 2})


def test_the_detection_decides_on_nodes_and_usage_when_the_advisor_fails(history: HistoryRepos, step_events_locked,  # type: ignore[no-untyped-def]
                                                                         example_fleet) -> None:
    inv = load_inventory(example_fleet)
    # the previous capacity snapshot was above the threshold too: usage counts (one spike is not a trend)
    history.runs.start("t/scale", dag_id="t", run_id="scale", trigger="test", triggered_by=None, params={})
    history.curvine.record_capacity(run_key="t/scale", step="scale", cluster=CLUSTER, phase="after",
                            overview={"capacity": 200 * GIB, "fs_used": 180 * GIB, "live_workers": 2})
    said: list[str] = []
    ctx = StageContext(inventory=inv, cluster=inv.cluster(CLUSTER), history=step_events_locked, aws_conn_id=None,
                       progress=said.append)
    try:
        # the fault is real: the advisor itself raises (its previous observations cannot be read)
        with pytest.raises(OperationalError, match="lock timeout"):
            advise.with_advised_workers(ctx, {"due": False, "reasons": [], "target": 2}, replicas=2, eligible=3,
                                        worker_bytes=100 * GIB)
        decision: dict[str, Any] = curvine_scale.detect(ctx, _state(usage=0.95), curvine_scale.ScaleRequest())
    finally:
        ctx.close()
    # the judge's decision on nodes and usage stands: one worker per eligible node
    assert decision["due"] is True and decision["target"] == 3, decision
    assert any("1 GPU node(s) without a Curvine worker: gpu-2" in r for r in decision["reasons"]), decision
    assert any("fs_used/capacity 95% above 80% (and 90% at the previous snapshot)" in r
               for r in decision["reasons"]), decision
    # and it says the advisor failed, and why
    assert decision["advisor"].startswith("advisor failed: OperationalError"), decision
    assert "lock timeout" in decision["advisor"]
    assert "advised_workers" not in decision
    assert any("L2 advisor unavailable for the scale-out detection (OperationalError" in line
               and "deciding on GPU nodes and usage alone" in line for line in said), said
