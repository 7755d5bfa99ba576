"""Kyverno, simulated: ``kyverno.io/v1`` ClusterPolicy (and namespaced Policy) ``mutate.patchStrategicMerge``
rules applied on admission.

Attached by ``kvfleet_sandbox.runtime`` to every cluster twin, which says how Kyverno starts there
(``twin.services["kyverno_install"]``, :data:`INSTALL_MODES`):

- ``crds`` (patch-mode clusters): the ClusterPolicy and Policy CRDs (``clusterpolicies.kyverno.io``, short name
  ``cpol``; ``policies.kyverno.io``, ``pol``) and the admission hook, serving at once;
- ``preinstalled`` (kyverno-mode clusters, ``SandboxSettings.kyverno``'s default): a platform team's install is
  there: the CRDs, namespace ``kyverno`` and the admission controller Deployment ``kyverno-admission-controller``
  under the chart's labels;
- ``chart``: nothing until the stand-in chart (``sandbox/charts/kyverno``, served by ``chart_repo``) is installed,
  as kvfleet's stage 2 does (``kvfleet.stages.kyverno``): its CRDs come from the chart, and the simulation starts
  serving once the chart's admission controller Deployment is available.

In every mode, once that Deployment is available the simulation creates the MutatingWebhookConfigurations
``kyverno-resource-mutating-webhook-cfg`` and ``kyverno-policy-mutating-webhook-cfg``, as upstream's webhook
controller does at run time (the chart does not ship them; kyverno/kyverno ``pkg/config/config.go``,
``pkg/controllers/webhook/controller.go`` at v1.19.0). The admission hook sits on the cluster's API store.

Every CREATE or UPDATE of a namespaced workload object (Deployment,
StatefulSet, DaemonSet, ReplicaSet, Pod, ...) — including the Inference Operator's re-renders, which are full
replaces through the store — passes through every matching rule, which is why a policy's injection survives a
reconcile while a ``kubectl patch`` does not (docs/reference/kyverno.md).

What is supported, i.e. what the policies in docs/reference/kyverno.md and the project's ``k8s/`` manifests use:

- ``match.any[].resources`` / ``match.all[].resources`` / legacy ``match.resources``, and ``exclude`` alike: ``kinds``
  (``Deployment``, ``apps/v1/Deployment``, ``*``), ``names`` and ``namespaces`` (wildcards ``*``/``?``),
  ``selector.matchLabels`` / ``matchExpressions`` against the object's own labels;
- auto-gen: a rule matching ``Pod`` also applies to Deployments, StatefulSets, DaemonSets, ReplicaSets and Jobs
  under ``spec.template`` unless the policy is annotated ``pod-policies.kyverno.io/autogen-controllers: none``;
- ``patchStrategicMerge`` with conditional anchors ``(key): value`` (wildcards; on list items they select which
  existing items get the patch — ``(name): "?*"`` every container, a literal name one container — and never add
  an item; in a map a failing condition skips the whole rule), add-if-absent anchors ``+(key)``, equality anchors
  ``=(key)`` (checked only when the key exists), lists merged by key: ``env``/``containers``/``volumes`` by
  ``name`` (an existing env var of the same name is replaced in place, so exactly one remains), ``volumeMounts``
  by ``mountPath``, ``ports`` by ``containerPort``; maps merged recursively; scalars replaced.

Policies apply to writes after they exist; there is no background scan of existing objects (Kyverno's
``mutateExistingOnPolicyUpdate`` is off by default). An invalid policy (a rule without ``name`` or ``match``, or a
non-object ``patchStrategicMerge``) is refused at admission like Kyverno's validating webhook does.

``twin.services["kyverno"]`` is the :class:`KyvernoSimulation`; ``applied`` counts (policy, rule) applications.
"""

from __future__ import annotations

import collections
import copy
import fnmatch
import logging
import re
import threading
from typing import Any

from kvfleet_sandbox.controllers._objects import create_quietly
from kvfleet_sandbox.kube.errors import ApiError
from kvfleet_sandbox.twin import ClusterTwin

log = logging.getLogger(__name__)

