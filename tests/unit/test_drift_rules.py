"""The drift rules (fleet.drift), pure: every kind from a hand-built observation, fingerprints, advice."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kvfleet.fleet import constants as C
from kvfleet.fleet import drift as rules
from kvfleet.fleet.endpoint_spec import kyverno_policy, render_iec
from kvfleet.fleet.inventory import load_inventory

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PROD, STAGE = "ml-prod-use1", "ml-stage-usw2"


@pytest.fixture(scope="module")
def inv() -> Any:
    return load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")


def _vllm(ep: Any, settings: Any, *, url: str | None = C.L2_URL, seed: str | None = C.PYTHONHASHSEED,
          mount: bool = True) -> dict[str, Any]:
    env = [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
           {"name": C.ENV_REMOTE_SERDE, "value": settings.serde}]
    if seed is not None:
        env.append({"name": C.ENV_HASHSEED, "value": seed})
    if url is not None:
        env.append({"name": C.ENV_REMOTE_URL, "value": url})
    c = {"name": ep.name, "image": ep.image, "env": env}
    if mount:
        c["volumeMounts"] = [{"name": C.L2_VOLUME_NAME, "mountPath": C.L2_MOUNT_PATH}]
    return c


def _objects(ep: Any, settings: Any, **kw: Any) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    iec = render_iec(ep, settings)
    spec = {"containers": [_vllm(ep, settings, **kw)],
            "volumes": [{"name": C.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": C.CURVINE_PVC}}]
            if kw.get("mount", True) else []}
    labels = {**iec["metadata"]["labels"], "app": ep.name}
    dep = {"metadata": {"name": ep.name, "namespace": ep.namespace, "labels": labels},
           "spec": {"replicas": ep.replicas, "template": {"metadata": {"labels": labels}, "spec": spec}}}
    pods = [{"metadata": {"name": f"{ep.name}-{i}", "namespace": ep.namespace, "labels": labels},
             "spec": copy.deepcopy(spec), "status": {"phase": "Running"}} for i in range(ep.replicas)]
    return iec, dep, pods


def converged(inv: Any, cluster: str) -> rules.ClusterObservation:
    cl = inv.cluster(cluster)
    obs = rules.ClusterObservation(now=NOW, tiered_mode="Enable", tiered_percent=cl.tiered_storage.memory_percent,
                                   operator={"metadata": {"annotations": {}}, "spec": {"replicas": 1}},
                                   curvine_values={"cluster": {f: False for f in C.FORMAT_FLAGS}},
                                   curvine_live_workers=cl.curvine_workers,
                                   policy=kyverno_policy(inv.settings), policy_checked=cl.l2_injection == "kyverno")
    obs.addons = {n: {"status": "ACTIVE", "version": "v1", "diffs": []} for n in C.ADDON_ORDER}
    for ep in inv.endpoints_of(cluster):
        iec, dep, pods = _objects(ep, inv.settings)
        obs.iecs.append(iec)
        obs.deployments.append(dep)
        obs.pods += pods
    obs.pvcs = [{"metadata": {"name": C.CURVINE_PVC, "namespace": ns}, "status": {"phase": "Bound"}}
                for ns in {e.namespace for e in inv.endpoints_of(cluster)}]
    return obs


def kinds(findings: Any) -> list[str]:
    return sorted({f.kind for f in findings})


@pytest.mark.parametrize("cluster", [PROD, STAGE])
def test_a_converged_cluster_has_no_finding(inv: Any, cluster: Any) -> None:
    assert rules.classify(inv, cluster, converged(inv, cluster)) == []


def _replace_dep(obs: Any, ep: Any, **kw: Any) -> Any:
    _iec, dep, pods = _objects(ep, **kw)
    obs.deployments = [d for d in obs.deployments if d["metadata"]["name"] != ep.name
                       or d["metadata"]["namespace"] != ep.namespace] + [dep]
    return dep, pods


def test_operator_rerender_is_patch_lost_with_fields(inv: Any) -> None:
    obs = converged(inv, PROD)
    ep = inv.endpoints_of(PROD)[0]
    _replace_dep(obs, ep, settings=inv.settings, url=C.OPERATOR_L2_URL, mount=False)
    found = rules.classify(inv, PROD, obs)
    assert kinds(found) == ["operator_l2_url", "patch_lost_to_reconcile", "stale_pods"]
    lost = [f for f in found if f.kind == "patch_lost_to_reconcile"]
    assert {f.field for f in lost} == {f"spec.template.spec.volumes[{C.L2_VOLUME_NAME}]",
                                       f"spec.template.spec.containers[{ep.name}].volumeMounts"}
    assert all(f.object_ref == f"Deployment/{ep.key}" and f.actual == "absent" and f.lob == ep.lob
               and f.endpoint == ep.key and f.severity == "high" for f in lost)
    url = next(f for f in found if f.kind == "operator_l2_url")
    assert url.expected == C.L2_URL and url.actual == C.OPERATOR_L2_URL


def test_duplicate_url_and_missing_seed(inv: Any) -> None:
    obs = converged(inv, PROD)
    ep = inv.endpoints_of(PROD)[1]
    dep, _ = _replace_dep(obs, ep, settings=inv.settings, seed=None)
    vllm = dep["spec"]["template"]["spec"]["containers"][0]
    vllm["env"].append({"name": C.ENV_REMOTE_URL, "value": C.L2_URL})
    found = rules.classify(inv, PROD, obs)
    assert {"duplicate_l2_url", "hash_seed_missing", "stale_pods"} <= set(kinds(found))


def test_pods_that_disagree_on_the_seed(inv: Any) -> None:
    obs = converged(inv, PROD)
    ep = inv.endpoints_of(PROD)[0]
    pod = next(p for p in obs.pods if p["metadata"]["name"] == f"{ep.name}-0")
    env = pod["spec"]["containers"][0]["env"]
    pod["spec"]["containers"][0]["env"] = [e for e in env if e["name"] != C.ENV_HASHSEED]
    found = rules.classify(inv, PROD, obs)
    assert kinds(found) == ["hash_seed_mismatch", "stale_pods"]
    mismatch = next(f for f in found if f.kind == "hash_seed_mismatch")
    assert mismatch.actual == f"{ep.name}-0=None, {ep.name}-1=0"


def test_missing_unmanaged_cr_mismatch_and_pvc(inv: Any) -> None:
    obs = converged(inv, PROD)
    gone, changed = inv.endpoints_of(PROD)[0], inv.endpoints_of(PROD)[1]
    obs.iecs = [i for i in obs.iecs if i["metadata"]["name"] != gone.name]
    iec = next(i for i in obs.iecs if i["metadata"]["name"] == changed.name)
    iec["spec"]["replicas"] = 5
    stray = copy.deepcopy(iec)
    stray["metadata"]["name"] = "forgotten"
    obs.iecs.append(stray)
    obs.pvcs[0]["status"]["phase"] = "Pending"
    found = rules.classify(inv, PROD, obs)
    assert kinds(found) == ["cr_mismatch", "endpoint_missing", "endpoint_unmanaged", "pvc_unbound"]
    mismatch = next(f for f in found if f.kind == "cr_mismatch")
    assert (mismatch.field, mismatch.expected, mismatch.actual) == ("spec.replicas", str(changed.replicas), "5")
    assert next(f for f in found if f.kind == "endpoint_unmanaged").endpoint == f"{changed.namespace}/forgotten"


def test_cluster_level_kinds(inv: Any) -> None:
    obs = converged(inv, STAGE)
    obs.tiered_percent = 40
    obs.addons["cert-manager"] = {"status": "DEGRADED", "version": "v1", "diffs": ["status DEGRADED"]}
    obs.addons["metrics-server"] = None
    obs.curvine_values = {"cluster": {"formatMaster": "true", "formatWorker": False}}
    obs.curvine_live_workers = 1
    obs.policy = None
    found = rules.classify(inv, STAGE, obs)
    assert kinds(found) == ["addon_missing", "addon_not_active", "curvine_workers_mismatch", "format_flag_set",
                            "policy_missing", "tiered_storage_mismatch"]
    flag = next(f for f in found if f.kind == "format_flag_set")
    assert (flag.field, flag.expected, flag.actual, flag.severity) == ("cluster.formatMaster", "false", "true",
                                                                        "critical")


def test_operator_paused_only_after_the_threshold(inv: Any) -> None:
    cl = inv.cluster(PROD)
    threshold = timedelta(minutes=inv.settings.operator_pause_threshold_minutes)
    by_hand = {"metadata": {"annotations": {}}, "spec": {"replicas": 0}}
    assert rules.operator_findings(cl, inv, by_hand, NOW, NOW - threshold / 2) == []
    (f,) = rules.operator_findings(cl, inv, by_hand, NOW, NOW - threshold - timedelta(seconds=1))
    assert f.kind == "operator_paused" and "outside kvfleet" in f.actual
    at = (NOW - threshold * 2).strftime("%Y-%m-%dT%H:%M:%SZ")
    paused = {"metadata": {"annotations": {C.PAUSED_BY_ANNOTATION: "run-1", C.PAUSED_AT_ANNOTATION: at}},
              "spec": {"replicas": 0}}
    (f,) = rules.operator_findings(cl, inv, paused, NOW, None)
    assert "kvfleet run run-1" in f.actual
    assert rules.operator_findings(cl, inv, paused, NOW - threshold - timedelta(minutes=1), None) == []


def test_a_pause_whose_pauser_is_dead_is_found_at_once(inv: Any) -> None:
    cl = inv.cluster(PROD)
    at = (NOW - timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")  # far below the threshold
    paused = {"metadata": {"name": C.OPERATOR_HELM_DEPLOYMENT,
                           "annotations": {C.PAUSED_BY_ANNOTATION: "run-1", C.PAUSED_AT_ANNOTATION: at}},
              "spec": {"replicas": 0}}
    alive = {"holder": "run-1", "alive": True, "reason": "active lease held until ..."}
    assert rules.operator_findings(cl, inv, paused, NOW, None, alive) == []
    dead = {"holder": "run-1", "alive": False, "reason": "its active lease expired at ..."}
    (f,) = rules.operator_findings(cl, inv, paused, NOW, None, dead)
    assert f.kind == "operator_paused" and "pauser is dead: its active lease expired" in f.actual
    assert f.object_ref == f"Deployment/{C.OPERATOR_NAMESPACE}/{C.OPERATOR_HELM_DEPLOYMENT}"  # a Helm install
    other = {"holder": "run-2", "alive": False, "reason": "x"}  # liveness of another holder says nothing
    assert rules.operator_findings(cl, inv, paused, NOW, None, other) == []


def test_curvine_data_loss_against_the_last_snapshot(inv: Any) -> None:
    cl = inv.cluster(PROD)
    previous = {"files_total": 120, "capacity": 1000, "phase": "after", "step": "curvine_upgrade", "run_key": "r/1",
                "at": NOW - timedelta(minutes=10)}
    assert rules.curvine_loss_findings(cl, {"files_total": 130, "capacity": 1000}, previous) == []
    assert rules.curvine_loss_findings(cl, {"files_total": 120, "capacity": 1000}, None) == []
    found = rules.curvine_loss_findings(cl, {"files_total": 0, "capacity": 800}, previous)
    assert [(f.kind, f.severity, f.field) for f in found] == [("curvine_data_loss", "critical", "files_total"),
                                                             ("curvine_data_loss", "critical", "capacity")]
    assert found[0].actual == "0: 120 lost" and "after snapshot of curvine_upgrade (r/1)" in found[0].expected


def test_fingerprint_is_stable_and_ignores_the_actual_value() -> None:
    a = rules.Finding("stale_pods", "c", "Pod/ns/x", "spec", "all", "1 stale: p1")
    b = rules.Finding("stale_pods", "c", "Pod/ns/x", "spec", "all", "2 stale: p1, p2")
    other = rules.Finding("stale_pods", "c2", "Pod/ns/x", "spec", "all", "1 stale: p1")
    assert a.fingerprint == b.fingerprint != other.fingerprint
    assert a.as_dict()["severity"] == "medium"
    with pytest.raises(ValueError, match="unknown drift kind"):
        rules.Finding("made_up", "c", "o", "f", "e", "a")


def test_kinds_cover_the_issue() -> None:
    issue = {"patch_lost_to_reconcile", "duplicate_l2_url", "operator_l2_url", "hash_seed_missing",
             "hash_seed_mismatch", "stale_pods", "pvc_unbound", "operator_paused", "format_flag_set",
             "addon_not_active", "tiered_storage_mismatch", "curvine_workers_mismatch", "policy_missing",
             "endpoint_missing", "endpoint_unmanaged", "cr_mismatch", "cluster_unreachable"}
    assert issue <= rules.KINDS


def test_kyverno_advice(inv: Any) -> None:
    assert rules.kyverno_advice(inv.cluster(PROD), 2) is None
    advice = rules.kyverno_advice(inv.cluster(PROD), 3)
    assert advice and "3 times in 7 days" in advice and "l2_injection: kyverno" in advice
    assert rules.kyverno_advice(inv.cluster(STAGE), 9) is None  # already kyverno


def test_remediation_plan_groups_by_action() -> None:
    f = [rules.Finding(k, "c", f"o/{k}", "f", "e", "a") for k in
         ("operator_paused", "format_flag_set", "patch_lost_to_reconcile", "operator_l2_url", "stale_pods")]
    plan = rules.remediation_plan(f)
    assert [x.kind for x in plan["restore_operator"]] == ["operator_paused"]
    assert [x.kind for x in plan["flip_format_flags"]] == ["format_flag_set"]
    assert [x.kind for x in plan["patch_endpoints"]] == ["patch_lost_to_reconcile", "operator_l2_url"]


def test_overloaded_kinds_are_split_so_a_query_by_kind_tells_the_truth(inv: Any) -> None:
    """One kind per condition (a missing add-on, a wrong version, a missing operator, a missing
    release, an unreadable master, a changed policy are each their own kind)."""
    cl = inv.cluster(PROD)
    addons: dict[str, dict[str, Any] | None] = {n: {"status": "ACTIVE", "version": "v1", "diffs": []}
                                                for n in C.ADDON_ORDER}
    addons["metrics-server"] = None
    addons["cert-manager"] = {"status": "DEGRADED", "version": "v1", "diffs": []}
    (pinned,) = [a for a in cl.addons if a.version]  # the example pins the operator add-on's version
    addons[pinned.name] = {"status": "ACTIVE", "version": "v0", "diffs": ["version v0"]}
    addons["aws-fsx-csi-driver"] = {"status": "ACTIVE", "version": "v1", "diffs": ["configurationValues differ"]}
    found = {(f.kind, f.object_ref) for f in rules.addon_findings(cl, addons)}
    assert found == {("addon_missing", "EksAddon/metrics-server"), ("addon_not_active", "EksAddon/cert-manager"),
                     ("addon_version_mismatch", f"EksAddon/{pinned.name}"),
                     ("addon_config_mismatch", "EksAddon/aws-fsx-csi-driver")}
    (op,) = rules.operator_findings(cl, inv, None, NOW, None)
    assert op.kind == "operator_missing"
    (rel,) = rules.curvine_findings(cl, None, None, "release not found")
    assert rel.kind == "curvine_release_missing" and rel.severity == "high"
    (unread,) = rules.curvine_findings(cl, {"cluster": {}}, None, "master API: timeout")
    assert unread.kind == "curvine_master_unreadable" and unread.actual == "unknown: master API: timeout"
    (mismatch,) = rules.curvine_findings(cl, {"cluster": {}}, cl.curvine_workers + 1, None)
    assert mismatch.kind == "curvine_workers_mismatch"
    changed = kyverno_policy(inv.settings)
    changed["spec"]["background"] = True
    assert [f.kind for f in rules.policy_findings(cl, inv, changed)] == ["policy_changed"]
    assert [f.kind for f in rules.policy_findings(cl, inv, None)] == ["policy_missing"]
    plan = rules.remediation_plan(rules.policy_findings(cl, inv, changed) + rules.policy_findings(cl, inv, None))
    assert [f.kind for f in plan["ensure_policy"]] == ["policy_changed", "policy_missing"]


def test_patchable_kinds_are_the_overlay_kinds_and_the_blocking_ones_are_the_crs() -> None:
    from kvfleet.fleet import overlay

    assert rules.PATCHABLE == overlay.VIOLATION_KINDS
    assert not rules.PATCHABLE & rules.NOT_PATCHABLE
    assert (rules.PATCHABLE | rules.NOT_PATCHABLE | rules.POLICY_KINDS) <= rules.KINDS
