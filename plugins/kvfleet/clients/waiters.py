"""What "ready", "failed" and "keep waiting" mean for a HyperPod cluster and an EKS add-on: botocore waiter
models (waits are data, not loops, as the amazon provider keeps its own in ``aws/waiters/*.json``).

Both the in-worker waits (``HyperPodClient.wait_cluster``/``wait_addon``) and the triggerer's
``ClusterReadyTrigger`` judge a ``DescribeCluster``/``DescribeAddon`` response with the same acceptors
(``state_of``), in botocore's order: the first acceptor that matches decides, none is "retry". Between attempts
they sleep and log the status, as the provider's ``waiter_with_logging.wait`` does (a plain botocore waiter
cannot say what it is waiting on). Sources (botocore 1.44.8, ``botocore/data``):
- ``sagemaker/2017-07-24/service-2.json`` ``ClusterStatus``: Creating, Deleting, Failed, InService, RollingBack,
  SystemUpdating, Updating. SageMaker has no cluster waiter in ``waiters-2.json``; ``ClusterInService`` is
  kvfleet's: InService is success; Failed, RollingBack and Deleting end the wait at once (RollingBack: an update
  failed and is being undone, so the change kvfleet waits for will not come); the others retry.
- ``eks/2017-11-01/waiters-2.json`` ``AddonActive``: success ACTIVE, failure CREATE_FAILED and DEGRADED. kvfleet's
  model adds UPDATE_FAILED and DELETE_FAILED (``service-2.json`` ``AddonStatus``), which botocore's retries until
  it runs out of attempts although neither comes back by itself, and a missing add-on.
``delay``/``maxAttempts`` are the defaults of a plain ``botocore.waiter`` built from this model; kvfleet's waits
take their period from ``KVFLEET_POLL_SECONDS`` and their patience from the stage timeouts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from botocore.waiter import WaiterModel

CLUSTER_IN_SERVICE: Final = "ClusterInService"
ADDON_ACTIVE: Final = "AddonActive"


def _path(argument: str, expected: str, state: str) -> dict[str, str]:
    return {"matcher": "path", "argument": argument, "expected": expected, "state": state}


def _error(code: str) -> dict[str, str]:
    return {"matcher": "error", "expected": code, "state": "failure"}


MODEL: Final[dict[str, Any]] = {
    "version": 2,
    "waiters": {
        CLUSTER_IN_SERVICE: {
            "operation": "DescribeCluster", "delay": 30, "maxAttempts": 120,
            "acceptors": [
                _path("ClusterStatus", "InService", "success"),
                _path("ClusterStatus", "Failed", "failure"),
                _path("ClusterStatus", "RollingBack", "failure"),
                _path("ClusterStatus", "Deleting", "failure"),
                _error("ResourceNotFound"),
                _error("ValidationException"),  # SageMaker's answer for an unknown cluster name
            ],
        },
        ADDON_ACTIVE: {
            "operation": "DescribeAddon", "delay": 10, "maxAttempts": 60,
            "acceptors": [
                _path("addon.status", "CREATE_FAILED", "failure"),
                _path("addon.status", "DEGRADED", "failure"),
                _path("addon.status", "UPDATE_FAILED", "failure"),
                _path("addon.status", "DELETE_FAILED", "failure"),
                _path("addon.status", "ACTIVE", "success"),
                _error("ResourceNotFoundException"),
                _error("ResourceNotFound"),  # the code kvfleet's DescribeAddon also reads as "not found"
            ],
        },
    },
}
_MODEL: Final = WaiterModel(MODEL)

State = Literal["success", "failure", "retry"]


def state_of(waiter: str, response: Mapping[str, Any]) -> State:
    """The waiter's verdict on one response (an error response is ``ClientError.response``): the state of the
    first acceptor that matches, in the model's order, else "retry" — botocore's own rule (``Waiter.wait``)."""
    for acceptor in _MODEL.get_waiter(waiter).acceptors:
        if acceptor.matcher_func(dict(response)):
            state: State = acceptor.state
            return state
    return "retry"


def expected(waiter: str, state: str) -> frozenset[str]:
    """The status values the model's ``path`` acceptors send to ``state`` (for messages and the frozensets
    ``clients.hyperpod`` exports)."""
    return frozenset(str(a.expected) for a in _MODEL.get_waiter(waiter).acceptors
                     if a.matcher == "path" and a.state == state)