GROUP = "kyverno.io"
AUTOGEN_ANNOTATION = "pod-policies.kyverno.io/autogen-controllers"
AUTOGEN_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")
MERGE_KEYS = {"volumeMounts": "mountPath", "ports": "containerPort", "volumeDevices": "devicePath"}
# How the simulation starts on a cluster (twin.services["kyverno_install"], set by the runtime): "crds" the CRDs
# and the admission hook only (patch-mode clusters, as before); "preinstalled" a platform team's install (CRDs,
# namespace, admission controller Deployment); "chart" nothing until the chart installs its Deployment.
INSTALL_MODES = ("crds", "preinstalled", "chart")
KYVERNO_NAMESPACE = "kyverno"
ADMISSION_DEPLOYMENT = "kyverno-admission-controller"
ADMISSION_LABELS = {"app.kubernetes.io/component": "admission-controller", "app.kubernetes.io/part-of": "kyverno"}
# Upstream pkg/config/config.go (kyverno v1.19.0): MutatingWebhookConfigurationName,
# PolicyMutatingWebhookConfigurationName.
WEBHOOK_CONFIGURATIONS = ("kyverno-resource-mutating-webhook-cfg", "kyverno-policy-mutating-webhook-cfg")
SKIPPED = ("events", "clusterpolicies", "policies", "customresourcedefinitions", "namespaces", "nodes", "leases")
_ANCHOR = re.compile(r"^([+=]?)\((.+)\)$")


class _Skip(Exception):
    """A conditional anchor did not hold."""


def _crd(kind: str, plural: str, short: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {"group": GROUP, "scope": scope,
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "shortNames": [short],
                           "listKind": f"{kind}List", "categories": ["kyverno"]},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {
                         "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                         "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
                     "additionalPrinterColumns": [
                         {"name": "Ready", "type": "string", "jsonPath": ".status.ready"}]}]},
    }


def wildcard(pattern: Any, value: Any) -> bool:
    """Kyverno wildcards: ``*`` any run of characters, ``?`` one; other values compare as strings."""
    if value is None:
        return False
    pattern_s, value_s = str(pattern), str(value)
    if isinstance(pattern, bool) or isinstance(value, bool):
        pattern_s, value_s = pattern_s.lower(), value_s.lower()
    escaped = pattern_s.replace("[", "[[]")
    return fnmatch.fnmatchcase(value_s, escaped)


def _anchor(key: str) -> tuple[str, str]:
    """('', key) for a plain key, else ('(', inner) conditional, ('+', inner) add-if-absent, ('=', inner)."""
    m = _ANCHOR.match(key)
    if not m:
        return "", key
    return (m.group(1) or "("), m.group(2)


def _strip(value: Any) -> Any:
    """The patch without anchors, for adding where nothing existed."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            kind, key = _anchor(k)
            if kind == "(":
                continue
            out[key] = _strip(v)
        return out
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _conditions_hold(resource: dict[str, Any], patch: dict[str, Any]) -> bool:
    for k, v in patch.items():
        kind, key = _anchor(k)
        if kind == "(" and not _matches(resource.get(key), v):
            return False
        if kind == "=" and key in resource and not _matches(resource.get(key), v):
            return False
    return True


def _matches(value: Any, pattern: Any) -> bool:
    if isinstance(pattern, dict):
        return isinstance(value, dict) and all(_matches(value.get(_anchor(k)[1]), v) for k, v in pattern.items())
    return wildcard(pattern, value)


def merge(resource: Any, patch: Any, field: str = "") -> Any:
    """Apply a Kyverno patchStrategicMerge overlay; raises :class:`_Skip` when a map's condition fails."""
    if isinstance(patch, dict):
        base = dict(resource) if isinstance(resource, dict) else {}
        if not _conditions_hold(base, patch):
            raise _Skip
        for k, v in patch.items():
            kind, key = _anchor(k)
            if kind == "(":
                continue
            if kind == "+":
                if key not in base:
                    base[key] = _strip(v)
                continue
            if kind == "=" and key not in base:
                continue
            base[key] = merge(base.get(key), v, key)
        return base
    if isinstance(patch, list):
        return _merge_list(resource if isinstance(resource, list) else [], patch, field)
    return patch


def _has_conditions(item: Any) -> bool:
    return isinstance(item, dict) and any(_anchor(k)[0] == "(" for k in item)


def _merge_list(current: list[Any], patch: list[Any], field: str) -> list[Any]:
    out = copy.deepcopy(current)
    for item in patch:
        if _has_conditions(item):
            for i, element in enumerate(out):  # anchored items patch the elements they select, never add
                try:
                    out[i] = merge(element, item, field)
                except _Skip:
                    continue
            continue
        key = MERGE_KEYS.get(field, "name")
        if isinstance(item, dict) and key in item:
            pos = next((i for i, e in enumerate(out) if isinstance(e, dict) and e.get(key) == item[key]), None)
            if pos is None:
                out.append(_strip(item))
            else:
                try:
                    out[pos] = merge(out[pos], item, field)
                except _Skip:
                    pass
        elif item not in out:
            out.append(_strip(item))
    return out


