"""The API server's Service proxy: ``/api/v1/namespaces/{ns}/services/{id}/proxy/{path}``, where ``id`` is
``name``, ``name:port`` or ``scheme:name:port`` (kubernetes ``pkg/registry/core/service/storage/storage.go``,
``ResourceLocation``; facts and sources in ``tests/conformance/facts/service_proxy.yaml``).

Called from ``routing.Request.proxy`` when the resource is ``services``. A real cluster splits the work in two:
the endpoints controller keeps an Endpoints object per Service (a pod matching the selector goes to
``addresses`` when Ready, to ``notReadyAddresses`` when not, and not at all when terminating or terminal), and the
apiserver's proxy picks a random address among the Ready ones of the subset that carries the requested port.
The emulator has no endpoints controller, so :func:`endpoints_of` computes the same Endpoints object from the
pods at request time; :func:`resolve` then applies the proxy's rules. A pod that is not Ready, terminating
(``metadata.deletionTimestamp``) or finished takes no new request. The chosen pod is reached through the store's
pod-proxy handlers (the simulated vLLM), exactly as ``pods/{name}:{port}/proxy`` does.

Deviations, on purpose: no pod IP check against ``status.podIPs`` (``isValidAddress``) is needed since the
Endpoints object is never stale; Service types other than ClusterIP/NodePort/LoadBalancer answer 503 like
upstream's "unsupported service type"; the ``https`` scheme is accepted and proxied like ``http``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kvfleet_sandbox.kube.errors import ApiError, not_found
from kvfleet_sandbox.kube.label_selectors import match_labels_to_selector
from kvfleet_sandbox.kube.store import KubeStore

__all__ = ["Backend", "endpoints_of", "pod_serves", "resolve", "split_scheme_name_port"]

PROXYABLE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
_random = random.Random()


@dataclass(frozen=True)
class Backend:
    """Where one proxied request goes: a pod and its container port."""

    pod: str
    port: int


def split_scheme_name_port(service_id: str) -> tuple[str, str, str]:
    """``name`` | ``name:port`` | ``scheme:name:port`` → (scheme, name, port), as apimachinery's
    ``utilnet.SplitSchemeNamePort``: scheme only ``http``/``https``/empty, the name never empty; 400 otherwise."""
    parts = service_id.split(":")
    if len(parts) == 1:
        scheme, name, port = "", parts[0], ""
    elif len(parts) == 2:
        scheme, (name, port) = "", parts
    elif len(parts) == 3:
        scheme, name, port = parts
    else:
        scheme, name, port = "", "", ""
    if not name or scheme not in ("", "http", "https"):
        raise ApiError(400, "BadRequest", f'invalid service request "{service_id}"')
    return scheme, name, port


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def pod_serves(pod: dict[str, Any]) -> bool | None:
    """True: a Ready address; False: a not-Ready address; None: not in the Endpoints at all (terminal phase, no IP
    yet, or terminating), as ``ShouldPodBeInEndpoints`` with includeTerminating=false."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if not status.get("podIP") and not status.get("podIPs"):
        return None
    return _ready(pod)


def _target_port(service_port: dict[str, Any], pod: dict[str, Any]) -> int | None:
    """The container port a Service port targets on this pod: a number, or a named container port (absent on
    this pod: the pod is left out of that port's subset, as the endpoints controller does)."""
    target = service_port.get("targetPort", service_port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target:
                return int(port["containerPort"])
    return None


def _address(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"ip": (pod.get("status") or {}).get("podIP", ""), "nodeName": (pod.get("spec") or {}).get("nodeName"),
            "targetRef": {"kind": "Pod", "namespace": meta.get("namespace"), "name": meta["name"],
                          "uid": meta.get("uid")}}


def endpoints_of(store: KubeStore, service: dict[str, Any]) -> dict[str, Any]:
    """The Endpoints object the endpoints controller would keep for ``service``: one subset per Service port
    (the controller repacks identical ones; one per port is equivalent for the proxy), Ready pods in
    ``addresses``, not-Ready ones in ``notReadyAddresses``. No selector: no subsets (those Endpoints are
    managed by hand)."""
    meta, spec = service["metadata"], service.get("spec") or {}
    selector = spec.get("selector") or {}
    subsets: list[dict[str, Any]] = []
    if selector:
        pods = store.list("", "pods", meta.get("namespace"), match_labels_to_selector({"matchLabels": selector}))
        for sport in spec.get("ports") or []:
            ready: list[dict[str, Any]] = []
            not_ready: list[dict[str, Any]] = []
            number = None
            for pod in pods:
                serves, target = pod_serves(pod), _target_port(sport, pod)
                if serves is None or target is None:
                    continue
                number = target
                (ready if serves else not_ready).append(_address(pod))
            if ready or not_ready:
                subsets.append({"addresses": ready, "notReadyAddresses": not_ready,
                                "ports": [{"name": sport.get("name", ""), "port": number,
                                           "protocol": sport.get("protocol", "TCP")}]})
    return {"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace")}, "subsets": subsets}


def _port_name(service: dict[str, Any], name: str, port: str) -> str:
    """A port *number* is replaced by the name of the Service port that declares it (503 if none does)."""
    if not port.isdigit():
        return port
    for sport in (service.get("spec") or {}).get("ports") or []:
        if int(sport.get("port", -1)) == int(port):
            return str(sport.get("name", ""))
    raise ApiError(503, "ServiceUnavailable", f'no service port {int(port)} found for service "{name}"')


def resolve(store: KubeStore, namespace: str, service_id: str) -> Backend:
    """The backend for one request to ``services/{service_id}/proxy``: a random Ready address of the subset
    whose port name matches; 404 for an unknown Service, 503 ``no endpoints available`` when none serves."""
    _, name, port = split_scheme_name_port(service_id)
    service = store.get("", "services", name, namespace)
    if service is None:
        raise not_found("", "services", name)
    port_name = _port_name(service, name, port)
    kind = (service.get("spec") or {}).get("type", "ClusterIP")
    if kind not in PROXYABLE_TYPES:
        raise ApiError(503, "ServiceUnavailable", f'unsupported service type "{kind}"')
    subsets = endpoints_of(store, service)["subsets"]
    if not subsets:
        raise ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{name}"')
    for subset in subsets:
        match = [p for p in subset["ports"] if p["name"] == port_name]
        if subset["addresses"] and match:
            address = _random.choice(subset["addresses"])
            return Backend(address["targetRef"]["name"], int(match[0]["port"]))
    raise ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{service_id}"')
