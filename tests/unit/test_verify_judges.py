"""Stage 5's pure judges (fleet.verdict): pod choice, env agreement, verdict and diagnosis, without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from kvfleet.fleet import constants as C
from kvfleet.fleet import lmcache_log
from kvfleet.fleet.inventory import Endpoint, Settings
from kvfleet.fleet.overlay import desired_overlay
from kvfleet.fleet.verdict import (
    PASS_HIT_RATIO,
    SPEEDUP_TOLERANCE,
    container_env,
    diagnose,
    env_mismatches,
    pick_pods,
    verdict_of,
)

S = Settings()
EP = Endpoint(name="chat", namespace="retail", lob="retail", cluster="c", model="m", instance_type="ml.g6e.4xlarge")
AGREE = desired_overlay(EP, S).agree_env


def pod(name: str, node: str, *, ready: bool = True, phase: str = "Running", deleting: bool = False,
        env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "proxy"}, {"name": "chat", "env": env or []}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_pick_pods_takes_two_ready_pods_on_two_nodes() -> None:
    picked = pick_pods([pod("c-2", "n1"), pod("c-1", "n1"), pod("c-3", "n2")])
    assert not isinstance(picked, str)
    assert (picked[0]["metadata"]["name"], picked[1]["metadata"]["name"]) == ("c-1", "c-3")


@pytest.mark.parametrize(("pods", "reason"), [
    ([pod("c-1", "n1")], "only 1 replica(s)"),
    ([pod("c-1", "n1"), pod("c-2", "n2", deleting=True)], "only 1 replica(s)"),  # terminating: no replica
    ([pod("c-1", "n1"), pod("c-2", "n2", phase="Succeeded")], "only 1 replica(s)"),
    ([pod("c-1", "n1"), pod("c-2", "n2", ready=False)], "only 1 of 2 pods Ready"),
    ([pod("c-1", "n1"), pod("c-2", "n1")], "all 2 Ready pods run on one node (n1)"),
])
def test_pick_pods_says_why_there_is_no_pair(pods: list[dict[str, Any]], reason: str) -> None:
    got = pick_pods(pods)
    assert isinstance(got, str) and got.startswith(reason)


def test_the_env_precheck_is_the_overlays_and_the_last_entry_wins() -> None:
    assert AGREE == (C.ENV_REMOTE_URL, C.ENV_REMOTE_SERDE, C.ENV_HASHSEED, C.ENV_CHUNK_SIZE)
    a = container_env(pod("a", "n1", env=[{"name": C.ENV_HASHSEED, "value": "7"},
                                          {"name": C.ENV_HASHSEED, "value": "0"}]), "chat")
    b = container_env(pod("b", "n2", env=[{"name": C.ENV_HASHSEED, "value": "1"}]), "chat")
    assert a[C.ENV_HASHSEED] == "0"
    assert env_mismatches(a, b, AGREE) == [f"{C.ENV_HASHSEED}: pod A '0' vs pod B '1'"]
    assert env_mismatches(a, a, AGREE) == []


@pytest.mark.parametrize(("ratio", "speedup", "verdict"), [
    (1.0, 2.0, "pass"), (PASS_HIT_RATIO, 2.0 * (1 - SPEEDUP_TOLERANCE), "pass"), (1.0, 1.0, "degraded"),
    (0.5, 3.0, "degraded"), (0.0, 3.0, "fail"),
])
def test_verdict_of(ratio: float, speedup: float, verdict: str) -> None:
    assert verdict_of(ratio, speedup, expected=2.0) == verdict


def test_diagnose_names_the_cause() -> None:
    none = lmcache_log.LogScan(errors=["zip() argument 2 is shorter than argument 1"])
    env = {C.ENV_REMOTE_URL: S.l2_url, C.ENV_REMOTE_SERDE: "cachegen", C.ENV_HASHSEED: "0"}
    assert diagnose(0, 0, 2000, env, none, "0").startswith("no store line: L2 not written (URL or serde) (zip()")
    operator = {**env, C.ENV_REMOTE_URL: C.OPERATOR_L2_URL}
    assert "node-local L2 URL" in diagnose(2000, 0, 2000, operator, lmcache_log.LogScan(), "0")
    seedless = {k: v for k, v in env.items() if k != C.ENV_HASHSEED}
    assert "set PYTHONHASHSEED=0" in diagnose(2000, 0, 2000, seedless, lmcache_log.LogScan(), "0")
    assert "do not share the L2 path" in diagnose(2000, 0, 2000, env, lmcache_log.LogScan(), "0")
    assert diagnose(2000, 1000, 2000, env, lmcache_log.LogScan(), "0") == "partial hit: 1000/2000 tokens"
