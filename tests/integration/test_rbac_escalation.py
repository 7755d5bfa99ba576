"""Attack test: with kvfleet's own Kubernetes identity, every known path to more rights is refused.

kvfleet's runtime credentials are one IAM role whose EKS token maps to the group ``kvfleet``
(k8s/rbac/eks-access-entry.json); the kvfleet-bootstrap bundle (k8s/rbac/*.yaml, applied by the sandbox at start
as a cluster admin would) is all that group is granted. k8s/rbac/README.md says why that bundle gives kvfleet no
right on any RBAC object: before it, kvfleet's token could rewrite the ClusterRole ``curvine-csi-node`` to ``*``
and add itself to its binding, cluster-admin in two patches. This test tries those two patches and every other
escalation path we know of on both clusters of tests/fleets/twin.yaml (ml-prod-use1 in patch mode, ml-stage-usw2 in
kyverno mode): writing roles and bindings, a Kyverno ClusterPolicy (Kyverno's own service account applies its
mutations), relabelling Pod Security Admission, impersonation, a pod or a Secret in kube-system, Secrets outside
the Curvine namespace (helm's release storage, the only Secrets kvfleet may read) and a new namespace.

Each attempt must be answered 403 and change nothing: the admin lists the RBAC objects, namespaces, secrets,
pods and ClusterPolicies before and after each attempt, and undoes any change so that each attempt is measured
alone (with the grants of 50143e6, the binding patch would otherwise let every later attempt through). A
ClusterPolicy create may be a 404 where Kyverno's CRD is absent (refused, not applicable); the twin installs the
CRDs on every cluster, so it is a 403 here. All attempts run, then one assertion per cluster lists every attempt
that was not refused.

Measurement aid, not for CI: ``TEST_RBAC_DIR=<dir>`` makes the sandbox bootstrap another RBAC directory (it
monkeypatches ``kvfleet_sandbox.runtime.RBAC_DIR``), e.g. the grants of an older commit extracted with
``git show <commit>:k8s/rbac/<file>``, to count how many attempts they let through.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvfleet_sandbox import runtime
from kvfleet_sandbox.fleet_reader import read_fleet
from kvfleet_sandbox.kube.auth import presigned_token
from kvfleet_sandbox.runtime import KVFLEET_ACCESS_KEY, Sandbox, start_sandbox

pytestmark = pytest.mark.integration

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "twin.yaml"
PATCH_CLUSTER, KYVERNO_CLUSTER = "ml-prod-use1", "ml-stage-usw2"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
POLICIES = "/apis/kyverno.io/v1/clusterpolicies"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
STAR = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
KVFLEET_GROUP = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "kvfleet"}
CLUSTER_ADMIN = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}
JSON, JSON_PATCH, STRATEGIC = ("application/json", "application/json-patch+json",
                               "application/strategic-merge-patch+json")
# What the admin compares before and after each attempt (cluster-wide lists).
WATCHED = (f"{RBAC}/clusterroles", f"{RBAC}/clusterrolebindings", f"{RBAC}/roles", f"{RBAC}/rolebindings",
           "/api/v1/namespaces", "/api/v1/secrets", "/api/v1/pods", POLICIES)


@dataclass(frozen=True)
class Attempt:
    id: str
    method: str
    path: str  # {ep}: the cluster's first endpoint namespace, {cv}: its Curvine namespace
    body: Any = None
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def _psa(namespace: str, label: str) -> Attempt:
    return Attempt(f"namespace/{label}:psa-privileged", "PATCH", f"/api/v1/namespaces/{namespace}",
                   {"metadata": {"labels": {PSA_ENFORCE: "privileged"}}}, STRATEGIC)


def _bind_cluster_admin(namespace: str, label: str) -> Attempt:
    return Attempt(f"rolebinding/{label}:cluster-admin-to-kvfleet", "POST",
                   f"{RBAC}/namespaces/{namespace}/rolebindings",
                   {"metadata": {"name": "attacker"}, "roleRef": CLUSTER_ADMIN, "subjects": [KVFLEET_GROUP]})


SECRETS = "/api/v1/namespaces/{}/secrets"
ATTEMPTS = (
    Attempt("clusterrole/curvine-csi-node:strategic-merge-star", "PATCH", f"{RBAC}/clusterroles/curvine-csi-node",
            {"rules": [STAR]}, STRATEGIC),
    Attempt("clusterrole/curvine-csi-node:json-patch-star", "PATCH", f"{RBAC}/clusterroles/curvine-csi-node",
            [{"op": "add", "path": "/rules/-", "value": STAR}], JSON_PATCH),
    Attempt("clusterrole/kvfleet:cluster:json-patch-star", "PATCH", f"{RBAC}/clusterroles/kvfleet:cluster",
            [{"op": "add", "path": "/rules/-", "value": STAR}], JSON_PATCH),
    Attempt("clusterrole:create-star", "POST", f"{RBAC}/clusterroles",
            {"metadata": {"name": "attacker-star"}, "rules": [STAR]}),
    Attempt("clusterrolebinding/curvine-csi-node:add-group-kvfleet", "PATCH",
            f"{RBAC}/clusterrolebindings/curvine-csi-node",
            [{"op": "add", "path": "/subjects/-", "value": KVFLEET_GROUP}], JSON_PATCH),
    Attempt("clusterrolebinding:create-cluster-admin-to-kvfleet", "POST", f"{RBAC}/clusterrolebindings",
            {"metadata": {"name": "attacker"}, "roleRef": CLUSTER_ADMIN, "subjects": [KVFLEET_GROUP]}),
    _bind_cluster_admin("{cv}", "curvine-namespace"),
    _bind_cluster_admin("{ep}", "endpoint-namespace"),
    Attempt("clusterpolicy:create-attacker-mutate", "POST", POLICIES, {
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "attacker-mutate"},
        "spec": {"rules": [{"name": "privileged", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                            "mutate": {"patchStrategicMerge": {"spec": {"containers": [
                                {"(name)": "?*", "securityContext": {"privileged": True}}]}}}}]}}),
    _psa("{ep}", "endpoint-namespace"),
    _psa("kube-system", "kube-system"),
    Attempt("impersonate:user-kubernetes-admin", "GET", SECRETS.format("kube-system"),
            headers=(("Impersonate-User", "kubernetes-admin"),)),
    Attempt("impersonate:group-system-masters", "GET", SECRETS.format("kube-system"),
            headers=(("Impersonate-User", "x"), ("Impersonate-Group", "system:masters"))),
    Attempt("pod/kube-system:create", "POST", "/api/v1/namespaces/kube-system/pods",
            {"metadata": {"name": "attacker"}, "spec": {"hostPID": True, "containers": [
                {"name": "sh", "image": "busybox", "securityContext": {"privileged": True}}]}}),
    Attempt("secret/kube-system:get", "GET", SECRETS.format("kube-system") + "/planted"),
    Attempt("secret/kube-system:list", "GET", SECRETS.format("kube-system")),
    Attempt("secret/endpoint-namespace:get", "GET", SECRETS.format("{ep}") + "/planted"),
    Attempt("secret/endpoint-namespace:list", "GET", SECRETS.format("{ep}")),
    Attempt("secret/kube-system:create", "POST", SECRETS.format("kube-system"),
            {"metadata": {"name": "attacker"}, "type": "Opaque", "data": {}}),
    Attempt("namespace:create-privileged", "POST", "/api/v1/namespaces",
            {"metadata": {"name": "attacker", "labels": {PSA_ENFORCE: "privileged"}}}),
)


@dataclass
class Cluster:
    sandbox: Sandbox
    name: str
    kvfleet_token: str
    endpoint_ns: str
    curvine_ns: str

    def call(self, token: str, method: str, path: str, body: Any = None, content_type: str = JSON,
             headers: tuple[tuple[str, str], ...] = ()) -> tuple[int, Any]:
        """One HTTPS request to the cluster's API server: (status, decoded JSON body or text)."""
        assert self.sandbox.tls is not None
        context = ssl.create_default_context(cadata=self.sandbox.tls.ca_pem)
        conn = http.client.HTTPSConnection("127.0.0.1", self.sandbox.servers[self.name].port, context=context,
                                           timeout=10)
        try:
            data = b"" if body is None else json.dumps(body).encode()
            conn.putrequest(method, path)
            for key, value in [("Authorization", f"Bearer {token}"), ("Content-Type", content_type),
                               ("Accept", JSON), ("Content-Length", str(len(data))), *headers]:
                conn.putheader(key, value)
            conn.endheaders(data)
            resp = conn.getresponse()
            text = resp.read().decode()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text
        finally:
            conn.close()

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.call(self.sandbox.admin_token, method, path, body)

    def snapshot(self) -> dict[str, dict[str, str] | None]:
        """As the admin: every watched object, by path and namespace/name (None: the resource is not served)."""
        state: dict[str, dict[str, str] | None] = {}
        for path in WATCHED:
            code, body = self.admin("GET", path)
            assert code in (200, 404), (path, code, body)
            state[path] = None if code == 404 else {
                f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}": json.dumps(i, sort_keys=True)
                for i in body["items"]}
        return state


    def restore(self, before: dict[str, dict[str, str] | None]) -> None:
        """As the admin: undo what an attempt that was not refused changed, so each attempt is measured alone."""
        after = self.snapshot()
        for path, old in before.items():
            old, new = old or {}, after[path] or {}
            for key in sorted(old.keys() | new.keys()):
                if old.get(key) == new.get(key):
                    continue
                ns, name = key.split("/", 1)
                prefix, plural = path.rsplit("/", 1)
                url = f"{prefix}/namespaces/{ns}/{plural}" if ns else path
                if key not in old:
                    code, body = self.admin("DELETE", f"{url}/{name}")
                else:
                    obj = json.loads(old[key])
                    obj["metadata"].pop("resourceVersion", None)
                    code, body = self.admin("PUT", f"{url}/{name}", obj) if key in new else self.admin("POST", url, obj)
                assert code in (200, 201, 202), (key, code, body)


