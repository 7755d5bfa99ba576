"""The rules of the stop flag (docs/reference/airflow.md#sigterm): which AWS operations are reads, which write-ahead
actions are undo steps that still run after a stop, and that the exemption is scoped to one thread's block."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from kvfleet.clients.hyperpod import MUTATING_OPS
from kvfleet.clients.stop import (
    StopRequested,
    allow_after_stop,
    is_read_only,
    refuse_if_stopped,
    request_stop,
    reset_stop,
)
from kvfleet.fleet import actions as A
from kvfleet.stages.base import undo_after_stop


@pytest.fixture(autouse=True)
def _no_stop_left() -> Iterator[None]:
    reset_stop()
    yield
    reset_stop()


def test_kvfleets_aws_changes_are_not_reads_and_its_reads_are() -> None:
    assert MUTATING_OPS and not any(is_read_only(op) for op in MUTATING_OPS)
    assert not any(is_read_only(op) for op in ("CreateCluster", "DeleteCluster", "TagResource", "PutRolePolicy"))
    assert all(is_read_only(op) for op in ("DescribeCluster", "ListClusterNodes", "DescribeAddon",
                                           "GetCallerIdentity", "AssumeRole", "ListAddons"))


def test_only_the_undo_steps_run_after_a_stop() -> None:
    flip = A.helm_upgrade("curvine", "curvine", "curvine", repo="r", version="1", values={"a": False},
                          why="format flags false")
    upgrade = A.helm_upgrade("curvine", "curvine", "curvine", repo="r", version="2", values={},
                             why="revision 3 0.3.2 -> 0.3.3")
    assert undo_after_stop(flip.kind, flip.target())
    assert not undo_after_stop(upgrade.kind, upgrade.target())
    assert all(undo_after_stop(k, "x") for k in ("restore_operator", "scale_up", "restore_rollout_strategy"))
    assert not any(undo_after_stop(k, "x") for k in ("pause_operator", "scale_down", "patch_deployment",
                                                    "set_rollout_strategy", "update_cluster", "create_addon",
                                                    "helm_install", "helm_rollback", "apply_iec"))


def test_the_exemption_covers_its_block_in_its_thread_only() -> None:
    refuse_if_stopped("before the stop")  # no stop: nothing refused
    request_stop()
    seen: list[str] = []

    def other() -> None:
        try:
            refuse_if_stopped("another thread's call")
        except StopRequested as exc:
            seen.append(str(exc))

    with allow_after_stop("restore_operator"):
        refuse_if_stopped("the restore")  # allowed
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen and "another thread's call: not started" in seen[0]
    with pytest.raises(StopRequested, match="the next call: not started"):
        refuse_if_stopped("the next call")
