"""Read-only readiness checks of Kubernetes objects that stages 1 and 2 wait for, by name, so that a wait can run
in the worker (``kvfleet.clients.kube.wait_for``) or in Airflow's triggerer (``KubeReadyTrigger``) with
the same judgement: a check is ``(ClusterAccess, **args) -> (ready, observed state)``, ``args`` plain JSON.

- ``ai_toolkit``: after a tiered storage change, the HyperPod ``aws-hyperpod/ai-toolkit`` DaemonSet has a ready pod
  on every node (``Enable``) or is gone (``Disable``);
- ``operator``: the Inference Operator's controller Deployment has a ready replica and the InferenceEndpointConfig
  CRD is served;
- ``curvine_rollout``, ``curvine_pvcs``, ``curvine_capacity`` (stage 3, after Curvine's install or flip): both
  StatefulSets rolled out on their newest revision; the RWX PVC Bound in every endpoint namespace; the master's
  API reporting the live workers and about workers × dataDir size of capacity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from kvfleet.clients.curvine import CurvineMaster
from kvfleet.clients.kube import call, get_or_none
from kvfleet.fleet import constants as C

Check = Callable[..., tuple[bool, str]]
CAPACITY_TOLERANCE: Final = 0.05  # the master's capacity may differ from workers × dataDir size by this fraction


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


def curvine_rollout(kube: Any, *, namespace: str) -> tuple[bool, str]:
    """Both Curvine StatefulSets fully rolled out on their newest revision (a values change rolls the pods)."""
    states = []
    done = True
    for name in (C.CURVINE_MASTER_STS, C.CURVINE_WORKER_STS):
        sts = get_or_none(kube.apps.read_namespaced_stateful_set, name, namespace)
        if sts is None:
            return False, f"{name} missing"
        st, want = sts.status, sts.spec.replicas or 0
        ok = ((st.observed_generation or 0) >= (sts.metadata.generation or 0) and (st.updated_replicas or 0) == want
              and (st.ready_replicas or 0) == want and (st.replicas or 0) == want)
        done = done and ok
        states.append(f"{name} updated {st.updated_replicas or 0}/{want} ready {st.ready_replicas or 0}/{want}")
    return done, ", ".join(states)


def curvine_pvcs(kube: Any, *, namespaces: list[str]) -> tuple[bool, str]:
    """The Curvine RWX PVC is Bound in every one of ``namespaces``; the first that is not, with its conditions and
    latest events (why a PVC stays Pending)."""
    for ns in namespaces:
        pvc = call(kube.core.read_namespaced_persistent_volume_claim, C.CURVINE_PVC, ns, what="read PVC")
        phase = pvc.status.phase if pvc.status else None
        if phase == "Bound":
            continue
        conds = "; ".join(f"{c.type}={c.status}: {c.message}" for c in (pvc.status.conditions or [])) \
            if pvc.status else ""
        events = call(kube.core.list_namespaced_event, ns, field_selector=f"involvedObject.name={C.CURVINE_PVC}",
                      what="PVC events").items
        ev = "; ".join(f"{e.reason}: {e.message}" for e in events[-3:])
        return False, (f"PVC {ns}/{C.CURVINE_PVC} {phase or 'Pending'}" + (f" ({conds})" if conds else "")
                       + (f" events: {ev}" if ev else ""))
    return True, f"PVC {C.CURVINE_PVC} Bound in {len(namespaces)} namespace(s)"


def curvine_capacity(kube: Any, *, namespace: str, workers: int, worker_bytes: int) -> tuple[bool, str]:
    """The master's API reports ``workers`` live workers and about ``workers × worker_bytes`` of capacity."""
    ov = CurvineMaster(kube, namespace).overview()
    want_bytes = workers * worker_bytes
    ok = ov.live_workers == workers and abs(ov.capacity - want_bytes) <= CAPACITY_TOLERANCE * want_bytes
    return ok, (f"live workers {ov.live_workers}/{workers}, capacity {ov.capacity / 2**30:.0f} GiB "
                f"(expected ~{want_bytes / 2**30:.0f} GiB)")


CHECKS: Final[dict[str, Check]] = {"ai_toolkit": ai_toolkit, "operator": operator,
                                   "curvine_rollout": curvine_rollout, "curvine_pvcs": curvine_pvcs,
                                   "curvine_capacity": curvine_capacity}
WHAT: Final[dict[str, str]] = {"ai_toolkit": f"{C.AI_TOOLKIT_NAMESPACE}/{C.AI_TOOLKIT_DAEMONSET}",
                               "operator": "inference operator", "curvine_rollout": "curvine rollout",
                               "curvine_pvcs": f"curvine PVCs ({C.CURVINE_PVC})",
                               "curvine_capacity": "Curvine master API"}


def check(kube: Any, name: str, args: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Run the named check (an unknown name is a programming error: KeyError)."""
    return CHECKS[name](kube, **dict(args or {}))
