"""The one place kvfleet builds the clients of a cluster: its HyperPod (SageMaker and EKS) client and its Kubernetes
access, from the cluster's reference (``kvfleet.fleet.cluster_ref.ClusterRef``: account, region, name).

Every stage context (``kvfleet.stages.base.StageContext``), trigger (``kvfleet.airflow.triggers``) and CLI command
reaches a cluster through here. Today each account is reached with the base identity, the Airflow connection
``aws_conn_id``; reaching each account with its own identity changes this module, not its callers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvfleet.clients.hyperpod import HyperPodClient
    from kvfleet.clients.kube import ClusterAccess
    from kvfleet.fleet.cluster_ref import ClusterRef


def hyperpod_for(ref: ClusterRef, aws_conn_id: str | None = "aws_default") -> HyperPodClient:
    """The SageMaker and EKS client of the cluster's account and region."""
    from kvfleet.clients.hyperpod import HyperPodClient

    return HyperPodClient(ref.region, aws_conn_id)


def kube_for(ref: ClusterRef, aws_conn_id: str | None = "aws_default", *,
             hyperpod: HyperPodClient | None = None) -> ClusterAccess:
    """The Kubernetes access of the cluster (its EKS endpoint and token, from its HyperPod client: ``hyperpod`` when
    the caller already holds the cluster's)."""
    from kvfleet.clients.kube import ClusterAccess

    return ClusterAccess.from_hyperpod(hyperpod or hyperpod_for(ref, aws_conn_id), ref.name)
