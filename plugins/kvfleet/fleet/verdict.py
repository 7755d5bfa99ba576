"""Stage 5's judges, pure: which two pods to probe, whether they agree before any request, the verdict of a probe,
and the diagnosis of a failed one.

Called by ``stages.verify`` (which does the I/O: listing pods, sending prompts, reading logs) and unit-tested
without a cluster (tests/unit/test_verify_judges.py). Pods are plain JSON dicts, as the API returns them.

Sources: the blog's stage 5 (docs/reference/vllm.md#published-figures) — two pods on two different nodes (one node
cannot show cross-node reuse), a prompt past LMCache's 256-token chunk, 100 % cross-pod hits on the published run; the
speedup curve is ``fleet.economics.expected_speedup``. The env two pods must agree on is the L2 overlay's
(``fleet.overlay.Overlay.agree_env``).

Own baseline: the g6e "expected" curve reuses the blog's end-to-end multi-turn figures (1.22x at
530 tokens, 1.34x at 2,114), so judging g6e on it hardly tests speed. An endpoint's first sweep after its last
rollout (stage 4 changed it) becomes its recorded baseline; ``degraded`` then also means "slower than its own
baseline by the tolerance". The published curve stays in force where one was measured (``PUBLISHED_SPEED_TYPES``,
the blog's ml.g5.4xlarge TTFT-vs-length run).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from kvfleet.fleet import economics, lmcache_log
from kvfleet.fleet import overlay as ov
from kvfleet.fleet.constants import ENV_HASHSEED, ENV_REMOTE_SERDE, ENV_REMOTE_URL, OPERATOR_L2_SCHEME
from kvfleet.fleet.endpoint_spec import pod_is_live

PASS_HIT_RATIO: Final = 0.99
# Relative: TTFT through the API-server proxy is noisy; 25 % below the curve still passes.
SPEEDUP_TOLERANCE: Final = 0.25
# Instance types whose expected curve is a published TTFT-vs-prompt-length measurement
# (docs/reference/vllm.md#published-figures: ml.g5.4xlarge, 500-3,000 tokens). Elsewhere the expected curve is a
# stand-in and the endpoint's own baseline is the real test.
PUBLISHED_SPEED_TYPES: Final = frozenset({"ml.g5.4xlarge"})
MIN_BASELINE_POINTS: Final = 2  # a baseline needs two full-hit sweep lengths to interpolate between

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
    url = str(env_a.get(ENV_REMOTE_URL) or "")
    if stored == 0:
        why = f" ({scan_a.errors[-1]})" if scan_a.errors else ""
        serde = env_a.get(ENV_REMOTE_SERDE)
        return f"no store line: L2 not written (URL or serde){why}; URL={url!r}, serde={serde!r}"
    if hits == 0 and url.startswith(OPERATOR_L2_SCHEME):
        return (f"0 hits: pods on the operator's node-local L2 URL ({OPERATOR_L2_SCHEME}), not the shared "
                "Curvine fs://")
    if hits == 0 and env_a.get(ENV_HASHSEED) != settings_seed:
        seed = env_a.get(ENV_HASHSEED)
        return (f"stored on A but 0 hits on B with differing {ENV_HASHSEED} (unset or random: {seed!r}); "
                f"each pod derives different LMCache keys — set {ENV_HASHSEED}={settings_seed}")
    if hits == 0:
        return "stored on A but 0 hits on B: the pods do not share the L2 path (check the Curvine mount and PVC)"
    return f"partial hit: {hits}/{total} tokens"


def verdict_of(hit_ratio: float, speedup: float, expected: float, tolerance: float = SPEEDUP_TOLERANCE,
               baseline: float | None = None) -> str:
    """``pass`` (full hits, speedup not below the curve minus the tolerance, nor below the endpoint's own
    ``baseline`` speedup minus the tolerance when it has one), ``degraded`` (some hits), ``fail``."""
    fast = speedup >= expected * (1 - tolerance) and (baseline is None or speedup >= baseline * (1 - tolerance))
    if hit_ratio >= PASS_HIT_RATIO and fast:
        return "pass"
    if hit_ratio > 0:
        return "degraded"
    return "fail"


def baseline_from_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The endpoint's recorded baseline: of the sweep rows recorded after its last rollout (``at``, ``run_key``,
    ``prompt_tokens``, ``speedup``, ``hit_ratio``), the earliest run's full-hit points. ``None`` when no sweep
    run has ``MIN_BASELINE_POINTS`` of them (a sweep with misses says nothing about speed)."""
    runs: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        runs.setdefault(str(r.get("run_key")), []).append(r)
    for run_key, rs in sorted(runs.items(), key=lambda kv: min(str(x.get("at")) for x in kv[1])):
        points = sorted({int(r["prompt_tokens"]): float(r["speedup"]) for r in rs
                         if r.get("prompt_tokens") and r.get("speedup") and float(r["speedup"]) > 0
                         and float(r.get("hit_ratio") or 0) >= PASS_HIT_RATIO}.items())
        if len(points) >= MIN_BASELINE_POINTS:
            return {"run_key": run_key, "at": str(min(str(x.get("at")) for x in rs)), "points": points}
    return None


def baseline_speedup(baseline: Mapping[str, Any] | None, tokens: int) -> float | None:
    """The baseline's speedup at ``tokens`` (interpolated between its sweep points, flat outside them)."""
    if not baseline or len(baseline.get("points") or ()) < MIN_BASELINE_POINTS:
        return None
    points = [(int(n), float(x)) for n, x in baseline["points"]]
    return round(economics.interpolate(points, tokens), 3)
