"""The desired-state rules shared by stage 4 and the drift check, and the one JSON patch of `patch` mode."""

from __future__ import annotations

import copy

import pytest

from kvfleet.fleet import constants as C
from kvfleet.fleet.endpoint_spec import immutable_changes, l2_patch, l2_violations, render_iec
from kvfleet.fleet.inventory import Endpoint, Settings

S = Settings()


def _deployment(env: list[dict], volumes: list | None = None, mounts: list | None = None) -> dict:
    return {"metadata": {"name": "chat"}, "spec": {"template": {"spec": {
        "containers": [{"name": "chat", "env": env, "volumeMounts": mounts or []},
                       {"name": "reverse-proxy"}, {"name": "otel-collector"}],
        "volumes": volumes or []}}}}


def _apply(doc: dict, ops: list[dict]) -> dict:
    """A minimal RFC 6902 applier for the ops l2_patch emits (test, add, remove, replace)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "test":
            got = parent[int(last)] if isinstance(parent, list) else parent[last]
            assert got == op["value"], f"test failed at {op['path']}"
        elif op["op"] == "remove":
            del parent[int(last)]
        elif op["op"] == "replace":
            parent[int(last) if isinstance(parent, list) else last] = op["value"]
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.append(op["value"]) if last == "-" else parent.insert(int(last), op["value"])
            else:
                parent[last] = op["value"]
    return doc


OPERATOR_ENV = [{"name": "NODE_IP", "value": "x"}, {"name": "LMCACHE_LOCAL_CPU", "value": "True"},
                {"name": C.ENV_REMOTE_URL, "value": C.OPERATOR_L2_URL},
                {"name": C.ENV_REMOTE_SERDE, "value": "naive"}, {"name": C.ENV_HASHSEED, "value": "0"}]


@pytest.mark.parametrize("index", [0, 2, 4])
def test_patch_leaves_exactly_one_fs_url_wherever_the_operator_put_its_own(index: int) -> None:
    env = [e for e in OPERATOR_ENV if e["name"] != C.ENV_REMOTE_URL]
    env.insert(index, {"name": C.ENV_REMOTE_URL, "value": C.OPERATOR_L2_URL})
    dep = _deployment(env)
    kinds = {v.kind for v in l2_violations(dep["spec"]["template"]["spec"], "chat", S)}
    assert {"operator_l2_url", "patch_lost_to_reconcile"} <= kinds
    patched = _apply(dep, l2_patch(dep, S))
    spec = patched["spec"]["template"]["spec"]
    assert l2_violations(spec, "chat", S) == []
    assert [e["value"] for e in spec["containers"][0]["env"] if e["name"] == C.ENV_REMOTE_URL] == [C.L2_URL]
    assert spec["containers"][1] == {"name": "reverse-proxy"}  # sidecars untouched
    assert l2_patch(patched, S) == []  # idempotent: nothing left to do


def test_duplicate_urls_are_collapsed_to_one() -> None:
    env = [*OPERATOR_ENV, {"name": C.ENV_REMOTE_URL, "value": C.L2_URL}]
    dep = _deployment(env)
    assert "duplicate_l2_url" in {v.kind for v in l2_violations(dep["spec"]["template"]["spec"], "chat", S)}
    spec = _apply(dep, l2_patch(dep, S))["spec"]["template"]["spec"]
    assert [e["value"] for e in spec["containers"][0]["env"] if e["name"] == C.ENV_REMOTE_URL] == [C.L2_URL]


def test_patch_test_ops_refuse_a_concurrent_rerender() -> None:
    dep = _deployment(list(OPERATOR_ENV))
    ops = l2_patch(dep, S)
    rerendered = copy.deepcopy(dep)
    rerendered["spec"]["template"]["spec"]["containers"][0]["env"].insert(0, {"name": "NEW", "value": "1"})
    with pytest.raises(AssertionError, match="test failed"):
        _apply(rerendered, ops)


def test_missing_seed_and_wrong_serde_are_named() -> None:
    env = [{"name": C.ENV_REMOTE_URL, "value": C.L2_URL}, {"name": C.ENV_REMOTE_SERDE, "value": "cachegen"}]
    kinds = {v.kind for v in l2_violations({"containers": [{"name": "chat", "env": env}]}, "chat", S)}
    assert {"hash_seed_missing", "serde_mismatch", "patch_lost_to_reconcile"} <= kinds


def test_rendered_iec_keeps_the_url_out_and_carries_seed_and_serde() -> None:
    ep = Endpoint(name="chat", namespace="retail", lob="retail", cluster="c", model="qwen2-7b",
                  instance_type="ml.g5.4xlarge", routing="kvaware")
    iec = render_iec(ep, S)
    env = {e["name"]: e["value"] for e in iec["spec"]["worker"]["environmentVariables"]}
    assert C.ENV_REMOTE_URL not in env and env[C.ENV_HASHSEED] == "0" and env[C.ENV_REMOTE_SERDE] == "naive"
    assert iec["spec"]["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "kvaware"}
    live = copy.deepcopy(iec["spec"])
    live["intelligentRoutingSpec"]["enabled"] = False
    assert immutable_changes(live, iec["spec"]) == ["spec.intelligentRoutingSpec.enabled: live False, inventory wants True"]


def _chat_iec() -> dict:
    ep = Endpoint(name="chat", namespace="retail", lob="retail", cluster="c", model="qwen2-7b",
                  instance_type="ml.g5.4xlarge", routing="kvaware")
    return render_iec(ep, S)


@pytest.mark.parametrize("absent", ["missing", "null"])
def test_adding_intelligent_routing_to_an_existing_endpoint_is_refused(absent: str) -> None:
    """The CRD: "Adding this configuration to an existing deployment will be rejected." A live CR without
    intelligentRoutingSpec must not be given one (refusing only a changed value let this through)."""
    iec = _chat_iec()
    live = copy.deepcopy(iec["spec"])
    if absent == "missing":
        del live["intelligentRoutingSpec"]
    else:
        live["intelligentRoutingSpec"] = None
    refused = immutable_changes(live, iec["spec"])
    assert len(refused) == 1  # one reason, not also an "enabled changed" for the same section
    assert refused[0].startswith("spec.intelligentRoutingSpec: absent on the live endpoint, inventory adds ")
    assert "'routingStrategy': 'kvaware'" in refused[0] and "will be rejected" in refused[0]


def test_a_present_routing_section_without_enabled_counts_as_the_crd_default_false() -> None:
    iec = _chat_iec()
    live = copy.deepcopy(iec["spec"])
    live["intelligentRoutingSpec"] = {"routingStrategy": "kvaware"}
    assert immutable_changes(live, iec["spec"]) == [
        "spec.intelligentRoutingSpec.enabled: live False, inventory wants True"]


def test_an_unchanged_routing_section_and_a_strategy_change_are_not_refused() -> None:
    iec = _chat_iec()
    assert immutable_changes(copy.deepcopy(iec["spec"]), iec["spec"]) == []
    live = copy.deepcopy(iec["spec"])
    live["intelligentRoutingSpec"]["routingStrategy"] = "prefixaware"  # only `enabled` is immutable in the CRD
    assert immutable_changes(live, iec["spec"]) == []
