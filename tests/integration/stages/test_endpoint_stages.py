"""Stage 4 (safe patch batched per wave, Kyverno mode) and stage 5 (cross-pod hit verification), against the
sandbox's simulated operator, Kyverno, Curvine and vLLM/LMCache pods."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from stagekit import (
    converge_cluster,
    endpoint,
    mutating_calls,
    reset_counters,
    tamper_deployment_env,
    wait_pods_ready,
    with_cluster,
    without_overlay,
)

from kvfleet.errors import PermanentError, TemporaryError
from kvfleet.fleet import constants as C
from kvfleet.history.keys import StepKey
from kvfleet.stages import endpoints, executor, operator_pause, verify

pytestmark = pytest.mark.integration
PROD = "ml-prod-use1"  # patch mode, ml.g6e.4xlarge
STAGE_CLUSTER = "ml-stage-usw2"  # kyverno mode, ml.g5.4xlarge


def _url_entries(twin: Any, ep: Any) -> list[str]:
    dep = twin.store.get("apps", "deployments", ep.name, ep.namespace)
    c = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == ep.name)
    return [e["value"] for e in c["env"] if e["name"] == C.ENV_REMOTE_URL]


def test_patch_mode_fresh_endpoint_verifies_and_a_second_run_changes_nothing(  # type: ignore[no-untyped-def]
        fleet_env, make_ctx, inventory, history) -> None:
    history.runs.start("t/ep", dag_id="t", run_id="ep", trigger="test", triggered_by=None, params={})
    ctx = converge_cluster(make_ctx, PROD, history=history)
    ctx.step_key = StepKey("t/ep", "wave")
    ep = endpoint(inventory, PROD, "retail-assistant")
    twin = fleet_env.twin(PROD)
    (out,) = endpoints.reconcile_wave(ctx, [ep], holder="t/ep")
    assert out.outcome == "changed"
    assert _url_entries(twin, ep) == [C.L2_URL]
    assert operator_pause.pause_state(ctx)["ready"] >= 1 and operator_pause.pause_state(ctx)["paused_by"] is None
    for pod in twin.store.list("", "pods", ep.namespace, label_selector=f"app={ep.name}"):
        vllm = next(c for c in pod["spec"]["containers"] if c["name"] == ep.name)
        assert [e["value"] for e in vllm["env"] if e["name"] == C.ENV_REMOTE_URL] == [C.L2_URL]

    result: Any = verify.verify_endpoint(ctx, ep, 2000)
    assert result.verdict == "pass", result
    assert result.hit_ratio == 1.0 and result.stored_tokens == 2000
    assert result.speedup >= result.expected_speedup * (1 - verify.SPEEDUP_TOLERANCE)
    assert result.detail["node_a"] != result.detail["node_b"]  # the two probed pods sit on different nodes

    audit = [s["step"] for s in history.runs.steps("t/ep") if s["stage"] == "operator"]
    assert audit == ["operator_pause:t/ep", "operator_restore:t/ep"]

    reset_counters(fleet_env)
    (again,) = endpoints.reconcile_wave(make_ctx(PROD), [ep], holder="t/ep2")
    assert again.outcome == "unchanged"
    assert mutating_calls(fleet_env, PROD) == {"k8s": [], "aws": []}


def _admin(sandbox: Any, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(sandbox.admin.url + "/fault", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)



def test_failure_between_pause_and_restore_still_restores_the_operator(  # type: ignore[no-untyped-def]
        fleet_env, make_ctx, inventory, history) -> None:
    """scale-to-zero: the first call after every endpoint of the wave is at 0 fails (a 409 injected through the
    twin's admin fault API at that moment); both go back to their replicas, then the operator is restored."""
    inv = with_cluster(inventory, PROD, update_strategy="scale-to-zero")
    history.runs.start("t/drill", dag_id="t", run_id="drill", trigger="test", triggered_by=None, params={})
    ctx = converge_cluster(make_ctx, PROD, inv=inv, history=history)
    ctx.step_key = StepKey("t/drill", "wave")
    eps = [endpoint(inv, PROD, "retail-assistant"), endpoint(inv, PROD, "payments-disputes")]
    without_overlay(fleet_env, ctx, eps, PROD)
    at_zero: set[str] = set()

    def on_event(kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
        # Runs in the API server's thread before it answers the scale call: the fault is in place before
        # kvfleet makes its next request.
        key = f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
        if resource == "deployments" and key in {e.key for e in eps} and obj["spec"].get("replicas") == 0 \
                and key not in at_zero:
            at_zero.add(key)
            if len(at_zero) == len(eps):
                _admin(fleet_env, {"cluster": PROD, "kind": "api_conflict", "count": 1, "resource": "deployments",
                                   "target": "kube"})

    fleet_env.twin(PROD).store.subscribe(on_event)
    try:
        with pytest.raises(TemporaryError, match="injected conflict"):
            endpoints.reconcile_wave(ctx, eps, holder="t/drill")
    finally:
        at_zero.update(e.key for e in eps)  # the subscriber stays registered: make it inert
    state = operator_pause.pause_state(ctx)
    assert state["paused_by"] is None and state["ready"] >= 1
    steps = {s["step"]: s for s in history.runs.steps("t/drill")}
    wave = steps["wave_state:t/drill"]
    assert wave["outcome"] == "failed"
    assert set(wave["detail"]["states"].values()) == {"scaled_to_0"}
    assert wave["detail"]["scaled_back"] == {e.key: "scaled back to 2" for e in eps}
    assert steps["operator_restore:t/drill"]["detail"]["restored"] is True
    twin = fleet_env.twin(PROD)
    assert [twin.store.get("apps", "deployments", e.name, e.namespace)["spec"]["replicas"] for e in eps] == [2, 2]
    # What was applied, in order: both scaled back, and only then the operator restored.
    applied = executor.journal(ctx)
    assert [type(a).__name__ for a in applied[-3:]] == ["Scale", "Scale", "RestoreOperator"]
    assert {(a.name, a.replicas) for a in applied[-3:-1]} == {(e.name, 2) for e in eps}  # type: ignore[union-attr]
    assert not any(type(a).__name__ == "PatchDeployment" for a in applied)


def test_verification_diagnoses(fleet_env, make_ctx, inventory) -> None:  # type: ignore[no-untyped-def]
    inv = inventory.model_copy(update={"endpoints": [
        e.model_copy(update={"replicas": 1}) if e.name == "support-summaries" and e.cluster == PROD else e
        for e in inventory.endpoints]})
    twin = fleet_env.twin(PROD)
    # The probes are timed on the twin's model clock: the verdicts below are the model's, whatever the load of
    # the machine (wall time once gave a false pass under a full suite run).
    ctx = converge_cluster(make_ctx, PROD, inv=inv, probe_clock=twin.services["vllm"].model_clock)
    single = endpoint(inv, PROD, "support-summaries")
    seedless = endpoint(inv, PROD, "retail-assistant")
    cachegen = endpoint(inv, PROD, "payments-disputes")
    endpoints.reconcile_wave(ctx, [single, seedless, cachegen], holder="t/diag")

    one: Any = verify.verify_endpoint(ctx, single, 2000)
    assert one.verdict == "unverifiable" and "only 1 replica" in one.diagnosis

    with pytest.raises(PermanentError, match="300 is too short to verify L2.*at least 512"):
        verify.verify_endpoint(ctx, seedless, 300)

    # A slow L2 (hits, but late): one slow pair is measured again; the median of three pairs is judged.
    twin.services["vllm"].set_l2_read_penalty(600)
    r: Any = verify.verify_endpoint(ctx, seedless, 2000)
    twin.services["vllm"].set_l2_read_penalty(0)
    assert r.hit_ratio == 1.0 and r.verdict == "degraded", r
    assert len(r.detail["speedup_samples"]) == verify.SPEEDUP_SAMPLES_ON_DOUBT
    samples = r.detail["speedup_samples"]
    assert all(s["speedup"] < r.expected_speedup * (1 - verify.SPEEDUP_TOLERANCE) for s in samples)
    assert all(s["hit_ratio"] == 1.0 for s in samples)  # every re-measured pair was a full L2 hit as well
    assert sorted(s["speedup"] for s in samples)[1] == r.speedup  # the median is judged
    assert r.diagnosis.startswith("full hits but speedup") and "median of 3 pairs" in r.diagnosis
    assert r.ttft_warm_ms > r.ttft_cold_ms

    tamper_deployment_env(twin, seedless, remove=(C.ENV_HASHSEED,))
    wait_pods_ready(twin, seedless, 2, absent=(C.ENV_HASHSEED,))
    r = verify.verify_endpoint(ctx, seedless, 2000)
    assert r.verdict == "fail" and r.stored_tokens > 0 and r.hit_tokens == 0
    assert "PYTHONHASHSEED" in r.diagnosis and "stored on A but 0 hits on B" in r.diagnosis

    tamper_deployment_env(twin, cachegen, set_env={C.ENV_REMOTE_SERDE: "cachegen"})
    wait_pods_ready(twin, cachegen, 2, env={C.ENV_REMOTE_SERDE: "cachegen"})
    r = verify.verify_endpoint(ctx, cachegen, 2000)
    assert r.verdict == "fail" and r.stored_tokens == 0
    assert r.diagnosis.startswith("no store line: L2 not written (URL or serde)")


def test_kyverno_mode_injection_survives_a_forced_rerender(fleet_env, make_ctx, inventory) -> None:  # type: ignore[no-untyped-def]
    ctx = converge_cluster(make_ctx, STAGE_CLUSTER)
    ep = endpoint(inventory, STAGE_CLUSTER, "retail-assistant")
    twin = fleet_env.twin(STAGE_CLUSTER)
    (out,) = endpoints.reconcile_wave(ctx, [ep], holder="t/kyv")
    assert out.outcome == "changed"
    assert _url_entries(twin, ep) == [C.L2_URL]
    assert operator_pause.pause_state(ctx)["paused_by"] is None  # no pause in kyverno mode

    applied = twin.services["kyverno"].applied
    before = sum(applied.values())
    assert twin.services["operator"].rerender_now(ep.namespace, ep.name)
    import time

    operator = twin.services["operator"]
    deadline = time.monotonic() + 20
    # Until the operator's re-render passed through admission again and was written: the forced re-render is
    # cleared only once the rendered Deployment is in the store (an event, not a fixed sleep).
    while sum(applied.values()) == before or (ep.namespace, ep.name) in operator._forced:
        assert time.monotonic() < deadline, "the operator did not re-render"
        time.sleep(0.05)
    assert _url_entries(twin, ep) == [C.L2_URL]
    assert [v for v in endpoints.endpoint_violations(ctx, ep) if v.startswith("deployment")] == []
    result: Any = verify.verify_endpoint(ctx, ep, 2000)  # the default tolerance: the twin's TTFT is deterministic
    assert result.hit_ratio == 1.0 and result.verdict == "pass", result
