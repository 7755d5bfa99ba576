"""kvfleet's Curvine install values against the REAL curvine runtime chart (worker placement): real
`helm template` of CurvineIO/curvine-helm's curvine-runtime with the values kvfleet installs gives workers pinned to
HyperPod GPU nodes with a REQUIRED anti-affinity on the hostname, and after the flip the format flags render false.

The chart is read from a local copy of CurvineIO/curvine-helm's curvine-runtime (``DEFAULT_CHART``, override with
KVFLEET_UPSTREAM_CURVINE_CHART); a clean CI clone may not have it, so the tests skip with the reason then.
The facts are in tests/conformance/facts/curvine_chart_values.yaml."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.clients.helm import helm_binary, split_manifest
from kvfleet.fleet import curvine_values as cv
from kvfleet.fleet.inventory import load_inventory

ROOT = Path(__file__).resolve().parents[2]
FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "curvine_chart_values.yaml").read_text())
DEFAULT_CHART = ROOT.parent / "shared" / "reference" / "upstream" / "curvine-helm" / "curvine-runtime"
FLEET = """
clusters:
  - name: ml-cv
    region: us-east-1
    gpu_nodes: {count: 2, instance_type: ml.g5.4xlarge}
    curvine:
      worker: {replicas: 2, size: 100Gi}
"""


def _chart() -> Path:
    path = Path(os.environ.get("KVFLEET_UPSTREAM_CURVINE_CHART") or DEFAULT_CHART)
    if not (path / "Chart.yaml").is_file():
        reason = (f"the real curvine-runtime chart is not at {path} (a clean clone has no copy of the upstream charts); "
                  "set KVFLEET_UPSTREAM_CURVINE_CHART to a copy of CurvineIO/curvine-helm/curvine-runtime")
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    try:
        helm_binary()
    except Exception as exc:  # any reason helm is unavailable is a skip reason
        print(f"SKIP: {exc}")
        pytest.skip(str(exc))
    return path


def _template(chart: Path, values: dict[str, Any], tmp_path: Path, name: str) -> list[dict[str, Any]]:
    vals = tmp_path / f"{name}.yaml"
    vals.write_text(yaml.safe_dump(values, sort_keys=True))
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp_path / "c"), "HELM_CONFIG_HOME": str(tmp_path / "cfg"),
           "HELM_DATA_HOME": str(tmp_path / "d")}
    # a copy: helm never writes into the read-only reference tree
    work = tmp_path / "chart"
    if not work.exists():
        shutil.copytree(chart, work)
    proc = subprocess.run([helm_binary(), "template", "curvine", str(work), "-n", "curvine", "-f", str(vals)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return split_manifest(proc.stdout)


@pytest.fixture
def install_values(tmp_path: Path) -> dict[str, Any]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    return cv.nested(cv.install_values(load_inventory(fleet).cluster("ml-cv")))


def _worker(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-worker")]
    return sts


def _toml(docs: list[dict[str, Any]]) -> str:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")]
    return str(cm["data"][FACTS["format_flags"]["rendered_in"]["key"]])


def test_the_chart_is_the_one_the_facts_name() -> None:
    chart = _chart()
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert (meta["name"], str(meta["version"])) == (FACTS["chart"]["name"], FACTS["chart"]["version"])
    defaults = yaml.safe_load((chart / "values.yaml").read_text())
    assert defaults["worker"]["nodeSelector"] == FACTS["worker_placement"]["node_selector"]["default"]
    assert defaults["worker"]["antiAffinity"] == FACTS["worker_placement"]["anti_affinity"]["default"]
    assert {f"cluster.{k}": v for k, v in defaults["cluster"].items() if k.startswith("format")} \
        == FACTS["format_flags"]["defaults"]


def test_kvfleet_sets_the_keys_the_facts_record(install_values: dict[str, Any]) -> None:
    sets = FACTS["kvfleet_sets"]
    assert install_values["worker"]["nodeSelector"] == sets["worker.nodeSelector"]
    assert install_values["worker"]["antiAffinity"] == sets["worker.antiAffinity"]
    assert install_values["master"]["nodeSelector"] == sets["master.nodeSelector"]
    assert cv.nested(cv.safe_flags()) == cv.nested(sets["after_flip"])


def test_by_default_the_real_chart_pins_no_worker(tmp_path: Path) -> None:
    """Why kvfleet must set the placement: the chart's own defaults leave workers free to land anywhere."""
    problems = cv.placement_problems(_template(_chart(), {}, tmp_path, "defaults"))
    assert any("nodeSelector" in p for p in problems) and any("required pod anti-affinity" in p for p in problems)


def test_install_values_pin_workers_to_hyperpod_nodes_one_per_node(install_values, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    docs = _template(_chart(), install_values, tmp_path, "install")
    assert cv.placement_problems(docs) == []
    pod = _worker(docs)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"sagemaker.amazonaws.com/compute-type": "hyperpod"}
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == _worker(docs)["spec"]["selector"]["matchLabels"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAntiAffinity"]
    # the first install formats (the detector sees it in the real chart's TOML)
    toml = _toml(docs)
    assert "format_master = true" in toml and "format_worker = true" in toml
    assert len(cv.rendered_format_findings(docs)) == 2


def test_after_the_flip_the_format_flags_render_false(install_values, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    flipped = cv.merged_values(install_values, cv.safe_flags())
    docs = _template(_chart(), flipped, tmp_path, "flipped")
    toml = _toml(docs)
    assert "format_master = false" in toml and "format_worker = false" in toml
    assert "format_journal" not in toml  # no real template reads cluster.formatJournal
    assert cv.rendered_format_findings(docs) == []
    assert cv.placement_problems(docs) == []  # the flip keeps the placement


def test_a_flag_through_the_free_form_toml_overrides_is_seen_in_the_render(install_values, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """configOverrides.master is written verbatim into the TOML: the rendered check catches it, and the override
    check refuses the key before anything is rendered."""
    values = cv.merged_values(install_values, {**cv.safe_flags(), "configOverrides.master.format_master": True})
    findings = cv.rendered_format_findings(_template(_chart(), values, tmp_path, "overrides"))
    assert findings and all("format_master = true" in f for f in findings)
    assert cv.format_override_problems({"configOverrides.master.format_master": True})
