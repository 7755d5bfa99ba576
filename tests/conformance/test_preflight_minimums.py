"""Conformance: the values `kvfleet preflight` checks are the ones facts/preflight_minimums.yaml records with their
sources (and the twin seeds what preflight expects)."""

from __future__ import annotations

from pathlib import Path

import yaml

from kvfleet.fleet import constants as C
from kvfleet.stages import preflight
from kvfleet_sandbox import aws_prereqs as seed

SHEET = yaml.safe_load((Path(__file__).parent / "facts" / "preflight_minimums.yaml").read_text())


def _v(text: str) -> tuple[int, int, int]:
    major, minor, patch = text.removeprefix("v").split("-")[0].split(".")
    return int(major), int(minor), int(patch)


def test_minimum_versions_are_the_recorded_ones() -> None:
    minimums = SHEET["addon_minimums"]
    assert set(preflight.MINIMUM_VERSIONS) == {k for k in minimums if k != "comparison"}
    for addon, version in preflight.MINIMUM_VERSIONS.items():
        assert version == _v(minimums[addon]["minimum"])
        assert (minimums[addon]["source"] == "none" and "No source gives a minimum" in minimums[addon]["fact"]) \
            or minimums[addon]["source"]["page"]


def test_the_twin_seeds_versions_that_pass() -> None:
    assert _v(seed.VPC_CNI_VERSION) >= preflight.MINIMUM_VERSIONS["vpc-cni"]
    assert _v(seed.EBS_CSI_VERSION) >= preflight.MINIMUM_VERSIONS["aws-ebs-csi-driver"]


def test_names_and_principals_are_the_recorded_ones() -> None:
    assert preflight.EBS_CSI_ROLE == seed.EBS_CSI_ROLE == SHEET["ebs_csi_role"]["name"]
    assert preflight.EBS_CSI_POLICY_ARN == seed.EBS_CSI_POLICY_ARN == SHEET["ebs_csi_role"]["policy"]
    assert SHEET["execution_role"]["trusted_service"] == preflight.EXECUTION_ROLE_SERVICE
    assert SHEET["execution_role"]["trusted_web_identity"] == \
        f"system:serviceaccount:{C.OPERATOR_NAMESPACE}:{C.OPERATOR_DEPLOYMENT}"
    assert SHEET["storage_class"]["provisioner"] == preflight.EBS_PROVISIONER
    assert SHEET["gpu_nodes"]["minimum"] == preflight.MIN_GPU_NODES
    assert f"system:serviceaccount:kube-system:{preflight.EBS_CSI_SERVICE_ACCOUNT}" == seed.EBS_CSI_SERVICE_ACCOUNT
