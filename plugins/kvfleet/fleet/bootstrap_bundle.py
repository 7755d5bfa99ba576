"""The kvfleet-bootstrap bundle: what a cluster admin applies once per cluster, before kvfleet's first rollout,
because writing it takes rights kvfleet's runtime identity does not hold (k8s/rbac/README.md, "Bootstrap").

- **kvfleet's runtime roles**: the hand-written ClusterRoles of ``k8s/rbac/cluster.yaml`` and
  ``k8s/rbac/endpoints.yaml`` (and ``kyverno-mode.yaml`` on a kyverno-mode cluster) with their bindings to the
  group ``kvfleet``.
- **The namespaces** of the cluster's endpoints and its Curvine namespace, each with the RoleBinding of its
  ClusterRole to the group ``kvfleet`` (a RoleBinding cannot exist before its namespace).
- **kvfleet's ClusterPolicy** on a kyverno-mode cluster (``fleet.endpoint_spec.kyverno_policy``): kvfleet's
  runtime role may get and patch it by name, never create one.
- **Curvine's own RBAC**, which both Curvine charts would otherwise create and which kvfleet, installing the
  charts with ``rbac.create=false`` (``fleet.curvine_values.NO_CHART_RBAC``), no longer writes: the CSI driver's two
  ServiceAccounts, ClusterRoles and ClusterRoleBindings (cluster-wide rights on Secrets, PersistentVolumes and
  VolumeAttachments: whoever writes them must hold those rights or ``escalate``/``bind``), and the runtime
  chart's Role and RoleBinding. Names and rules are the charts' (``tests/conformance/facts/curvine_charts.yaml``,
  ``cluster_roles``): the CSI release ``curvine-csi`` names its objects ``curvine-csi-node`` and
  ``curvine-csi-controller``; the runtime release ``curvine`` names its Role, RoleBinding and ServiceAccount
  ``curvine``. In the CSI chart the ServiceAccounts are under ``rbac.create`` too, so the bundle creates them;
  the runtime chart keeps creating its ServiceAccount (``serviceAccount.create``).

Kyverno itself (its CRDs, its ClusterRoles) is a helm chart, not part of these objects: on a kyverno-mode cluster
the bundle's header gives the exact ``helm`` command (``kvfleet.stages.kyverno.install_command``).

Rendered by ``kvfleet bootstrap --print`` and by ``tools/render-k8s-manifests.py`` (``k8s/rbac/curvine-rbac.yaml``,
``k8s/rbac/endpoint-namespaces.yaml``); the sandbox applies the same files before a test's first rollout.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from kvfleet.fleet import constants as C

GROUP = "kvfleet"  # the Kubernetes group kvfleet's IAM role is mapped to (k8s/rbac/eks-access-entry.json)
ENDPOINT_CLUSTER_ROLE = "kvfleet:endpoint-namespace"
CURVINE_CLUSTER_ROLE = "kvfleet:curvine-namespace"
RBAC = "rbac.authorization.k8s.io"
RUNTIME_FILES = ("cluster.yaml", "endpoints.yaml")
KYVERNO_FILE = "kyverno-mode.yaml"
BUNDLE_LABEL = "kvfleet.io/bootstrap"  # on every Curvine object the bundle adds: `kubectl get -A -l ...`
# helm pkg/kube/client.go Client.Update: an object the new manifest drops is not deleted when the live object is
# annotated so (pkg/kube/resource_policy.go ResourcePolicyAnno, KeepPolicy).
KEEP = ("helm.sh/resource-policy", "keep")

CSI_NODE = "curvine-csi-node"
CSI_CONTROLLER = "curvine-csi-controller"
RUNTIME_RBAC_NAME = "curvine"  # Role, RoleBinding and ServiceAccount of release "curvine" (the chart's fullname)

_CORE, _STORAGE = "", "storage.k8s.io"
_ALL = ["get", "list", "watch", "create", "update", "patch", "delete"]
# (apiGroup, resources, verbs) of each chart role: curvine-helm curvine-csi/templates/clusterrole.yaml and
# curvine-runtime/templates/rbac.yaml (facts: tests/conformance/facts/curvine_charts.yaml, cluster_roles).
CSI_NODE_RULES: list[tuple[str, list[str], list[str]]] = [
    (_CORE, ["secrets"], _ALL),
    (_CORE, ["pods"], ["create", "delete", "get", "list", "watch"]),
    (_CORE, ["configmaps"], ["create", "delete", "get", "list", "update", "watch"]),
    (_CORE, ["events"], ["create", "patch"]),
    (_CORE, ["persistentvolumes"], ["get", "list", "watch"]),
]
CSI_CONTROLLER_RULES: list[tuple[str, list[str], list[str]]] = [
    (_CORE, ["persistentvolumes"], ["get", "list", "watch", "create", "delete", "patch", "update"]),
    (_CORE, ["persistentvolumeclaims"], ["get", "list", "watch", "update"]),
    (_STORAGE, ["storageclasses"], ["get", "list", "watch"]),
    (_CORE, ["events"], ["get", "list", "watch", "create", "update", "patch"]),
    (_STORAGE, ["csinodes"], ["get", "list", "watch"]),
    (_CORE, ["nodes"], ["get", "list", "watch"]),
    (_STORAGE, ["volumeattachments"], ["get", "list", "watch", "create", "update", "delete", "patch"]),
    (_STORAGE, ["volumeattachments/status"], ["get", "update", "patch"]),
]
RUNTIME_RULES: list[tuple[str, list[str], list[str]]] = [
    (_CORE, ["pods"], ["get", "list", "watch"]),
    (_CORE, ["configmaps"], ["get", "list", "watch"]),
    (_CORE, ["services"], ["get", "list", "watch"]),
    ("apps", ["statefulsets"], ["get", "list", "watch"]),
]


def _labels(**extra: str) -> dict[str, str]:
    return {C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE, BUNDLE_LABEL: "true", **extra}


def _meta(name: str, namespace: str | None = None, **labels: str) -> dict[str, Any]:
    """Labelled as the bundle's, and kept by helm: a release installed with rbac.create=true before the bootstrap
    would otherwise delete these objects on kvfleet's next upgrade (which turns rbac.create off), and kvfleet may
    not delete roles (helm skips the delete of a live object annotated ``helm.sh/resource-policy: keep``)."""
    meta: dict[str, Any] = {"name": name, "labels": _labels(**labels), "annotations": {KEEP[0]: KEEP[1]}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _rules(rules: Iterable[tuple[str, list[str], list[str]]]) -> list[dict[str, Any]]:
    return [{"apiGroups": [g], "resources": list(r), "verbs": list(v)} for g, r, v in rules]


def _binding(kind: str, name: str, role_kind: str, subjects: list[dict[str, Any]],
             namespace: str | None = None) -> dict[str, Any]:
    return {"apiVersion": f"{RBAC}/v1", "kind": kind, "metadata": _meta(name, namespace),
            "roleRef": {"apiGroup": RBAC, "kind": role_kind, "name": name}, "subjects": subjects}


def curvine_rbac(namespace: str = C.CURVINE_NAMESPACE) -> list[dict[str, Any]]:
    """Curvine's RBAC objects for a cluster whose Curvine releases live in ``namespace``."""
    docs: list[dict[str, Any]] = []
    for name, component, rules in ((CSI_NODE, "node", CSI_NODE_RULES),
                                   (CSI_CONTROLLER, "controller", CSI_CONTROLLER_RULES)):
        docs.append({"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": _meta(name, namespace, **{"app.kubernetes.io/component": component})})
        docs.append({"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole",
                     "metadata": _meta(name, **{"app.kubernetes.io/component": component}),
                     "rules": _rules(rules)})
        docs.append(_binding("ClusterRoleBinding", name, "ClusterRole",
                             [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]))
    docs.append({"apiVersion": f"{RBAC}/v1", "kind": "Role",
                 "metadata": _meta(RUNTIME_RBAC_NAME, namespace),
                 "rules": _rules(RUNTIME_RULES)})
    docs.append(_binding("RoleBinding", RUNTIME_RBAC_NAME, "Role",
                         [{"kind": "ServiceAccount", "name": RUNTIME_RBAC_NAME, "namespace": namespace}],
                         namespace=namespace))
    return docs