def _selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    if any(labels.get(k) != str(v) for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or []]
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _kind_matches(patterns: list[str], kind: str) -> bool:
    return any(wildcard(p.rsplit("/", 1)[-1], kind) for p in patterns)


def _resources_match(resources: dict[str, Any], obj: dict[str, Any], kind: str) -> bool:
    meta = obj.get("metadata") or {}
    if resources.get("kinds") and not _kind_matches(resources["kinds"], kind):
        return False
    if resources.get("names") and not any(wildcard(n, meta.get("name")) for n in resources["names"]):
        return False
    if resources.get("name") and not wildcard(resources["name"], meta.get("name")):
        return False
    if resources.get("namespaces") and not any(wildcard(n, meta.get("namespace")) for n in resources["namespaces"]):
        return False
    return _selector_matches(resources.get("selector"), meta.get("labels") or {})


def _block_matches(block: dict[str, Any] | None, obj: dict[str, Any], kind: str) -> bool | None:
    """True/False when the match/exclude block says so, None when it is empty."""
    if not block:
        return None
    if block.get("any"):
        return any(_resources_match(f.get("resources") or {}, obj, kind) for f in block["any"])
    if block.get("all"):
        return all(_resources_match(f.get("resources") or {}, obj, kind) for f in block["all"])
    if block.get("resources"):
        return _resources_match(block["resources"], obj, kind)
    return None


def _kinds_of(block: dict[str, Any] | None) -> list[str]:
    if not block:
        return []
    filters = (block.get("any") or []) + (block.get("all") or []) + ([{"resources": block["resources"]}]
                                                                      if block.get("resources") else [])
    return [k for f in filters for k in (f.get("resources") or {}).get("kinds") or []]


def validate_policy(policy: dict[str, Any]) -> None:
    problems = []
    for i, rule in enumerate((policy.get("spec") or {}).get("rules") or []):
        if not rule.get("name"):
            problems.append(f"spec.rules[{i}].name: Required value")
        if not rule.get("match"):
            problems.append(f"spec.rules[{i}].match: Required value")
        psm = (rule.get("mutate") or {}).get("patchStrategicMerge")
        if psm is not None and not isinstance(psm, dict):
            problems.append(f"spec.rules[{i}].mutate.patchStrategicMerge: must be an object")
    if problems:
        raise ApiError(400, "BadRequest", 'admission webhook "validate-policy.kyverno.svc" denied the request: '
                                          + "; ".join(problems))


