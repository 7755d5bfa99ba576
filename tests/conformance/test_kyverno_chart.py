"""Kyverno as kvfleet installs it: the pinned chart, repository, values and names in
plugins/kvfleet/stages/kyverno.py and in the sandbox's stand-in chart and simulation are those recorded with their
upstream sources in tests/conformance/facts/kyverno_chart.yaml; the stand-in renders with real `helm template`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.clients.helm import helm_binary, split_manifest
from kvfleet.stages import kyverno
from kvfleet_sandbox import chart_repo
from kvfleet_sandbox.controllers import kyverno as simulation

ROOT = Path(__file__).resolve().parents[2]
FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "kyverno_chart.yaml").read_text())
STAND_IN = ROOT / "sandbox" / "kvfleet_sandbox" / "charts" / "kyverno"


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node[part]
    return node


def test_kvfleet_pins_the_recorded_chart() -> None:
    chart = FACTS["chart"]
    recorded = (chart["name"], chart["version"], chart["repo"], chart["namespace"], "kyverno")
    assert recorded == (kyverno.CHART, kyverno.CHART_VERSION, kyverno.REPO, kyverno.NAMESPACE, kyverno.RELEASE)
    for key, fact in FACTS["values"].items():
        if "kvfleet" in fact:
            assert _get(kyverno.VALUES, key) == fact["kvfleet"], key
    names = FACTS["names"]
    assert names["admission_deployment"]["name"] == kyverno.ADMISSION_DEPLOYMENT
    assert dict(p.split("=") for p in kyverno.ADMISSION_SELECTOR.split(",")).items() <= \
        names["admission_labels"].items()
    assert kyverno.POLICY_CRD in names["crds"]
    assert FACTS["webhooks"]["resource_mutating"] == kyverno.RESOURCE_WEBHOOK


def test_the_simulation_uses_the_recorded_names() -> None:
    assert FACTS["names"]["admission_deployment"]["name"] == simulation.ADMISSION_DEPLOYMENT
    assert simulation.ADMISSION_LABELS.items() <= FACTS["names"]["admission_labels"].items()
    assert set(simulation.WEBHOOK_CONFIGURATIONS) == {FACTS["webhooks"]["resource_mutating"],
                                                      FACTS["webhooks"]["policy_mutating"]}
    assert FACTS["chart"]["namespace"] == simulation.KYVERNO_NAMESPACE


def test_the_stand_in_keeps_the_upstream_value_keys_and_defaults() -> None:
    values = yaml.safe_load((STAND_IN / "values.yaml").read_text())
    for key, fact in FACTS["values"].items():
        if "default" in fact:
            assert _get(values, key) == fact["default"], key
    image = FACTS["values"]["admissionController.container.image"]
    assert {k: v for k, v in _get(values, "admissionController.container.image").items() if k != "tag"} == \
        {k: image[k] for k in ("registry", "defaultRegistry", "repository")}


def test_the_repository_publishes_the_pinned_version_with_its_app_version() -> None:
    pkg = chart_repo.package_chart("kyverno", FACTS["chart"]["version"],
                                   app_version=chart_repo.APP_VERSIONS[("kyverno", FACTS["chart"]["version"])])
    assert pkg.app_version == FACTS["chart"]["app_version"]
    assert FACTS["chart"]["version"] in chart_repo.DEFAULT_VERSIONS["kyverno"]


def test_the_stand_in_renders_the_recorded_names(tmp_path: Path) -> None:
    try:
        helm = helm_binary()
    except Exception as exc:  # any reason helm is unavailable is a skip reason
        pytest.skip(f"helm is not available: {exc}")
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(kyverno.VALUES))
    out = subprocess.run([helm, "template", kyverno.RELEASE, str(STAND_IN), "-n", kyverno.NAMESPACE, "-f",
                          str(values)], capture_output=True, text=True, check=True).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in split_manifest(out)}
    dep = docs[("Deployment", FACTS["names"]["admission_deployment"]["name"])]
    assert dep["metadata"]["namespace"] == FACTS["chart"]["namespace"]
    assert FACTS["names"]["admission_labels"].items() <= dep["metadata"]["labels"].items()
    assert FACTS["names"]["admission_labels"].items() <= dep["spec"]["selector"]["matchLabels"].items()
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "reg.kyverno.io/kyverno/kyverno:0.0.0-source"
    assert ("Service", FACTS["names"]["service"]) in docs
    assert {n for k, n in docs if k == "CustomResourceDefinition"} == set(FACTS["names"]["crds"])
    webhooks_in_chart = any(k == "MutatingWebhookConfiguration" for k, _ in docs)
    assert webhooks_in_chart is FACTS["webhooks"]["created_by_chart"]  # the admission controller makes them
