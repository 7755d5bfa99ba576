"""Observation cost is constant per cluster: the same API calls for 10 endpoints as for 200.

The endpoints are seeded as InferenceEndpointConfigs straight into the twin's store (the simulated operator
renders their Deployments, the workloads controller their pods); the drift check observes them through the real
Kubernetes and AWS APIs, whose request counters are compared."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest
from driftkit import PROD

from kvfleet.fleet import constants as C
from kvfleet.fleet.endpoint_spec import render_iec
from kvfleet.fleet.inventory import Endpoint, Inventory, load_inventory
from kvfleet.stages import addons, curvine, drift, tiered_storage
from kvfleet.stages.base import StageContext, Timeouts

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
LOBS = ("retail", "payments", "support")


def fleet_of(n: int) -> Inventory:
    inv = load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")
    eps = tuple(Endpoint(name=f"ep-{i:03d}", namespace=f"team-{i % 5}", lob=LOBS[i % 3], cluster=PROD,
                         model="qwen2-7b-instruct", instance_type="ml.g6e.4xlarge", replicas=1 if i < 10 else 0)
                for i in range(n))
    # No LOB remediates here: the point is what observing costs.
    lobs = [lob.model_copy(update={"remediate_drift": False}) for lob in inv.lobs]
    return inv.model_copy(update={"lobs": lobs, "clusters": [inv.cluster(PROD)], "endpoints": eps})


def _ctx(inv: Inventory) -> StageContext:
    return StageContext(inventory=inv, cluster=inv.cluster(PROD), aws_conn_id=None,
                        timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=60, pvc_s=30))


def _seed(twin, inv: Inventory, eps) -> None:  # type: ignore[no-untyped-def]
    for ep in eps:
        twin.store.create(C.IEC_GROUP, C.IEC_PLURAL, render_iec(ep, inv.settings))
    want = {ep.key for ep in eps}

    def rendered() -> bool:
        deps = twin.store.list("apps", "deployments", label_selector=f"{C.MANAGED_BY_LABEL}={C.MANAGED_BY_VALUE}")
        return want <= {f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in deps}

    deadline = time.monotonic() + 180  # a bound on the operator's render, not a timing: a loaded machine is slow
    while not rendered():
        assert time.monotonic() < deadline, "the operator did not render the seeded endpoints"
        time.sleep(0.1)


def _counted_check(sandbox, inv: Inventory):  # type: ignore[no-untyped-def]
    twin = sandbox.twin(PROD)
    twin.store.reset_request_log()
    sandbox.aws.reset_request_log()
    ctx = _ctx(inv)
    try:
        result = drift.check(ctx)
    finally:
        ctx.close()
    return result, twin.store.request_counts(), collections.Counter(sandbox.aws.operations())


def test_request_counts_do_not_grow_with_endpoints(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    big = fleet_of(200)
    small = big.model_copy(update={"endpoints": big.endpoints[:10]})
    sandbox = start_sandbox(big, tmp_path / "sb", SandboxSettings(time_scale=0.005))
    try:
        for key, value in sandbox.exports().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("KVFLEET_POLL_SECONDS", "0.05")
        monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
        ctx = _ctx(big)
        try:
            for stage in (tiered_storage, addons, curvine):
                stage.reconcile(ctx)
        finally:
            ctx.close()
        twin = sandbox.twin(PROD)

        _seed(twin, big, small.endpoints)
        r10, k8s10, aws10 = _counted_check(sandbox, small)
        _seed(twin, big, big.endpoints[10:])
        r200, k8s200, aws200 = _counted_check(sandbox, big)
    finally:
        sandbox.stop()

    # Both checks really saw their endpoints (none of them carries the L2 patch: it was never rolled out).
    assert len({f.endpoint for f in r10.findings if f.kind == "patch_lost_to_reconcile"}) == 10
    assert len({f.endpoint for f in r200.findings if f.kind == "patch_lost_to_reconcile"}) == 200
    assert r10.remediations == r200.remediations == []
    assert k8s10 == k8s200, (k8s10, k8s200)
    assert aws10 == aws200, (aws10, aws200)
    # One LIST per kind of object, cluster-wide with the label selector; reads only.
    for resource in ("inferenceendpointconfigs", "pods", "persistentvolumeclaims"):
        assert k8s200[("list", resource)] == 1, k8s200
    # managed Deployments cluster-wide, and the operator's namespace (its controller under either name)
    assert k8s200[("list", "deployments")] == 2, k8s200
    assert {verb for verb, _ in k8s200} <= {"list", "get"}
    assert k8s200[("get", "deployments")] == 0  # nothing per endpoint
