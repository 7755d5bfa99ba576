"""The Kubernetes emulator authenticates like EKS and authorizes like Kubernetes RBAC, including the escalation rule
(facts: tests/conformance/facts/kube_rbac.yaml).

Each test starts one emulator on 127.0.0.1 (TLS on, so kubectl sends its token) with three identities: an admin
(system:masters, static token), ``dev`` (EKS token for access key AKDEV, group ``dev``) and nothing else, and
speaks HTTP to it with explicit headers.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet_sandbox.kube import KubeApiServer, KubeStore
from kvfleet_sandbox.kube.auth import TOKEN_PREFIX, Authenticator, UserInfo, presigned_token
from kvfleet_sandbox.kube.tls import make_tls

FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "kube_rbac.yaml").read_text())
ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
ADMIN_TOKEN = "admin.conformance"
RBAC = "rbac.authorization.k8s.io"
APPLY = "application/apply-patch+yaml"


@pytest.fixture(scope="module")
def tls() -> Any:
    return make_tls()


@pytest.fixture
def kube(tls: Any) -> Iterator[tuple[KubeStore, KubeApiServer]]:
    store = KubeStore("conformance")
    auth = Authenticator(identities={"AKDEV": UserInfo("dev-user", ("dev",))},
                         static_tokens={ADMIN_TOKEN: UserInfo("admin", ("system:masters",))})
    server = KubeApiServer(store, tls=tls, authenticator=auth)
    server.start()
    try:
        yield store, server
    finally:
        server.stop()


def call(server: KubeApiServer, method: str, path: str, token: str | None, body: Any = None,
         ctype: str = "application/json") -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": ctype}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(server.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def dev() -> str:
    return presigned_token("AKDEV", "us-east-1")


def grant(store: KubeStore, name: str, rules: list[dict[str, Any]], namespace: str | None = None) -> None:
    """Bind ``rules`` to group dev: a ClusterRole + ClusterRoleBinding, or + RoleBinding in ``namespace``."""
    store.create(RBAC, "clusterroles", {"metadata": {"name": name}, "rules": rules})
    binding = {"metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
               "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": name},
               "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": "dev"}]}
    store.create(RBAC, "rolebindings" if namespace else "clusterrolebindings", binding)


def token_with(**changes: str | None) -> str:
    """A dev token whose presigned URL has query parameters changed (None drops one), or its origin."""
    url = urllib.parse.urlsplit(base64.urlsafe_b64decode(dev()[len(TOKEN_PREFIX):] + "==").decode())
    origin = changes.pop("origin", None) or f"{url.scheme}://{url.netloc}"
    params = dict(urllib.parse.parse_qsl(url.query))
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = value
    raw = f"{origin}/?{urllib.parse.urlencode(params)}"
    return TOKEN_PREFIX + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


# --- authentication -----------------------------------------------------------------------------------------


def test_anonymous_and_invalid_tokens_get_401(kube: tuple[KubeStore, KubeApiServer]) -> None:
    _, server = kube
    facts = FACTS["authentication"]["anonymous"]
    assert call(server, "GET", "/api/v1/namespaces", None)[0] == facts["no_token"] == 401
    assert call(server, "GET", "/version", None)[0] == 401
    assert call(server, "GET", "/api/v1/namespaces", "not-a-token")[0] == facts["invalid_token"] == 401
    assert call(server, "GET", "/api/v1/namespaces", ADMIN_TOKEN)[0] == 200


@pytest.mark.parametrize("case", ["host", "scheme", "action", "unsigned-cluster-id", "expires", "expired",
                                  "extra-param", "no-credential", "unknown-key", "path"])
def test_eks_token_must_be_a_presigned_sts_get_caller_identity(kube: tuple[KubeStore, KubeApiServer],
                                                                case: str) -> None:
    _, server = kube
    rules = FACTS["authentication"]["eks_token"]
    assert rules["action"] == "GetCallerIdentity" and rules["signed_header_required"] == "x-k8s-aws-id"
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=rules["lifetime_minutes"] + 1)).strftime("%Y%m%dT%H%M%SZ")
    bad = {
        "host": token_with(origin="https://sts.amazonaws.com.evil.example"),
        "scheme": token_with(origin="http://sts.us-east-1.amazonaws.com"),
        "action": token_with(Action="AssumeRole"),
        "unsigned-cluster-id": token_with(**{"X-Amz-SignedHeaders": "host"}),
        "expires": token_with(**{"X-Amz-Expires": str(rules["x_amz_expires_range"][1] + 1)}),
        "expired": token_with(**{"X-Amz-Date": old}),
        "extra-param": token_with(Foo="bar"),
        "no-credential": token_with(**{"X-Amz-Credential": None}),
        "unknown-key": presigned_token("AKNOBODY", "us-east-1"),
        "path": TOKEN_PREFIX + base64.urlsafe_b64encode(
            base64.urlsafe_b64decode(dev()[len(TOKEN_PREFIX):] + "==").replace(b".com/?", b".com/x?")
        ).decode().rstrip("="),
    }[case]
    assert call(server, "GET", "/api/v1/namespaces/default/pods", bad)[0] == 401
    assert call(server, "GET", "/api/v1/namespaces/default/pods", dev())[0] == 403  # the good one: who, not what


def test_regional_sts_hosts_are_accepted(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    grant(store, "read-ns", [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]}])
    for origin in ("https://sts.amazonaws.com", "https://sts.eu-west-1.amazonaws.com",
                   "https://sts.cn-north-1.amazonaws.com.cn"):
        assert call(server, "GET", "/api/v1/namespaces", token_with(origin=origin))[0] == 200, origin


def test_kubectl_sends_its_token_only_over_tls(kube: tuple[KubeStore, KubeApiServer], tls: Any,
                                               tmp_path: Path) -> None:
    if not KUBECTL.exists():
        pytest.skip("kubectl missing: run tools/fetch-k8s-binaries.sh")
    _, server = kube
    ca = base64.b64encode(tls.ca_pem.encode()).decode()
    outcomes = {}
    for name, cluster in (("https", {"server": server.https_url, "certificate-authority-data": ca}),
                          ("http", {"server": server.url})):
        config = tmp_path / name
        config.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": {"token": ADMIN_TOKEN}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(config), "get", "namespaces", "-o", "name"],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)})
        outcomes[name] = (proc.returncode, "Unauthorized" in proc.stderr)
    assert outcomes == {"https": (0, False), "http": (1, True)}


# --- authorization ------------------------------------------------------------------------------------------


def test_role_binding_grants_only_in_its_namespace(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    store.create("", "namespaces", {"metadata": {"name": "team"}})
    grant(store, "pods-reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}], namespace="team")
    assert call(server, "GET", "/api/v1/namespaces/team/pods", dev())[0] == 200
    status, body = call(server, "GET", "/api/v1/namespaces/default/pods", dev())
    assert status == 403 and body["reason"] == "Forbidden"
    assert 'User "dev-user" cannot list resource "pods" in API group "" in the namespace "default"' in body["message"]
    assert call(server, "GET", "/api/v1/pods", dev())[0] == 403  # cluster scope is not the namespace's


def test_resource_names_subresources_and_field_selector_names(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    grant(store, "one-cm", [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["mine"],
         "verbs": ["get", "create", "watch"]},
        {"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["get"]}])
    store.create("", "configmaps", {"metadata": {"name": "mine", "namespace": "default"}})
    store.create("", "configmaps", {"metadata": {"name": "other", "namespace": "default"}})
    assert call(server, "GET", "/api/v1/namespaces/default/configmaps/mine", dev())[0] == 200
    assert call(server, "GET", "/api/v1/namespaces/default/configmaps/other", dev())[0] == 403
    # resourceNames never match a create: the name is in the body, not on the URL
    assert call(server, "POST", "/api/v1/namespaces/default/configmaps", dev(),
                {"metadata": {"name": "mine2"}})[0] == 403
    # a watch narrowed to one name by fieldSelector carries that name
    path = "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1&fieldSelector="
    assert call(server, "GET", path + "metadata.name%3Dmine", dev())[0] == 200
    assert call(server, "GET", path + "metadata.name%3Dother", dev())[0] == 403
    # '*/scale' matches any resource's scale subresource, not the resource
    store.create("apps", "deployments", {"metadata": {"name": "web", "namespace": "default"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"a": "b"}},
        "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    assert call(server, "GET", "/apis/apps/v1/namespaces/default/deployments/web/scale", dev())[0] == 200
    assert call(server, "GET", "/apis/apps/v1/namespaces/default/deployments/web", dev())[0] == 403


# --- the escalation rule ------------------------------------------------------------------------------------

WRITE_ROLES = {"apiGroups": [RBAC], "resources": ["clusterroles", "clusterrolebindings"],
               "verbs": ["create", "patch", "get"]}
SECRETS = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]


def apply(server: KubeApiServer, resource: str, name: str, obj: dict[str, Any], token: str) -> tuple[int, dict]:
    body = yaml.safe_dump({"apiVersion": f"{RBAC}/v1", "kind": {"clusterroles": "ClusterRole",
                                                                "clusterrolebindings": "ClusterRoleBinding"}[resource],
                           "metadata": {"name": name}, **obj}).encode()
    return call(server, "PATCH", f"/apis/{RBAC}/v1/{resource}/{name}?fieldManager=t", token, body, APPLY)


def test_a_role_granting_rights_you_lack_needs_escalate(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    grant(store, "role-writer", [WRITE_ROLES])
    status, body = apply(server, "clusterroles", "secret-reader", {"rules": SECRETS}, dev())
    assert status == 403 and "attempting to grant RBAC permissions not currently held" in body["message"]
    assert store.get(RBAC, "clusterroles", "secret-reader") is None
    # POST create: the same refusal
    assert call(server, "POST", f"/apis/{RBAC}/v1/clusterroles", dev(),
                {"metadata": {"name": "secret-reader"}, "rules": SECRETS})[0] == 403
    # escalate on that name (the request's name: an apply names it on the URL) lets it through
    grant(store, "escalate-one", [{"apiGroups": [RBAC], "resources": ["clusterroles"],
                                   "resourceNames": ["secret-reader"], "verbs": ["escalate"]}])
    assert apply(server, "clusterroles", "secret-reader", {"rules": SECRETS}, dev())[0] in (200, 201)
    # ... but not for another name, nor for a POST (no name on the URL)
    assert apply(server, "clusterroles", "secret-reader-2", {"rules": SECRETS}, dev())[0] == 403
    assert call(server, "POST", f"/apis/{RBAC}/v1/clusterroles", dev(),
                {"metadata": {"name": "secret-reader"}, "rules": SECRETS})[0] == 403


def test_a_role_within_your_rights_needs_no_escalate(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    grant(store, "role-writer", [WRITE_ROLES, *SECRETS])
    assert apply(server, "clusterroles", "secret-reader", {"rules": SECRETS}, dev())[0] in (200, 201)
    wider = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "delete"]}]
    assert apply(server, "clusterroles", "secret-reader", {"rules": wider}, dev())[0] == 403  # an update too
    # the admin (system:masters) is never checked
    assert apply(server, "clusterroles", "secret-admin", {"rules": wider}, ADMIN_TOKEN)[0] in (200, 201)


def test_binding_a_role_needs_bind_or_its_rights(kube: tuple[KubeStore, KubeApiServer]) -> None:
    store, server = kube
    grant(store, "role-writer", [WRITE_ROLES])
    store.create(RBAC, "clusterroles", {"metadata": {"name": "secret-reader"}, "rules": SECRETS})
    crb = {"roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "secret-reader"},
           "subjects": [{"kind": "ServiceAccount", "name": "csi", "namespace": "default"}]}
    status, body = apply(server, "clusterrolebindings", "secret-reader", crb, dev())
    assert status == 403 and "not currently held" in body["message"]
    grant(store, "bind-one", [{"apiGroups": [RBAC], "resources": ["clusterroles"],
                               "resourceNames": ["secret-reader"], "verbs": ["bind"]}])
    assert apply(server, "clusterrolebindings", "secret-reader", crb, dev())[0] in (200, 201)
    # bind is checked against the referenced role's name, not the binding's
    other = {**crb, "roleRef": {**crb["roleRef"], "name": "secret-admin"}}
    store.create(RBAC, "clusterroles", {"metadata": {"name": "secret-admin"}, "rules": SECRETS})
    assert apply(server, "clusterrolebindings", "secret-reader-2", other, dev())[0] == 403
    checks = [(a.verb, a.name, ok) for a, ok in server.authorizer.log if a.verb in ("bind", "escalate")]
    assert ("bind", "secret-reader", True) in checks and ("bind", "secret-admin", False) in checks
