"""Stage 5's judges, pure: which two pods to probe, whether they agree before any request, the verdict of a probe,
and the diagnosis of a failed one.

Called by ``stages.verify`` (which does the I/O: listing pods, sending prompts, reading logs) and unit-tested
without a cluster (tests/unit/test_verify_judges.py). Pods are plain JSON dicts, as the API returns them.

Sources: DOMAIN.md stage 5 — two pods on two different nodes (one node cannot show cross-node reuse), a prompt
past LMCache's 256-token chunk, 100 % cross-pod hits on the published run; the speedup curve is
``fleet.economics.expected_speedup``. The env two pods must agree on is the L2 overlay's
(``fleet.overlay.Overlay.agree_env``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from kvfleet.fleet import lmcache_log
from kvfleet.fleet import overlay as ov
from kvfleet.fleet.endpoint_spec import pod_is_live

PASS_HIT_RATIO: Final = 0.99
# Relative: TTFT through the API-server proxy is noisy; 25 % below the curve still passes.
SPEEDUP_TOLERANCE: Final = 0.25

Env = Mapping[str, str | None]


def pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name"))


def _node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName"))


def pick_pods(pods: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | str:
    """Two Ready pods on different nodes (the first by name on each node), or the reason there are none.
    Terminating and finished pods are no replicas (``endpoint_spec.pod_is_live``)."""
    live = [p for p in pods if pod_is_live(p)]
    ready = [p for p in live if pod_ready(p)]
    if len(live) < 2:
        return f"only {len(live)} replica(s): cross-pod reuse needs two pods on two nodes"
    if len(ready) < 2:
        return f"only {len(ready)} of {len(live)} pods Ready"
    by_node: dict[str, Mapping[str, Any]] = {}
    for p in sorted(ready, key=_name):
        by_node.setdefault(_node(p), p)
    if len(by_node) < 2:
        return f"all {len(ready)} Ready pods run on one node ({next(iter(by_node))}): no cross-node reuse to verify"
    a, b = list(by_node.values())[:2]
    return a, b


def container_env(pod: Mapping[str, Any], container: str) -> Env:
    """The env of the vLLM container as the process sees it: the last entry of a name wins, as in Kubernetes."""
    _, c = ov.find_container(pod.get("spec") or {}, container)
    env: dict[str, str | None] = {}
    for e in c.get("env") or []:
        env[str(e.get("name"))] = e.get("value")
    return env


def env_mismatches(env_a: Env, env_b: Env, names: Sequence[str]) -> list[str]:
    """Every name of ``names`` (the overlay's ``agree_env``) on which the two pods differ."""
    return [f"{k}: pod A {env_a.get(k)!r} vs pod B {env_b.get(k)!r}" for k in names if env_a.get(k) != env_b.get(k)]


def diagnose(stored: int, hits: int, total: int, env_a: Env, scan_a: lmcache_log.LogScan, settings_seed: str) -> str:
    """Why a probe did not reach full hits, from what pod A stored and the env it runs with."""
    url = str(env_a.get(ov.ENV_REMOTE_URL) or "")
    if stored == 0:
        why = f" ({scan_a.errors[-1]})" if scan_a.errors else ""
        serde = env_a.get(ov.ENV_REMOTE_SERDE)
        return f"no store line: L2 not written (URL or serde){why}; URL={url!r}, serde={serde!r}"
    if hits == 0 and url.startswith(ov.OPERATOR_L2_SCHEME):
        return (f"0 hits: pods on the operator's node-local L2 URL ({ov.OPERATOR_L2_SCHEME}), not the shared "
                "Curvine fs://")
    if hits == 0 and env_a.get(ov.ENV_HASHSEED) != settings_seed:
        seed = env_a.get(ov.ENV_HASHSEED)
        return (f"stored on A but 0 hits on B with differing {ov.ENV_HASHSEED} (unset or random: {seed!r}); "
                f"each pod derives different LMCache keys — set {ov.ENV_HASHSEED}={settings_seed}")
    if hits == 0:
        return "stored on A but 0 hits on B: the pods do not share the L2 path (check the Curvine mount and PVC)"
    return f"partial hit: {hits}/{total} tokens"


def verdict_of(hit_ratio: float, speedup: float, expected: float, tolerance: float = SPEEDUP_TOLERANCE) -> str:
    """``pass`` (full hits, speedup not below the curve minus the tolerance), ``degraded`` (some hits), ``fail``."""
    if hit_ratio >= PASS_HIT_RATIO and speedup >= expected * (1 - tolerance):
        return "pass"
    if hit_ratio > 0:
        return "degraded"
    return "fail"