def changes(before: dict[str, dict[str, str] | None], after: dict[str, dict[str, str] | None]) -> list[str]:
    out = []
    for path, old in before.items():
        old, new = old or {}, after[path] or {}
        out += [f"{path}: {key}" for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]
    return out


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """The suite's fleet, bare but for workloads and Kyverno (its CRDs on both clusters, preinstalled on the
    kyverno-mode one)."""
    with pytest.MonkeyPatch.context() as mp:
        if os.environ.get("TEST_RBAC_DIR"):  # measurement aid (module docstring)
            mp.setattr(runtime, "RBAC_DIR", Path(os.environ["TEST_RBAC_DIR"]))
        started = start_sandbox(FLEET, tmp_path_factory.mktemp("rbac-escalation"), controllers=("workloads", "kyverno"))
        try:
            assert started.rbac_enforced
            yield started
        finally:
            started.stop()


def prepared(sandbox: Sandbox, name: str) -> Cluster:
    """The cluster as an attacker finds it on EKS: cluster-admin exists, and so do Secrets worth reading."""
    twin = sandbox.twin(name)
    inventory = read_fleet(FLEET)  # the sandbox's reader: no inventory warnings
    endpoint_ns = next(e.namespace for e in inventory.endpoints if e.cluster == name)
    curvine_ns = next(c.curvine.namespace for c in inventory.clusters if c.name == name)
    cluster = Cluster(sandbox, name, presigned_token(KVFLEET_ACCESS_KEY, twin.region), endpoint_ns, curvine_ns)
    if cluster.admin("GET", f"{RBAC}/clusterroles/cluster-admin")[0] == 404:
        assert cluster.admin("POST", f"{RBAC}/clusterroles", {"metadata": {"name": "cluster-admin"}, "rules": [
            STAR, {"nonResourceURLs": ["*"], "verbs": ["*"]}]})[0] == 201
    for ns in ("kube-system", endpoint_ns):
        code, body = cluster.admin("POST", SECRETS.format(ns), {"metadata": {"name": "planted"}, "type": "Opaque",
                                                               "data": {"token": "c2VjcmV0"}})
        assert code in (201, 409), body
    # the targets exist, and kvfleet's token works (allowed a read of k8s/rbac/cluster.yaml)
    for path in (f"{RBAC}/clusterroles/curvine-csi-node", f"{RBAC}/clusterrolebindings/curvine-csi-node",
                 f"{RBAC}/clusterroles/kvfleet:cluster", f"/api/v1/namespaces/{endpoint_ns}",
                 f"/api/v1/namespaces/{curvine_ns}", "/api/v1/namespaces/kube-system"):
        assert cluster.admin("GET", path)[0] == 200, path
    assert cluster.call(cluster.kvfleet_token, "GET", "/api/v1/nodes")[0] == 200
    return cluster


