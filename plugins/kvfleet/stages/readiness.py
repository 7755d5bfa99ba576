"""Read-only readiness checks of Kubernetes objects that stages 1 and 2 wait for, by name, so that a wait can run
in the worker (``kvfleet.clients.kube.wait_for``) or in Airflow's triggerer (``KubeReadyTrigger``, issue 19) with
the same judgement: a check is ``(ClusterAccess, **args) -> (ready, observed state)``, ``args`` plain JSON.

- ``ai_toolkit``: after a tiered storage change, the HyperPod ``aws-hyperpod/ai-toolkit`` DaemonSet has a ready pod
  on every node (``Enable``) or is gone (``Disable``);
- ``operator``: the Inference Operator's controller Deployment has a ready replica and the InferenceEndpointConfig
  CRD is served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from kvfleet.clients.kube import get_or_none
from kvfleet.fleet import constants as C

Check = Callable[..., tuple[bool, str]]


def ai_toolkit(kube: Any, *, mode: str, nodes: int) -> tuple[bool, str]:
    ds = get_or_none(kube.apps.read_namespaced_daemon_set, C.AI_TOOLKIT_DAEMONSET, C.AI_TOOLKIT_NAMESPACE)
    if mode == "Disable":
        return ds is None, "ai-toolkit absent" if ds is None else "ai-toolkit still present"
    if ds is None:
        return False, "ai-toolkit DaemonSet not created yet"
    ready = getattr(ds.status, "number_ready", None) or 0
    desired = getattr(ds.status, "desired_number_scheduled", None) or 0
    return ready == desired == nodes, f"ai-toolkit ready {ready}/{desired} on {nodes} nodes"


def operator(kube: Any) -> tuple[bool, str]:
    from kvfleet.stages import operator_pause

    found = operator_pause.find_controller(kube)
    if found is None:
        return False, "controller Deployment not created yet"
    name, dep = found
    ready = getattr(dep.status, "ready_replicas", None) or 0
    crd = get_or_none(kube.apiext.read_custom_resource_definition, C.IEC_CRD_NAME)
    served = crd is not None and any(v.name == C.IEC_VERSION and v.served for v in crd.spec.versions)
    return ready >= 1 and served, f"controller {name} ready {ready}, CRD {C.IEC_CRD_NAME} served={served}"


CHECKS: Final[dict[str, Check]] = {"ai_toolkit": ai_toolkit, "operator": operator}
WHAT: Final[dict[str, str]] = {"ai_toolkit": f"{C.AI_TOOLKIT_NAMESPACE}/{C.AI_TOOLKIT_DAEMONSET}",
                               "operator": "inference operator"}


def check(kube: Any, name: str, args: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Run the named check (an unknown name is a programming error: KeyError)."""
    return CHECKS[name](kube, **dict(args or {}))
