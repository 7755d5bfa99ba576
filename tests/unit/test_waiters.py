"""The waiter models (``kvfleet.clients.waiters``) against botocore's own data: the service's status enums and
EKS's ``AddonActive`` waiter, read from the installed botocore."""

from __future__ import annotations

import botocore.session
import pytest
from botocore.waiter import WaiterModel, create_waiter_with_client

from kvfleet.clients import hyperpod, waiters


def _enum(service: str, shape: str) -> list[str]:
    return list(botocore.session.get_session().get_service_model(service).shape_for(shape).enum)


@pytest.mark.parametrize("status", _enum("sagemaker", "ClusterStatus"))
def test_every_cluster_status_has_a_verdict(status: str) -> None:
    verdict = waiters.state_of(waiters.CLUSTER_IN_SERVICE, {"ClusterStatus": status})
    want = {"InService": "success", "Failed": "failure", "RollingBack": "failure", "Deleting": "failure"}
    assert verdict == want.get(status, "retry")


@pytest.mark.parametrize("status", _enum("eks", "AddonStatus"))
def test_addon_verdicts_are_botocores_plus_the_two_failures_it_retries(status: str) -> None:
    session = botocore.session.get_session()
    theirs = session.get_waiter_model("eks").get_waiter("AddonActive")
    botocore_verdict = next((a.state for a in theirs.acceptors if a.matcher_func({"addon": {"status": status}})),
                            "retry")
    ours = waiters.state_of(waiters.ADDON_ACTIVE, {"addon": {"status": status}})
    if status in ("UPDATE_FAILED", "DELETE_FAILED"):
        assert (botocore_verdict, ours) == ("retry", "failure")  # botocore would wait them out; they never recover
    else:
        assert ours == botocore_verdict


def test_a_missing_cluster_or_addon_fails_and_a_throttle_is_not_judged() -> None:
    missing = {"Error": {"Code": "ValidationException", "Message": "Cluster x not found"}}
    assert waiters.state_of(waiters.CLUSTER_IN_SERVICE, missing) == "failure"
    for code in ("ResourceNotFoundException", "ResourceNotFound"):  # both read as "not found" by DescribeAddon
        gone = {"Error": {"Code": code, "Message": "No addon"}}
        assert waiters.state_of(waiters.ADDON_ACTIVE, gone) == "failure"
    throttled = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}
    assert waiters.state_of(waiters.CLUSTER_IN_SERVICE, throttled) == "retry"


def test_the_model_builds_real_botocore_waiters_and_the_exported_states_are_its_own() -> None:
    session = botocore.session.get_session()
    for service, name in (("sagemaker", waiters.CLUSTER_IN_SERVICE), ("eks", waiters.ADDON_ACTIVE)):
        client = session.create_client(service, region_name="us-east-1", aws_access_key_id="x",
                                       aws_secret_access_key="x")
        waiter = create_waiter_with_client(name, WaiterModel(waiters.MODEL), client)
        assert waiter.name == name
    assert {"InService"} == hyperpod.CLUSTER_OK
    assert {"Failed", "RollingBack", "Deleting"} == hyperpod.CLUSTER_FAILED
    assert {"ACTIVE"} == hyperpod.ADDON_OK
    assert {"CREATE_FAILED", "DEGRADED", "UPDATE_FAILED", "DELETE_FAILED"} == hyperpod.ADDON_FAILED