@pytest.mark.parametrize("cluster_name", [PATCH_CLUSTER, KYVERNO_CLUSTER])
def test_kvfleet_identity_cannot_escalate(sandbox: Sandbox, cluster_name: str) -> None:
    cluster = prepared(sandbox, cluster_name)
    policy_crd = cluster.admin(
        "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/clusterpolicies.kyverno.io")[0] == 200
    results: list[tuple[str, str, int]] = []
    not_refused: list[str] = []
    for attempt in ATTEMPTS:
        path = attempt.path.format(ep=cluster.endpoint_ns, cv=cluster.curvine_ns)
        before = cluster.snapshot()
        code, body = cluster.call(cluster.kvfleet_token, attempt.method, path, attempt.body, attempt.content_type,
                                  attempt.headers)
        changed = changes(before, cluster.snapshot())
        if changed:
            cluster.restore(before)
        results.append((cluster_name, attempt.id, code))
        refused = code == 403 or (code == 404 and attempt.path == POLICIES and not policy_crd)
        if not refused or changed:
            reason = body.get("message") if isinstance(body, dict) else str(body)[:120]
            not_refused.append(f"{attempt.id}: {attempt.method} {path} -> {code}"
                               + (f" {reason!r}" if reason else "") + f"; changed (undone): {changed}")
    print("\n".join(f"{c} {a}: {code}" for c, a, code in results))  # shown with -s or on failure
    assert len(results) == len(ATTEMPTS)
    assert not not_refused, (f"{len(not_refused)} of {len(ATTEMPTS)} escalation attempts by kvfleet were not "
                             f"refused on {cluster_name}:\n" + "\n".join(not_refused))