def namespace_bindings(endpoint_namespaces: Iterable[str], curvine_namespaces: Iterable[str]) -> list[dict[str, Any]]:
    """Each namespace, then the RoleBinding of its kvfleet ClusterRole to the group ``kvfleet`` there."""
    labels = {C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE}
    grants = [(ns, ENDPOINT_CLUSTER_ROLE, "kvfleet-endpoint") for ns in sorted(set(endpoint_namespaces))]
    grants += [(ns, CURVINE_CLUSTER_ROLE, "kvfleet-curvine") for ns in sorted(set(curvine_namespaces))]
    docs: list[dict[str, Any]] = []
    for ns, role, binding in grants:
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}})
        docs.append({"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
                     "metadata": {"name": binding, "namespace": ns, "labels": labels},
                     "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
                     "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": GROUP}]})
    return docs


def runtime_role_files(rbac_dir: Path, kyverno: bool) -> list[Path]:
    """The hand-written runtime RBAC files a cluster gets, in the order they are applied."""
    names = [*RUNTIME_FILES, *((KYVERNO_FILE,) if kyverno else ())]
    return [rbac_dir / n for n in names]


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def bundle(cluster: Any, endpoint_namespaces: Iterable[str], rbac_dir: Path,
           policy: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object of one cluster's bootstrap: the runtime roles, the namespaces with their bindings, Curvine's
    RBAC, and on a kyverno-mode cluster kvfleet's ClusterPolicy ``policy`` (``fleet.endpoint_spec.kyverno_policy``
    of the inventory's settings: kvfleet may only get and patch it, by name). ``cluster`` is an inventory cluster
    (``l2_injection``, ``curvine.namespace``)."""
    docs: list[dict[str, Any]] = []
    kyverno = cluster.l2_injection == "kyverno"
    for path in runtime_role_files(rbac_dir, kyverno):
        docs += load_yaml_docs(path)
    docs += namespace_bindings(endpoint_namespaces, [cluster.curvine.namespace])
    docs += curvine_rbac(cluster.curvine.namespace)
    if kyverno and policy is not None:
        docs.append(policy)  # last: it needs Kyverno's CRD, which the header's helm command installs first
    return docs


def missing_policy(fleet: str, cluster: str, name: str) -> str:
    """Why kvfleet refuses to go on when its ClusterPolicy is missing on a kyverno-mode cluster."""
    return (f"kvfleet's ClusterPolicy {name} does not exist on cluster {cluster} (kyverno mode), and kvfleet's "
            "identity may not create ClusterPolicies (any of them mutates workloads with Kyverno's rights): with "
            f"Kyverno installed, apply the cluster's kvfleet-bootstrap bundle, which creates it: "
            f"{apply_command(fleet, cluster)}")


def dump(docs: Iterable[dict[str, Any]]) -> str:
    return "---\n".join(yaml.safe_dump(d, sort_keys=True, default_flow_style=False, width=120) for d in docs)


def apply_command(fleet: str, cluster: str) -> str:
    return (f"kvfleet bootstrap --print --fleet {shlex.quote(fleet)} --cluster {shlex.quote(cluster)}"
            " | kubectl apply -f -")


def missing_namespace(fleet: str, cluster: str, namespace: str) -> str:
    """Why kvfleet refuses to go on when a namespace of the cluster's endpoints (or its Curvine namespace) is
    missing: it may not create one, since whoever creates a namespace sets its Pod Security labels."""
    return (f"namespace {namespace} does not exist on cluster {cluster}, and kvfleet's identity may not create "
            "namespaces (their Pod Security labels are a cluster admin's): apply the cluster's kvfleet-bootstrap "
            f"bundle, which creates it with kvfleet's RoleBinding there: {apply_command(fleet, cluster)}")


def render_text(cluster: Any, endpoint_namespaces: Iterable[str], rbac_dir: Path, *, fleet: str,
                kyverno_install: str | None = None, policy: dict[str, Any] | None = None) -> str:
    """The bundle as a cluster admin applies it: a header saying what, when and how, then the objects.
    ``kyverno_install``: the commands that install Kyverno, for a kyverno-mode cluster (printed first)."""
    lines = [f"# kvfleet-bootstrap for cluster {cluster.name} (fleet {fleet}): what kvfleet's runtime identity may not",
             "# write itself (k8s/rbac/README.md, Bootstrap). A cluster admin applies it once before kvfleet's first",
             "# rollout on this cluster, and again whenever the inventory adds an endpoint namespace:",
             f"#   {apply_command(fleet, cluster.name)}",
             f"# Every object it adds is labelled {BUNDLE_LABEL}=true or is a kvfleet runtime role:",
             "#   kubectl get clusterroles,clusterrolebindings,roles,rolebindings,serviceaccounts -A"
             f" -l {BUNDLE_LABEL}"]
    if kyverno_install:
        lines += [f"# Cluster {cluster.name} is in kyverno mode: install Kyverno first (its CRDs and roles):"]
        lines += [f"#   {line}" for line in kyverno_install.splitlines()]
    return "\n".join(lines) + "\n" + dump(bundle(cluster, endpoint_namespaces, rbac_dir, policy))


__all__ = ["BUNDLE_LABEL", "CSI_CONTROLLER", "CSI_NODE", "GROUP", "RUNTIME_RBAC_NAME",
           "apply_command", "bundle", "curvine_rbac", "dump", "missing_namespace", "missing_policy",
           "namespace_bindings", "render_text", "runtime_role_files"]