class KyvernoSimulation:
    """The admission controller; see the module docstring."""

    def __init__(self, twin: ClusterTwin) -> None:
        self.twin = twin
        self.store = twin.store
        self.applied: collections.Counter[tuple[str, str]] = collections.Counter()
        self.install = str(twin.services.get("kyverno_install", "crds"))
        if self.install not in INSTALL_MODES:
            raise ValueError(f"kyverno_install {self.install!r} is not one of {', '.join(INSTALL_MODES)}")
        self._lock = threading.Lock()
        self._webhooks_registered = False
        self._active = self.install != "chart"
        if self.install != "chart":  # the CRDs are there from the start; "chart" gets them from the chart
            for kind, plural, short, scope in (("ClusterPolicy", "clusterpolicies", "cpol", "Cluster"),
                                               ("Policy", "policies", "pol", "Namespaced")):
                if self.store.get("apiextensions.k8s.io", "customresourcedefinitions", f"{plural}.{GROUP}") is None:
                    create_quietly(self.store, "apiextensions.k8s.io", "customresourcedefinitions",
                                   _crd(kind, plural, short, scope))
        self.store.add_admission(self._admit)
        self.store.subscribe(self._on_event)
        if self.install == "preinstalled":
            self._preinstall()
        twin.services["kyverno"] = self

    @property
    def serving(self) -> bool:
        """Whether the admission webhook is serving (False until the chart's admission controller is available,
        in "chart" mode)."""
        return self._active

    def _preinstall(self) -> None:
        """What a platform team's ``helm install kyverno`` left on the cluster, written as the admin: the namespace
        and the admission controller Deployment under the chart's name and labels (the workloads controller runs
        its pod; the webhook configurations follow once it is available, as in "chart" mode)."""
        create_quietly(self.store, "", "namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": KYVERNO_NAMESPACE}})
        labels = dict(ADMISSION_LABELS, **{"app.kubernetes.io/instance": "kyverno"})
        create_quietly(self.store, "apps", "deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": ADMISSION_DEPLOYMENT, "namespace": KYVERNO_NAMESPACE, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "kyverno", "image": "reg.kyverno.io/kyverno/kyverno:v1.19.0"}]}}}})

    def _on_event(self, kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
        """The admission controller became available: register the webhook configurations (upstream's webhook
        controller creates them at run time, the chart does not ship them) and start admitting through them."""
        if (group, resource) != ("apps", "deployments") or kind == "DELETED":
            return
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in ADMISSION_LABELS.items()):
            return
        if int((obj.get("status") or {}).get("availableReplicas") or 0) < 1:
            return
        with self._lock:
            if self._webhooks_registered:
                return
            self._webhooks_registered = True
        namespace = (obj.get("metadata") or {}).get("namespace") or KYVERNO_NAMESPACE
        for name in WEBHOOK_CONFIGURATIONS:
            create_quietly(self.store, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", {
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": name, "labels": {"webhook.kyverno.io/managed-by": "kyverno"}},
                "webhooks": [{"name": f"{name.removesuffix('-cfg')}.kyverno.svc", "admissionReviewVersions": ["v1"],
                              "sideEffects": "NoneOnDryRun", "failurePolicy": "Fail",
                              "clientConfig": {"service": {"name": "kyverno-svc", "namespace": namespace,
                                                           "path": "/mutate"}}}]})
        self._active = True

    def stop(self) -> None:
        self._active = False  # the store keeps its hooks; a stopped simulation lets everything through
        if self.twin.services.get("kyverno") is self:
            self.twin.services.pop("kyverno", None)

    def _policies(self, namespace: str | None) -> list[dict[str, Any]]:
        found = []
        for plural in ("clusterpolicies", "policies"):
            try:
                items = self.store.list(GROUP, plural)
            except ApiError:
                continue
            found += [p for p in items if plural == "clusterpolicies" or p["metadata"].get("namespace") == namespace]
        return found

    def _admit(self, op: str, group: str, resource: str, new: dict[str, Any],
               old: dict[str, Any] | None) -> dict[str, Any]:
        if not self._active or op not in ("CREATE", "UPDATE"):
            return new
        if group == GROUP and resource in ("clusterpolicies", "policies"):
            validate_policy(new)
            new["status"] = {"ready": True, "conditions": [{"type": "Ready", "status": "True",
                                                            "reason": "Succeeded", "message": "Ready"}]}
            return new
        if resource in SKIPPED or not (new.get("metadata") or {}).get("namespace"):
            return new
        kind = new.get("kind") or ""
        for policy in self._policies(new["metadata"]["namespace"]):
            new = self._apply_policy(policy, new, kind)
        return new

    def _apply_policy(self, policy: dict[str, Any], obj: dict[str, Any], kind: str) -> dict[str, Any]:
        autogen = (policy["metadata"].get("annotations") or {}).get(AUTOGEN_ANNOTATION, "") != "none"
        for rule in (policy.get("spec") or {}).get("rules") or []:
            patch = (rule.get("mutate") or {}).get("patchStrategicMerge")
            if not isinstance(patch, dict):
                continue
            match, exclude = rule.get("match"), rule.get("exclude")
            if _block_matches(match, obj, kind):
                overlay = patch
            elif autogen and kind in AUTOGEN_KINDS and _kind_matches(_kinds_of(match), "Pod") and \
                    _block_matches(match, obj, "Pod"):
                overlay = {"spec": {"template": patch}}
            else:
                continue
            if _block_matches(exclude, obj, kind):
                continue
            try:
                obj = merge(obj, substitute(overlay, obj))
            except _Skip:
                continue
            self.applied[(policy["metadata"]["name"], rule.get("name", ""))] += 1
        return obj


_VARIABLE = re.compile(r"\{\{\s*request\.object\.([A-Za-z0-9_.]+)\s*\}\}")


def substitute(value: Any, obj: dict[str, Any]) -> Any:
    """Kyverno variables of the form ``{{request.object.<path>}}`` (e.g. ``metadata.name``), resolved against
    the admitted object before the patch is merged. Unknown paths resolve to an empty string."""
    if isinstance(value, dict):
        return {substitute(k, obj): substitute(v, obj) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, obj) for v in value]
    if isinstance(value, str) and "{{" in value:
        def lookup(m: re.Match[str]) -> str:
            node: Any = obj
            for part in m.group(1).split("."):
                node = node.get(part) if isinstance(node, dict) else None
            return "" if node is None else str(node)

        return _VARIABLE.sub(lookup, value)
    return value


def attach(twin: ClusterTwin) -> KyvernoSimulation:
    return KyvernoSimulation(twin)


__all__ = ["KyvernoSimulation", "attach", "merge", "validate_policy", "wildcard"]
