"""Kubernetes API emulator: one ``KubeStore`` + ``KubeApiServer`` per emulated EKS cluster.

Used by ``kvfleet sandbox up``, by the simulated controllers (which read, write and watch through the store) and
by integration tests, so that the official Python client, real ``kubectl`` and real ``helm`` run unchanged
against a cluster that lives in this process. See ``server`` for the HTTP layer and why it is not ``kmock``, and
``store`` for what the apiserver behaviour covers.

What the real clients needed, found by running them: legacy discovery is enough (kubectl 1.37 asks for
aggregated discovery but accepts the legacy form); ``kubectl apply`` refuses to run without ``/openapi/v3``, so a
minimal document declares ``fieldValidation`` support per kind and kubectl leaves validation to the server
(``/openapi/v2`` is 404 and nobody asks for it); helm 4 installs and upgrades with server-side apply by default
(``--server-side=false`` works too); helm's release Secrets and kubectl's ``create`` generators send protobuf
bodies, decoded for Secret, ConfigMap and Namespace (``protobuf``); client-go sends a kubeconfig's token only
over TLS, so the server speaks TLS too (``tls``) and refuses anonymous requests (401), as EKS does; RBAC
(``rbac``) is enforced for every user outside ``system:masters``.

Watch follows the watch cache (``watching``: resourceVersion replay, bookmarks, 410 as an ERROR event,
timeoutSeconds), so ``kubectl rollout status`` and ``kubectl wait`` work; ``services/<name>:<port>/proxy`` routes to
a Ready, non-terminating pod of the Service (``services``), as the apiserver does over the endpoints controller.

Limitations worth knowing: deletion is immediate (no finalizers, no graceful deletion, no garbage collection of
owned objects); server-side apply removes what the same field manager stopped applying but does not model
ownership across managers or apply conflicts; CRD versions share one stored shape (only ``apiVersion`` is
rewritten, no conversion webhook is called); CEL rules other than ``self == oldSelf`` are ignored; ``kubectl
create`` of kinds other than Secret/ConfigMap/Namespace is refused (415) because of protobuf: use ``apply -f``.
"""

from kvfleet_sandbox.kube.errors import ApiError
from kvfleet_sandbox.kube.server import KubeApiServer
from kvfleet_sandbox.kube.store import KubeStore, ProxyResponse, RequestRecord

__all__ = ["ApiError", "KubeApiServer", "KubeStore", "ProxyResponse", "RequestRecord"]
