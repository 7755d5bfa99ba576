"""The resource types one emulated cluster serves: the built-in table, and types added by CRDs.

Called from ``store.KubeStore`` (to know a type's kind, scope, versions and subresources) and from
``discovery`` (to render ``/api``, ``/apis`` and the resource lists kubectl and helm read before anything else).
A custom resource type is derived from its CustomResourceDefinition object when the CRD is created.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass
class ResourceType:
    """One (group, plural) the emulator serves, in every version it serves."""

    group: str
    plural: str
    kind: str
    namespaced: bool
    versions: list[str]
    storage_version: str
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    subresources: set[str] = field(default_factory=set)
    # Custom resources only: openAPIV3Schema per version, and the CRD's scale paths.
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    scale_paths: dict[str, str] | None = None
    is_custom: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    def api_version(self, version: str | None = None) -> str:
        v = version or self.storage_version
        return f"{self.group}/{v}" if self.group else v


def _t(group: str, version: str, plural: str, kind: str, namespaced: bool = True, *,
       short: tuple[str, ...] = (), sub: tuple[str, ...] = ()) -> ResourceType:
    return ResourceType(group=group, plural=plural, kind=kind, namespaced=namespaced, versions=[version],
                        storage_version=version, singular=kind.lower(), short_names=list(short),
                        subresources=set(sub))


def builtin_types() -> list[ResourceType]:
    """The built-in types kvfleet, its simulated controllers, kubectl and helm touch."""
    return [
        _t("", "v1", "namespaces", "Namespace", False, short=("ns",), sub=("status",)),
        _t("", "v1", "nodes", "Node", False, short=("no",), sub=("status",)),
        _t("", "v1", "pods", "Pod", short=("po",), sub=("status", "log", "proxy")),
        _t("", "v1", "services", "Service", short=("svc",), sub=("status", "proxy")),
        _t("", "v1", "endpoints", "Endpoints", short=("ep",)),
        _t("", "v1", "configmaps", "ConfigMap", short=("cm",)),
        _t("", "v1", "secrets", "Secret"),
        _t("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",)),
        _t("", "v1", "events", "Event", short=("ev",)),
        _t("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), sub=("status",)),
        _t("", "v1", "persistentvolumes", "PersistentVolume", False, short=("pv",), sub=("status",)),
        _t("apps", "v1", "deployments", "Deployment", short=("deploy",), sub=("status", "scale")),
        _t("apps", "v1", "statefulsets", "StatefulSet", short=("sts",), sub=("status", "scale")),
        _t("apps", "v1", "daemonsets", "DaemonSet", short=("ds",), sub=("status",)),
        _t("apps", "v1", "replicasets", "ReplicaSet", short=("rs",), sub=("status", "scale")),
        _t("batch", "v1", "jobs", "Job", sub=("status",)),
        _t("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, short=("sc",)),
        _t("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False),
        _t("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
           short=("crd", "crds"), sub=("status",)),
        _t("rbac.authorization.k8s.io", "v1", "roles", "Role"),
        _t("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
        _t("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
        _t("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
        _t("coordination.k8s.io", "v1", "leases", "Lease"),
        _t("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",), sub=("status",)),
        _t("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
           "MutatingWebhookConfiguration", False),
        _t("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
           "ValidatingWebhookConfiguration", False),
    ]


def crd_type(crd: dict[str, Any]) -> ResourceType:
    """The served type a CustomResourceDefinition declares (apiextensions.k8s.io/v1 shape)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    served = [v for v in spec.get("versions") or [] if v.get("served", True)]
    storage = next((v["name"] for v in served if v.get("storage")), served[0]["name"] if served else "v1")
    subresources: set[str] = set()
    scale_paths = None
    for v in served:
        sub = v.get("subresources") or {}
        if "status" in sub:
            subresources.add("status")
        if "scale" in sub:
            subresources.add("scale")
            scale_paths = dict(sub["scale"] or {})
    return ResourceType(
        group=spec.get("group", ""), plural=names.get("plural", ""), kind=names.get("kind", ""),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        versions=[v["name"] for v in served], storage_version=storage,
        singular=names.get("singular") or names.get("kind", "").lower(),
        short_names=list(names.get("shortNames") or []), subresources=subresources,
        schemas={v["name"]: (v.get("schema") or {}).get("openAPIV3Schema") or {} for v in served},
        scale_paths=scale_paths, is_custom=True,
    )
