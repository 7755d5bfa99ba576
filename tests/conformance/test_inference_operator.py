"""Conformance: the operator's controller names and labels (facts/inference_operator.yaml) are kvfleet's constants,
and kvfleet's discovery (``operator_pause.find_controller``) finds the controller under either name, or by the
chart's labels alone, on a real Kubernetes client against the twin's API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.fleet import constants as C
from kvfleet.stages.operator_pause import find_controller

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "inference_operator.yaml").read_text())
HELM, ADDON = FACTS["helm"]["manager"], FACTS["addon"]


def test_the_constants_are_the_upstream_names_and_labels() -> None:
    assert ADDON["name"] == C.OPERATOR_DEPLOYMENT
    assert C.OPERATOR_HELM_DEPLOYMENT == HELM["name"] == f"{FACTS['helm']['values']['namePrefix']}-controller-manager"
    assert C.OPERATOR_NAMESPACE == HELM["namespace"] == ADDON["namespace"] == \
        f"{FACTS['helm']['values']['shortPrefix']}-system"
    assert ADDON["addon_name"] == C.OPERATOR_ADDON
    assert HELM["labels"][C.OPERATOR_CONTROL_PLANE_LABEL] == HELM["name"]
    assert HELM["labels"][C.OPERATOR_NAME_LABEL] == C.OPERATOR_NAME_VALUE


def _deployment(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": C.OPERATOR_NAMESPACE, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": dict(labels)},
                     "template": {"metadata": {"labels": dict(labels)},
                                  "spec": {"containers": [{"name": HELM["container"], "image": "manager:1"}]}}}}


class _Kube:
    """The two attributes of kvfleet's ClusterAccess that discovery uses, on the official client."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.apps = client.AppsV1Api(api_client)


@pytest.fixture
def bare_twin(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A bare API server of the example fleet's first cluster (no controllers), and a client with kvfleet's
    identity (EKS-style bearer token, so kvfleet's RBAC applies)."""
    from kubernetes import client

    from kvfleet_sandbox.runtime import eks_token, start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    sandbox = start_sandbox(Path(__file__).resolve().parents[2] / "tests" / "fleets" / "twin.yaml", tmp_path / "sb",
                            SandboxSettings(), controllers=())
    try:
        twin = sandbox.twin(next(iter(sandbox.twins)))
        config = client.Configuration()
        config.host = sandbox.servers[twin.name].url
        config.api_key = {"authorization": f"Bearer {eks_token(twin.region)}"}
        config.verify_ssl = False
        api = client.ApiClient(config)
        try:
            yield twin, _Kube(api)
        finally:
            api.close()
    finally:
        sandbox.stop()


@pytest.mark.integration
@pytest.mark.parametrize("name, labels", [
    (HELM["name"], HELM["labels"]),  # a Helm install, as the chart renders it
    (ADDON["name"], {"control-plane": ADDON["name"]}),  # the EKS add-on
    ("renamed-manager", {C.OPERATOR_NAME_LABEL: C.OPERATOR_NAME_VALUE}),  # neither name: the chart's label
])
def test_discovery_finds_the_controller_by_either_name_or_its_labels(bare_twin, name,  # type: ignore[no-untyped-def]
                                                                     labels) -> None:
    twin, kube = bare_twin
    twin.store.create("", "namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": C.OPERATOR_NAMESPACE}})
    twin.store.create("apps", "deployments", _deployment("unrelated", {"app": "unrelated"}))
    assert find_controller(kube) is None
    twin.store.create("apps", "deployments", _deployment(name, labels))
    found = find_controller(kube)
    assert found is not None and found[0] == name
