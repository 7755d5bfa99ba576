"""``ClusterReadyTrigger`` and ``KubeReadyTrigger``: the rollout's waits for a cluster, an add-on or a Kubernetes
readiness check, in the triggerer.

Deferred to by ``kvfleet.airflow.rollout`` before a stage starts (the cluster InService, an add-on ACTIVE) and
after a change it waits on (``kvfleet.stages.readiness``: the ai-toolkit daemon, the operator's controller).
Terminal-state algebra as in ``kvfleet.clients.hyperpod``: a state that can never become the target ends the wait
at once with an ``error`` event naming the state and the service's own message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from kvfleet.airflow.triggers.events import ERROR, SUCCESS, classpath, event
from kvfleet.clients.identity import Identity
from kvfleet.fleet.cluster_ref import DEFAULT_ACCOUNT, ClusterRef


def worth_waiting_on(exc: BaseException) -> bool:
    """A check that raised this is polled again: kvfleet's ``TemporaryError`` (throttling, 5xx, 409, as
    ``classify`` says) or a call without an answer (``kvfleet.clients.transient``). Anything else (a
    ``PermanentError``, no credentials, a bad check) ends the wait at once, as it would fail a worker's task."""
    from kvfleet.clients.transient import is_network_error
    from kvfleet.errors import TemporaryError

    return isinstance(exc, TemporaryError) or is_network_error(exc)


class ClusterReadyTrigger(BaseTrigger):
    """Waits until the HyperPod cluster is ``InService`` (SageMaker DescribeCluster) or, with ``addon``, until
    that EKS add-on of the cluster's EKS cluster is ``ACTIVE``: a failed
    state, or a cluster or add-on that does not exist, is an ``error`` event at once with the service's
    FailureMessage or health issues. The states are judged by kvfleet's botocore waiter models
    (``kvfleet.clients.waiters``: SageMaker has no cluster waiter in botocore, and EKS's ``AddonActive`` lacks two
    failure states), and the trigger polls as the amazon provider's ``AwsBaseWaiterTrigger`` does (sleep between
    attempts, one event)."""

    def __init__(self, cluster: str, region: str, *, identity: Mapping[str, Any] | None = None,
                 addon: str | None = None, poll_s: float = 10.0, timeout_s: float | None = None,
                 started_at: float | None = None, aws_conn_id: str | None = "aws_default",
                 account: str = DEFAULT_ACCOUNT) -> None:
        """``identity``: who the task reached the cluster as (``Identity.as_dict``); ``aws_conn_id`` and ``account``
        are read only without it (a trigger a task deferred on before the identity was passed)."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.cluster, self.region, self.addon = cluster, region, addon
        self.identity = Identity.from_dict(identity) if identity else Identity(account=account, conn_id=aws_conn_id)
        self.ref = ClusterRef(self.identity.account, region, cluster)
        self.poll_s, self.timeout_s = float(poll_s), timeout_s
        self.started_at = float(started_at) if started_at is not None else time.time()
        self._client: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath(self), {"cluster": self.cluster, "region": self.region, "identity": self.identity.as_dict(),
                                 "addon": self.addon, "poll_s": self.poll_s, "timeout_s": self.timeout_s,
                                 "started_at": self.started_at}

    def _hyperpod(self) -> Any:
        if self._client is None:
            from kvfleet.clients.factory import hyperpod_for

            self._client = hyperpod_for(self.ref, self.identity)
        return self._client

    def _check(self) -> tuple[str | None, str]:
        """(status or None: keep waiting, message). Runs in a thread. The verdicts are the waiter models'
        (``kvfleet.clients.waiters``), the same the in-worker waits use."""
        from kvfleet.clients.hyperpod import health_issues

        hp = self._hyperpod()
        verdict, cluster = hp.cluster_wait_state(self.cluster)
        if cluster is None:
            return ERROR, f"HyperPod cluster {self.cluster!r} not found in {self.region}"
        if verdict == "failure":
            return ERROR, (f"HyperPod cluster {self.cluster} is {cluster.status}: "
                           f"{cluster.failure_message or 'no FailureMessage'}")
        if self.addon is None:
            return (SUCCESS if verdict == "success" else None), f"HyperPod cluster {self.cluster} is {cluster.status}"
        # An add-on is judged by itself: a cluster update in flight does not hold it (as ``wait_addon``).
        verdict, state = hp.addon_wait_state(cluster.eks_cluster_name, self.addon)
        status = (state or {}).get("status", "MISSING")
        where = f"EKS add-on {self.addon} on {cluster.eks_cluster_name}"
        if verdict == "success":
            return SUCCESS, f"{where} is {status}"
        if verdict == "failure":
            return ERROR, f"{where} is {status}: {health_issues(state)}"
        return None, f"{where} is {status}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                status, message = await asyncio.to_thread(self._check)
            except Exception as exc:
                if worth_waiting_on(exc):
                    status, message = None, f"transient: {exc}"
                else:
                    status, message = ERROR, f"{type(exc).__name__}: {exc}"
            if status is not None:
                yield event({"status": status, "cluster": self.cluster, "addon": self.addon, "message": message})
                return
            waited = time.time() - self.started_at
            if self.timeout_s is not None and waited >= self.timeout_s:
                yield event({"status": ERROR, "cluster": self.cluster, "addon": self.addon,
                             "reason": "timeout", "message": f"{message} after {waited:.0f}s"})
                return
            self.log.info("[%s] %s; waiting (%.0fs)", self.cluster, message, waited)
            await asyncio.sleep(self.poll_s)


class KubeReadyTrigger(ClusterReadyTrigger):
    """Waits until a named Kubernetes readiness check of the cluster holds (``kvfleet.stages.readiness``: the
    ai-toolkit daemon after a tiered storage change, the operator's controller after its add-on), polled as
    ``ClusterReadyTrigger`` polls, through kvfleet's Kubernetes client for the cluster (built in a thread from
    the HyperPod cluster's EKS endpoint, as ``KubeWatchTrigger`` builds it). What the check raises is judged by
    ``worth_waiting_on``: an API server that does not answer yet keeps waiting; a ``PermanentError`` (a cluster
    that reports no CA, a refused request) is an ``error`` event."""

    def __init__(self, cluster: str, region: str, *, check: str, args: Mapping[str, Any] | None = None,
                 identity: Mapping[str, Any] | None = None, poll_s: float = 10.0, timeout_s: float | None = None,
                 started_at: float | None = None, aws_conn_id: str | None = "aws_default",
                 account: str = DEFAULT_ACCOUNT) -> None:
        super().__init__(cluster, region, identity=identity, poll_s=poll_s, timeout_s=timeout_s,
                         started_at=started_at, aws_conn_id=aws_conn_id, account=account)
        self.check, self.args = check, dict(args or {})
        self._access: Any = None
        self._ended = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        path, kwargs = super().serialize()
        kwargs.pop("addon")
        return path, {**kwargs, "check": self.check, "args": self.args}

    def _check(self) -> tuple[str | None, str]:
        from kvfleet.clients.factory import kube_for
        from kvfleet.stages import readiness as checks

        if self._access is None:
            access = kube_for(self.ref, self.identity, hyperpod=self._hyperpod())
            if self._ended:  # cancelled while this thread was connecting: nobody else will close it
                access.close()
                return None, "cancelled"
            self._access = access
        ready, state = checks.check(self._access, self.check, self.args)
        return (SUCCESS if ready else None), f"{checks.WHAT[self.check]}: {state}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            async for item in super().run():
                yield item
        finally:
            self._ended = True
            if self._access is not None:
                await asyncio.to_thread(self._access.close)
