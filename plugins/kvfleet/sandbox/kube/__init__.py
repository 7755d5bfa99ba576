"""Kubernetes API emulator: one ``KubeStore`` + ``KubeApiServer`` per emulated EKS cluster.

Used by ``kvfleet sandbox up``, by the simulated controllers (which read, write and watch through the store) and
by integration tests, so that the official Python client, real ``kubectl`` and real ``helm`` run unchanged
against a cluster that lives in this process. See ``server`` for the HTTP layer and why it is not ``kmock``, and
``store`` for what the apiserver behaviour covers.

Limitations worth knowing: deletion is immediate (no finalizers, no graceful deletion, no garbage collection of
owned objects); server-side apply merges the applied configuration into the live object without tracking field
managers (so a field dropped from an applied manifest is not removed and conflicts are never reported); CRD
versions share one stored shape (only ``apiVersion`` is rewritten, no conversion webhook is called); no OpenAPI
documents are served (kubectl and helm fall back, see the tests).
"""

from kvfleet.sandbox.kube.errors import ApiError
from kvfleet.sandbox.kube.server import KubeApiServer
from kvfleet.sandbox.kube.store import KubeStore, ProxyResponse, RequestRecord

__all__ = ["ApiError", "KubeApiServer", "KubeStore", "ProxyResponse", "RequestRecord"]
