"""The one place kvfleet builds the clients of a cluster: its HyperPod (SageMaker and EKS) client and its Kubernetes
access, from the cluster's reference (``kvfleet.fleet.cluster_ref.ClusterRef``: account, region, name) and the
identity kvfleet acts as there (``kvfleet.clients.identity.Identity``: the base identity, and the account's role
assumed from it).

Every stage context (``kvfleet.stages.base.StageContext``), trigger (``kvfleet.airflow.triggers``) and CLI command
reaches a cluster through here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvfleet.clients.hyperpod import HyperPodClient
    from kvfleet.clients.identity import Identity
    from kvfleet.clients.kube import ClusterAccess
    from kvfleet.fleet.cluster_ref import ClusterRef


def hyperpod_for(ref: ClusterRef, identity: Identity | str | None = "aws_default") -> HyperPodClient:
    """The SageMaker and EKS client of the cluster's account and region, as ``identity`` (a connection id or None:
    the base identity alone)."""
    from kvfleet.clients.hyperpod import HyperPodClient

    return HyperPodClient(ref.region, identity)


def kube_for(ref: ClusterRef, identity: Identity | str | None = "aws_default", *,
             hyperpod: HyperPodClient | None = None) -> ClusterAccess:
    """The Kubernetes access of the cluster (its EKS endpoint and token, from its HyperPod client: ``hyperpod`` when
    the caller already holds the cluster's)."""
    from kvfleet.clients.kube import ClusterAccess

    return ClusterAccess.from_hyperpod(hyperpod or hyperpod_for(ref, identity), ref.name)
