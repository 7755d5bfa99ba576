"""The drift check against the sandbox: each kind produced through the real APIs, found with the right fields,
recorded (opened, touched, resolved), remediated by the rollout's reconcilers, and a converged fleet left alone.

One sandbox and one history database per module; the scenarios run in file order and each ends with the fleet
converged again (the next scenario's first check proves it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from driftkit import PROD, STAGE

from kvfleet.fleet import constants as C
from kvfleet.fleet import drift as rules
from kvfleet.history.keys import StepKey
from kvfleet.stages import addons, curvine, drift, endpoints, tiered_storage

pytestmark = pytest.mark.integration
MUTATING_K8S = {"create", "update", "patch", "delete", "deletecollection"}
MUTATING_AWS = {"UpdateCluster", "CreateAddon", "UpdateAddon", "DeleteAddon", "CreateCluster"}
_runs = iter(range(1, 1000))


def _run_ctx(drift_ctx: Any, history: Any, cluster: str = PROD, **kw: Any) -> Any:
    run_key = f"kvfleet_drift_check/t{next(_runs)}"
    history.runs.start(run_key, dag_id="kvfleet_drift_check", run_id=run_key, trigger="test", triggered_by=None,
                      params={})
    return drift_ctx(cluster, history=history, step_key=StepKey(run_key, "check_cluster"), **kw)


def _check(drift_ctx: Any, history: Any, cluster: str = PROD, *, remediate: bool = False,
           now: datetime | None = None, **kw: Any) -> drift.DriftResult:
    return drift.check(_run_ctx(drift_ctx, history, cluster, **kw), remediate=remediate, now=now)


def _open(history: Any, cluster: str = PROD) -> list[dict[str, Any]]:
    return [r for r in history.queries.rows("open_drift") if r["cluster"].rsplit("/", 1)[-1] == cluster]


def _mutating(sandbox: Any, cluster: str) -> dict[str, list[Any]]:
    store = sandbox.twin(cluster).store
    k8s = [(r.verb, r.resource, r.namespace, r.name) for r in store.request_log
           if r.verb in MUTATING_K8S and not r.dry_run]
    return {"k8s": k8s, "aws": [op for op in sandbox.aws.operations() if op in MUTATING_AWS]}


def _reset(sandbox: Any) -> None:
    for twin in sandbox.twins.values():
        twin.store.reset_request_log()
    sandbox.aws.reset_request_log()


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def converged(drift_sandbox: Any, drift_history: Any) -> Any:
    """Stages 1–3 and the three endpoints of the patch-mode cluster, rolled out once for the module."""
    from kvfleet.stages.base import StageContext, Timeouts

    inv = drift_sandbox.inventory
    ctx = StageContext(inventory=inv, cluster=inv.cluster(PROD), aws_conn_id=None, history=drift_history,
                       timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=60, pvc_s=30))
    try:
        for stage in (tiered_storage, addons, curvine):
            stage.reconcile(ctx)
        endpoints.reconcile_wave(ctx, list(inv.endpoints_of(PROD)), holder="t/rollout")
    finally:
        ctx.close()
    return drift_sandbox


def test_a_converged_cluster_has_no_finding_and_the_check_changes_nothing(converged: Any, drift_ctx: Any,
        drift_history: Any) -> None:
    _reset(converged)
    result = _check(drift_ctx, drift_history)
    assert result.reachable and [f.text() for f in result.findings] == []
    assert _mutating(converged, PROD) == {"k8s": [], "aws": []}
    assert _open(drift_history) == []


def _ep(inv: Any, name: str, cluster: str = PROD) -> Any:
    return next(e for e in inv.endpoints if e.cluster == cluster and e.name == name)


def _pods_settled(twin: Any, ep: Any, url: str) -> Callable[[], bool]:
    def ok() -> bool:
        pods = [p for p in twin.store.list("", "pods", ep.namespace, label_selector=f"app={ep.name}")
                if not p["metadata"].get("deletionTimestamp")]
        ready = [p for p in pods if any(c.get("type") == "Ready" and c.get("status") == "True"
                                        for c in (p.get("status") or {}).get("conditions") or [])]
        urls = [[e.get("value") for e in next(c for c in p["spec"]["containers"] if c["name"] == ep.name)["env"]
                 if e["name"] == C.ENV_REMOTE_URL] for p in ready]
        return len(pods) == len(ready) == ep.replicas and all(u == [url] for u in urls)
    return ok


def test_forced_rerender_after_a_patch_rollout_is_patch_lost_and_remediation_fixes_it(converged: Any,
        drift_ctx: Any, drift_history: Any) -> None:
    inv = converged.inventory
    ep = _ep(inv, "retail-assistant")
    twin = converged.twin(PROD)
    # Two earlier patch losses on this cluster this week (resolved since): this one is the third.
    for i in (1, 2):
        old = rules.Finding("patch_lost_to_reconcile", PROD, f"Deployment/retail/old-{i}", "volumes", "pvc", "absent",
                            lob="retail", endpoint=f"retail/old-{i}")
        drift_history.drift.sync(PROD, [old.as_dict()], f"old/{i}", scope_kinds=["patch_lost_to_reconcile"])
        drift_history.drift.sync(PROD, [], f"old/{i}b", scope_kinds=["patch_lost_to_reconcile"])

    generation = twin.store.get("apps", "deployments", ep.name, ep.namespace)["metadata"]["generation"]
    twin.services["operator"].rerender_now(ep.namespace, ep.name)
    _wait(lambda: twin.store.get("apps", "deployments", ep.name, ep.namespace)["metadata"]["generation"] != generation,
          "the operator's re-render")
    _wait(_pods_settled(twin, ep, C.OPERATOR_L2_URL), "pods on the re-rendered template")

    first = _check(drift_ctx, drift_history)
    assert {f.kind for f in first.findings} == {"patch_lost_to_reconcile", "operator_l2_url"}
    lost = {f.field: f for f in first.findings if f.kind == "patch_lost_to_reconcile"}
    assert set(lost) == {f"spec.template.spec.volumes[{C.L2_VOLUME_NAME}]",
                         f"spec.template.spec.containers[{ep.name}].volumeMounts"}
    for f in lost.values():
        assert (f.object_ref, f.actual, f.lob, f.endpoint, f.severity) == (
            f"Deployment/{ep.key}", "absent", "retail", ep.key, "high")
    url = next(f for f in first.findings if f.kind == "operator_l2_url")
    assert (url.expected, url.actual) == (C.L2_URL, C.OPERATOR_L2_URL)
    assert first.sync == {"opened": 3, "still_open": 0, "resolved": 0}
    assert first.patch_losses_7d == 3 and first.advice and "3 times in 7 days" in first.advice
    advice = [s for s in drift_history.runs.steps(first.run_key) if s["step"] == f"drift_advice:{PROD}"]
    assert advice and advice[0]["detail"]["recommend"] == "kyverno"

    opened = {r["field"]: r for r in _open(drift_history)}
    again = _check(drift_ctx, drift_history)
    assert again.sync == {"opened": 0, "still_open": 3, "resolved": 0}
    rows = {r["field"]: r for r in _open(drift_history)}
    assert all(rows[k]["first_seen"] == opened[k]["first_seen"] and rows[k]["last_seen"] > opened[k]["last_seen"]
               for k in rows)

    _reset(converged)
    fixed = _check(drift_ctx, drift_history, remediate=True)
    (action,) = fixed.remediations
    assert (action["action"], action["outcome"]) == ("patch_endpoints", "changed")
    assert set(action["kinds"]) == {"patch_lost_to_reconcile", "operator_l2_url"}
    mutated = _mutating(converged, PROD)["k8s"]
    assert ("patch", "deployments", ep.namespace, ep.name) in mutated
    assert not any(v == "delete" for v, *_ in mutated)  # a patch, never a rollback or a re-create
    # the run observed again after remediating and resolved what it fixed: nothing stays open
    assert _open(drift_history) == []
    resolved = [r for r in drift_history.queries.rows("drift_since", cutoff=datetime.now(UTC) - timedelta(hours=1))
                if r["endpoint"] == ep.key]
    assert len(resolved) == 3 and all(r["resolved_at"] and r["resolution"] == "remediated"
                                      and r["remediation_action"] == "patch_endpoints" for r in resolved)

    after = _check(drift_ctx, drift_history)
    assert after.findings == [] and after.sync["resolved"] == 0



def test_helm_upgrade_setting_format_master_is_found_and_flipped_back_with_reuse_values(converged: Any,
        drift_ctx: Any, drift_history: Any) -> None:
    ctx = drift_ctx(PROD)
    spec = ctx.cluster.curvine
    twin = converged.twin(PROD)
    for i in range(5):  # L2 blocks written by the endpoints (what the pods' fs connector writes)
        twin.l2.write(f"/l2cache/drift-test/chunk-{i}.bin", 4096)
    files = twin.l2.file_count()
    from kvfleet.clients.curvine import CurvineMaster

    master = CurvineMaster(ctx.kube, spec.namespace)
    _wait(lambda: master.overview().files_total == files, "the master's file count")  # its periodic tick
    baseline = _check(drift_ctx, drift_history)  # records the Curvine snapshot the next check compares with
    assert baseline.findings == []
    ctx = drift_ctx(PROD)  # no history: the hand-made upgrade below is not a kvfleet action
    # What a person would type: helm upgrade ... --reuse-values --set cluster.formatMaster=true
    ctx.helm.run(*ctx.helm.upgrade_args(C.CURVINE_RELEASE, spec.chart, spec.namespace, repo=curvine.repo_url(ctx),
                                        version=spec.version, values={"cluster.formatMaster": True}),
                 what="hand-made helm upgrade")
    curvine.wait_rolled_out(ctx)
    curvine.verify_capacity(ctx)
    _wait(lambda: master.overview().files_total < files, "the master's format on restart, in its file count")

    found = _check(drift_ctx, drift_history)
    by_kind = {f.kind: f for f in found.findings}
    assert set(by_kind) == {"format_flag_set", "curvine_data_loss"}
    flag = by_kind["format_flag_set"]
    assert (flag.kind, flag.severity, flag.object_ref, flag.field, flag.expected, flag.actual) == (
        "format_flag_set", "critical", f"HelmRelease/{spec.namespace}/{C.CURVINE_RELEASE}", "cluster.formatMaster",
        "false", "true")
    loss = by_kind["curvine_data_loss"]
    assert (loss.severity, loss.object_ref, loss.field) == (
        "critical", f"HelmRelease/{spec.namespace}/{C.CURVINE_RELEASE}", "files_total")
    assert loss.expected.startswith(f">= {files} (the drift snapshot of drift_check:")
    assert loss.actual == f"{twin.l2.file_count()}: {files - twin.l2.file_count()} lost"
    assert any(r["kind"] == "curvine_data_loss" for r in _open(drift_history))  # in the history, for the audit
    revisions_before = len(ctx.helm.history(C.CURVINE_RELEASE, spec.namespace))

    fixed = _check(drift_ctx, drift_history, remediate=True)
    (action,) = fixed.remediations
    assert (action["action"], action["outcome"], action["kinds"]) == ("flip_format_flags", "changed",
                                                                     ["format_flag_set"])
    assert "curvine_data_loss" not in {f.kind for f in fixed.findings}  # compared with the snapshot just before
    history = ctx.helm.history(C.CURVINE_RELEASE, spec.namespace)
    assert len(history) == revisions_before + 1
    assert "rollback" not in str(history[-1].get("description", "")).lower()
    values = ctx.helm.values(C.CURVINE_RELEASE, spec.namespace)
    assert all(values["cluster"][f] in (False, "false") for f in C.FORMAT_FLAGS)
    assert values["worker"]["replicas"] == ctx.cluster.curvine_workers  # --reuse-values kept the rest

    after = _check(drift_ctx, drift_history)
    assert after.findings == [] and after.sync["resolved"] == 0  # the flag and the loss were resolved by `fixed`


def test_operator_scaled_to_zero_by_hand_is_operator_paused_after_the_threshold(converged: Any, drift_ctx: Any,
        drift_history: Any, kube_api: Any) -> None:
    from kubernetes import client

    ctx = drift_ctx(PROD)
    apps = client.AppsV1Api(kube_api(converged, PROD))  # a person with admin rights, not kvfleet's identity
    apps.patch_namespaced_deployment_scale(C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE, {"spec": {"replicas": 0}})
    threshold = timedelta(minutes=converged.inventory.settings.operator_pause_threshold_minutes)

    early = _check(drift_ctx, drift_history)
    assert early.findings == []  # seen, dated, not drift yet
    later = datetime.now(UTC) + threshold + timedelta(minutes=1)
    late = _check(drift_ctx, drift_history, now=later)
    (paused,) = late.findings
    assert (paused.kind, paused.field, paused.object_ref) == (
        "operator_paused", "spec.replicas", f"Deployment/{C.OPERATOR_NAMESPACE}/{C.OPERATOR_DEPLOYMENT}")
    assert paused.actual.startswith("0, paused by someone outside kvfleet")

    refused = _check(drift_ctx, drift_history, remediate=True, now=later)
    (action,) = refused.remediations
    assert (action["action"], action["outcome"]) == ("restore_operator", "refused")
    assert "never undoes another holder's pause" in action["detail"]["reason"]

    apps.patch_namespaced_deployment_scale(C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE, {"spec": {"replicas": 1}})
    from kvfleet.stages import operator_pause

    _wait(lambda: operator_pause.pause_state(ctx)["ready"] >= 1, "operator back")
    assert _check(drift_ctx, drift_history, now=later).findings == []


def test_a_kvfleet_pause_left_behind_is_restored(converged: Any, drift_ctx: Any, drift_history: Any) -> None:
    from kvfleet.stages import operator_pause

    ctx = drift_ctx(PROD)
    operator_pause.pause(ctx, "kvfleet_rollout/crashed")
    later = datetime.now(UTC) + timedelta(hours=1)
    result = _check(drift_ctx, drift_history, remediate=True, now=later)
    assert [f.kind for f in result.findings] == ["operator_paused"]
    assert "kvfleet run kvfleet_rollout/crashed" in result.findings[0].actual
    (action,) = result.remediations
    assert (action["action"], action["outcome"]) == ("restore_operator", "changed")
    state = operator_pause.pause_state(ctx)
    assert state["paused_by"] is None and state["ready"] >= 1
    assert _check(drift_ctx, drift_history).findings == []


def test_pods_that_disagree_on_the_hash_seed(converged: Any, drift_ctx: Any, drift_history: Any, kube_api: Any) -> None:
    from kubernetes import client

    ep = _ep(converged.inventory, "payments-disputes")
    ctx = drift_ctx(PROD)
    core = client.CoreV1Api(kube_api(converged, PROD))  # a person with admin rights creates the rogue pod
    pod = ctx.kube.api_client.sanitize_for_serialization(
        ctx.kube.core.list_namespaced_pod(ep.namespace, label_selector=f"app={ep.name}").items[0])
    rogue = {"apiVersion": "v1", "kind": "Pod", "spec": pod["spec"],
             "metadata": {"name": f"{ep.name}-rogue", "namespace": ep.namespace, "labels": pod["metadata"]["labels"]}}
    vllm = next(c for c in rogue["spec"]["containers"] if c["name"] == ep.name)
    vllm["env"] = [e for e in vllm["env"] if e["name"] != C.ENV_HASHSEED] + [{"name": C.ENV_HASHSEED, "value": "1"}]
    core.create_namespaced_pod(ep.namespace, rogue)
    try:
        result = _check(drift_ctx, drift_history)
        by_kind = {f.kind: f for f in result.findings}
        assert set(by_kind) == {"hash_seed_mismatch", "stale_pods"}
        assert f"{ep.name}-rogue=1" in by_kind["hash_seed_mismatch"].actual
        assert by_kind["stale_pods"].actual == f"1 stale: {ep.name}-rogue"
        assert by_kind["hash_seed_mismatch"].lob == "payments"
    finally:
        core.delete_namespaced_pod(f"{ep.name}-rogue", ep.namespace)
    _wait(lambda: converged.twin(PROD).store.get("", "pods", f"{ep.name}-rogue", ep.namespace) is None, "rogue gone")
    assert _check(drift_ctx, drift_history).sync["resolved"] == 2


def test_inventory_against_the_live_fleet(converged: Any, drift_ctx: Any) -> None:
    """The live cluster stays converged; the inventory moves: every difference is a finding with its fields."""
    from kvfleet.fleet.inventory import AddonSpec, Endpoint

    inv = converged.inventory
    cl = inv.cluster(PROD)
    changed = cl.model_copy(update={
        "tiered_storage": cl.tiered_storage.model_copy(update={"memory_percent": 30}),
        "curvine": cl.curvine.model_copy(update={"worker": cl.curvine.worker.model_copy(update={"replicas": 3})}),
        "addons": [*cl.addons, AddonSpec(name="cert-manager", version="v9.9.9-eksbuild.1")]})
    chat = _ep(inv, "support-chat")
    newcomer = Endpoint(name="fresh-endpoint", namespace="fresh", lob="retail", cluster=PROD,
                        model="qwen2-7b-instruct", instance_type="ml.g6e.4xlarge")
    kept = [e.model_copy(update={"replicas": 3}) if e == chat else e for e in inv.endpoints
            if e.name != "retail-assistant" or e.cluster != PROD]
    eps = [*kept, newcomer]
    moved = inv.model_copy(update={"clusters": [changed if c.name == PROD else c for c in inv.clusters],
                                   "endpoints": eps})
    result = drift.check(drift_ctx(PROD, inv=moved))
    got = {(f.kind, f.object_ref, f.field): (f.expected, f.actual) for f in result.findings}
    assert got == {
        ("tiered_storage_mismatch", f"HyperPodCluster/{PROD}", "TieredStorageConfig"):
            ("Mode=Enable,InstanceMemoryAllocationPercentage=30", "Mode=Enable,InstanceMemoryAllocationPercentage=20"),
        ("addon_version_mismatch", "EksAddon/cert-manager", "addonVersion"): ("v9.9.9-eksbuild.1", got[
            ("addon_version_mismatch", "EksAddon/cert-manager", "addonVersion")][1]),
        ("curvine_workers_mismatch", f"CurvineMaster/curvine/{C.CURVINE_MASTER_STS}-0", "live_workers"): ("3", "2"),
        ("cr_mismatch", "InferenceEndpointConfig/support/support-chat", "spec.replicas"): ("3", "2"),
        ("endpoint_missing", "InferenceEndpointConfig/fresh/fresh-endpoint", "metadata"):
            got[("endpoint_missing", "InferenceEndpointConfig/fresh/fresh-endpoint", "metadata")],
        ("pvc_unbound", f"PersistentVolumeClaim/fresh/{C.CURVINE_PVC}", "status.phase"): ("Bound", "absent"),
        ("endpoint_unmanaged", "InferenceEndpointConfig/retail/retail-assistant",
         f"metadata.labels[{C.MANAGED_BY_LABEL}]"):
            got[("endpoint_unmanaged", "InferenceEndpointConfig/retail/retail-assistant",
                 f"metadata.labels[{C.MANAGED_BY_LABEL}]")],
    }


def test_an_unreachable_cluster_is_recorded_without_hiding_the_others(converged: Any, drift_ctx: Any,
        drift_history: Any) -> None:
    # The kyverno-mode cluster was never rolled out: its check reports what the rollout would do (its ClusterPolicy
    # came with the bootstrap bundle).
    stage_first = _check(drift_ctx, drift_history, STAGE)
    assert {"endpoint_missing", "addon_missing", "tiered_storage_mismatch"} <= \
        {f.kind for f in stage_first.findings}
    stage_open = len(_open(drift_history, STAGE))
    assert stage_open == len(stage_first.findings)

    server = converged.servers[STAGE]
    server.error_rate = 1.0
    try:
        down = _check(drift_ctx, drift_history, STAGE)
        up = _check(drift_ctx, drift_history, PROD)
    finally:
        server.error_rate = 0.0
    (f,) = down.findings
    assert not down.reachable and f.kind == "cluster_unreachable" and f.object_ref == f"Cluster/{STAGE}"
    assert up.reachable and up.findings == []
    # What could not be observed stays open, as it was; the unreachable finding is added beside it.
    assert len(_open(drift_history, STAGE)) == stage_open + 1
    back = _check(drift_ctx, drift_history, STAGE)
    assert back.reachable and back.sync["resolved"] == 1


def test_an_l2_volume_on_the_wrong_claim_converges_in_one_remediation(
        converged: Any, drift_ctx: Any, drift_history: Any, kube_api: Any) -> None:
    """The volume named curvine-l2 points at another claim. It used to be flagged with no patch
    operation, so the wave paused the operator, scaled to 0, patched nothing and raised, on every check."""
    from kubernetes import client

    from kvfleet.fleet.endpoint_spec import pvc_manifest
    from kvfleet.stages import operator_pause

    inv = converged.inventory
    ep = _ep(inv, "payments-disputes")
    ctx = drift_ctx(PROD)
    api = kube_api(converged, PROD)  # a person with admin rights, not kvfleet's identity
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    twin = converged.twin(PROD)
    wrong = "someone-elses-pvc"
    core.create_namespaced_persistent_volume_claim(
        ep.namespace, pvc_manifest(ep.namespace, inv.cluster(PROD).curvine.storage_class, name=wrong))
    _wait(lambda: (twin.store.get("", "persistentvolumeclaims", wrong, ep.namespace).get("status") or {})
          .get("phase") == "Bound", "the other claim Bound")

    def on_claim(claim: str) -> Callable[[], bool]:
        def ok() -> bool:
            dep = twin.store.get("apps", "deployments", ep.name, ep.namespace)
            vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
            pods = [p for p in twin.store.list("", "pods", ep.namespace, label_selector=f"app={ep.name}")
                    if not p["metadata"].get("deletionTimestamp")]
            ready = [p for p in pods if any(c.get("type") == "Ready" and c.get("status") == "True"
                                            for c in (p.get("status") or {}).get("conditions") or [])]
            claims = {v["persistentVolumeClaim"]["claimName"] for p in ready for v in p["spec"]["volumes"]
                      if v["name"] == C.L2_VOLUME_NAME}
            return (vols[C.L2_VOLUME_NAME]["persistentVolumeClaim"]["claimName"] == claim
                    and len(pods) == len(ready) == ep.replicas and claims == {claim})
        return ok

    # The edit is made as the safe sequence makes one (operator paused, scaled to 0), so the operator, restored
    # on a fully available Deployment, leaves it alone.
    operator_pause.pause(ctx, "t/hand-edit")
    try:
        apps.patch_namespaced_deployment_scale(ep.name, ep.namespace, {"spec": {"replicas": 0}})
        dep = twin.store.get("apps", "deployments", ep.name, ep.namespace)
        i = next(i for i, v in enumerate(dep["spec"]["template"]["spec"]["volumes"]) if v["name"] == C.L2_VOLUME_NAME)
        apps.patch_namespaced_deployment(ep.name, ep.namespace, [
            {"op": "replace", "path": f"/spec/template/spec/volumes/{i}/persistentVolumeClaim/claimName",
             "value": wrong}])
        apps.patch_namespaced_deployment_scale(ep.name, ep.namespace, {"spec": {"replicas": ep.replicas}})
        _wait(on_claim(wrong), "pods on the wrong claim")
    finally:
        operator_pause.restore(ctx, "t/hand-edit")

    try:
        first = _check(drift_ctx, drift_history)
        assert [(f.kind, f.field, f.actual) for f in first.findings] == [
            ("patch_lost_to_reconcile", f"spec.template.spec.volumes[{C.L2_VOLUME_NAME}]", f"pvc {wrong}")]
        _reset(converged)
        # ... and no endpoint reaches 0 replicas on the way: every Deployment write the twin stores is followed.
        replicas: list[int] = []
        following = [True]

        def on_event(kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            if following[0] and resource == "deployments" and (meta.get("name"), meta.get("namespace")) == (ep.name, ep.namespace):
                replicas.append(int((obj.get("spec") or {}).get("replicas", 1)))

        converged.twin(ep.cluster).store.subscribe(on_event)
        fixed = _check(drift_ctx, drift_history, remediate=True)
        following[0] = False  # later events (other tests) are not this remediation's
        seen = list(replicas)
        assert seen and min(seen) == ep.replicas >= 2, seen  # rolled (auto: >= 2 replicas), never scaled to 0
        (action,) = fixed.remediations
        assert (action["action"], action["outcome"]) == ("patch_endpoints", "changed"), action
        assert on_claim(C.CURVINE_PVC)()
        assert _open(drift_history) == []  # converged in this one run
        assert _check(drift_ctx, drift_history).findings == []
    finally:
        core.delete_namespaced_persistent_volume_claim(wrong, ep.namespace)
