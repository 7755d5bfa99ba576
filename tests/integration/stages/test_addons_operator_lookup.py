"""Stage 2 verifies the operator wherever it is installed (docs/reference/hyperpod.md#inference-operator-controller): a
Helm-installed controller (``hyperpod-inference-operator-controller-manager``) is found as well as the add-on's."""

from __future__ import annotations

import pytest
from stagekit import converge_cluster

from kvfleet.fleet import constants as C
from kvfleet.stages import addons, operator_pause

pytestmark = pytest.mark.integration
PROD = "ml-prod-use1"


def test_verify_operator_finds_a_helm_installed_controller(fleet_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    converge_cluster(make_ctx, PROD)
    operator = fleet_env.twin(PROD).services["operator"]
    operator.reinstall_as(C.OPERATOR_HELM_DEPLOYMENT)
    try:
        state = addons.verify_operator(make_ctx(PROD))
        assert C.OPERATOR_HELM_DEPLOYMENT in state and "served=True" in state
        assert operator_pause.controller_name(make_ctx(PROD)) == C.OPERATOR_HELM_DEPLOYMENT
    finally:
        operator.reinstall_as(C.OPERATOR_DEPLOYMENT)
    assert C.OPERATOR_DEPLOYMENT in addons.verify_operator(make_ctx(PROD))
