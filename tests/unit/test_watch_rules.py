"""The drift watch's rules (``kvfleet.fleet.watch_rules``), pure: which change of a watched object is reported, the
fingerprint a change of the desired state moves, the debounce, and the RBAC grants derived from what is watched."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvfleet.fleet import watch_rules as rules
from kvfleet.fleet.watch_rules import WATCHED, Burst, Seen, judge

DEPLOYMENT = next(w for w in WATCHED if w.kind == "Deployment")
POD = next(w for w in WATCHED if w.kind == "Pod")
SECRET = next(w for w in WATCHED if w.kind == "Secret")


def _deployment(rv: str = "1", *, manager: str | None = None, annotations: dict[str, str] | None = None,
                env: str = "a") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "retail-assistant", "namespace": "retail", "resourceVersion": rv,
                            "labels": {"app.kubernetes.io/managed-by": "kvfleet"},
                            "annotations": dict(annotations or {})}
    if manager:
        meta["managedFields"] = [{"manager": "kube-controller-manager", "time": "2026-01-01T00:00:00Z"},
                                 {"manager": manager, "time": "2026-01-01T00:00:01Z"}]
    return {"metadata": meta, "spec": {"template": {"spec": {"containers": [{"env": [{"value": env}]}]}}},
            "status": {"readyReplicas": 2}}


def _listed(obj: dict[str, Any]) -> Seen:
    seen: Seen = {}
    assert judge(DEPLOYMENT, "LISTED", obj, seen) is None  # the first list is the baseline, never a change
    return seen


def test_a_hand_edit_carrying_kvfleets_former_change_id_annotation_is_still_reported() -> None:
    """Anyone who can edit an object can stamp an annotation on it: it must not hide the edit."""
    seen = _listed(_deployment(annotations={"kvfleet.io/change-id": "r1"}))
    forged = _deployment("2", env="by-hand", annotations={"kvfleet.io/change-id": "r2-forged"},
                         manager="kubectl-edit")
    change = judge(DEPLOYMENT, "MODIFIED", forged, seen)
    assert change is not None and change.as_dict() == {
        "kind": "Deployment", "type": "modified", "object": "retail/retail-assistant", "resource_version": "2"}
    assert change.detail == ": annotations, spec changed"
    # Nor a label of that name (Helm's `--labels` form), on an object whose managedFields say nothing.
    labelled = _deployment("3", env="by-hand-2")
    labelled["metadata"]["labels"]["kvfleet.io.change-id"] = "r3"
    assert judge(DEPLOYMENT, "MODIFIED", labelled, seen) is not None


def test_kvfleets_own_write_is_told_by_its_field_manager_only() -> None:
    seen = _listed(_deployment())
    assert judge(DEPLOYMENT, "MODIFIED", _deployment("2", env="b", manager="kvfleet"), seen) is None
    assert judge(DEPLOYMENT, "MODIFIED", _deployment("3", env="c", manager="kubectl-patch"), seen) is not None
    assert rules.is_own_change(_deployment(manager="kvfleet"))
    assert not rules.is_own_change(_deployment(manager="kubectl-patch"))
    assert not rules.is_own_change(_deployment())  # no managedFields: not kvfleet's
    assert not rules.is_own_change({"metadata": {"managedFields": "not a list"}})


def test_a_status_or_controller_annotation_update_is_not_a_change_but_a_deletion_is() -> None:
    seen = _listed(_deployment())
    noise = _deployment("2", annotations={"deployment.kubernetes.io/revision": "7"})
    noise["status"]["readyReplicas"] = 1
    assert judge(DEPLOYMENT, "MODIFIED", noise, seen) is None
    deleted = judge(DEPLOYMENT, "DELETED", _deployment("3", manager="kvfleet"), seen)
    assert deleted is not None and deleted.type == "deleted"  # a deletion counts, whoever's manager wrote last
    assert seen == {}


def test_only_the_watched_objects_and_event_types_count() -> None:
    stranger = _deployment()
    stranger["metadata"]["labels"] = {}
    assert judge(DEPLOYMENT, "ADDED", stranger, {}) is None  # neither managed nor the operator's controller
    operator = {"metadata": {"name": "hyperpod-inference-operator-controller-manager",
                             "namespace": "hyperpod-inference-system"}, "spec": {}}
    assert rules.is_watched_deployment(operator) == (operator["metadata"]["name"] in rules.OPERATOR_DEPLOYMENTS)
    assert judge(POD, "ADDED", _deployment(), {}) is None  # a new Pod is a rollout, not a hand edit
    assert judge(DEPLOYMENT, "BOOKMARK", _deployment(), {}) is None
    release = {"metadata": {"name": "sh.helm.release.v1.curvine.v2", "namespace": "curvine",
                            "labels": {"name": "curvine", "owner": "helm"}}, "data": {"release": "x"}}
    assert judge(SECRET, "ADDED", release, {}) is not None
    assert judge(SECRET, "DELETED", release, {}) is None  # Helm pruning its history
    other = copy.deepcopy(release)
    other["metadata"]["labels"]["name"] = "kyverno"
    assert judge(SECRET, "ADDED", other, {}) is None


def test_fingerprint_ignores_status_and_controller_annotations_and_sees_spec_labels_and_annotations() -> None:
    base = {"metadata": {"name": "d", "labels": {"a": "1"}, "annotations": {"x": "1"}}, "spec": {"replicas": 2},
            "status": {"readyReplicas": 1}}
    same = copy.deepcopy(base)
    same["status"]["readyReplicas"] = 2
    same["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "7"
    assert rules.fingerprint(base, ("spec",)) == rules.fingerprint(same, ("spec",))
    for part, key in (("spec", "replicas"), ("metadata", "labels"), ("metadata", "annotations")):
        other = copy.deepcopy(base)
        other[part][key] = 3 if key == "replicas" else {"changed": "yes"}
        assert rules.fingerprint(base, ("spec",)) != rules.fingerprint(other, ("spec",)), (part, key)


@pytest.mark.parametrize(("now", "due"), [(10.4, False), (10.5, True), (11.0, True)])
def test_a_burst_is_due_after_its_quiet_period(now: float, due: bool) -> None:
    burst = Burst()
    assert not burst.due(100.0, 0.5, 120.0)  # nothing seen: never due
    burst.add(rules.resync("Deployment"), 9.0)
    burst.add(rules.Change("Pod", "modified", "retail/p-1"), 9.9)
    burst.add(rules.Change("Pod", "modified", "retail/p-1"), 10.0)
    assert burst.due(now, 0.5, 120.0) is due
    assert burst.objects() == ["Deployment:*", "Pod:retail/p-1"]


def test_steady_churn_still_reports_after_the_longest_burst() -> None:
    burst = Burst()
    for t in range(0, 130, 1):
        burst.add(rules.Change("Pod", "modified", f"retail/p-{t}"), float(t))
    assert burst.due(129.0, 15.0, 120.0)


def test_the_rbac_grants_are_watch_on_each_watched_collection() -> None:
    assert {(r["apiGroups"][0], r["resources"][0]) for r in rules.RBAC_CLUSTER_RULES} == {
        ("", "pods"), ("apps", "deployments"), ("inference.sagemaker.aws.amazon.com", "inferenceendpointconfigs")}
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in rules.RBAC_CURVINE_NAMESPACE_RULES] == [
        ([""], ["secrets"], ["watch"])]
    assert all(r["verbs"] == ["watch"] for r in rules.RBAC_CLUSTER_RULES)
