"""The cluster twin's API server handles user impersonation like kube-apiserver 1.33 (facts:
tests/conformance/facts/kube_impersonation.yaml), so an attack test can rely on it: kvfleet's own identity (group
``kvfleet``, bound only by k8s/rbac/*.yaml, which grant no ``impersonate``) cannot act as anybody else.

Each test starts a bare sandbox twin of the suite's fleet (RBAC bootstrapped from k8s/rbac, no controllers) and
speaks HTTPS to its first cluster with the CA the sandbox publishes (the EKS endpoint's certificateAuthority): the
official ``kubernetes`` client, as kvfleet would, and ``http.client`` where a header must repeat or the answer is
not JSON. Identities: kvfleet (its EKS token, access key ``sandbox``), the sandbox admin (system:masters, its
static token), and ``impersonator``, a user this test adds to the authenticator and grants ``impersonate`` on
``users`` named bob only.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kvfleet_sandbox.kube import KubeApiServer, KubeStore
from kvfleet_sandbox.kube.auth import UserInfo, presigned_token
from kvfleet_sandbox.runtime import KVFLEET_ACCESS_KEY

pytestmark = pytest.mark.integration

FACTS = yaml.safe_load((Path(__file__).resolve().parents[2] / "conformance" / "facts" /
                        "kube_impersonation.yaml").read_text())
RBAC = "rbac.authorization.k8s.io"
IMPERSONATOR_TOKEN = "impersonator.tests"
SA_USER = "system:serviceaccount:kube-system:clusterrole-aggregation-controller"


@dataclass
class Twin:
    store: KubeStore
    server: KubeApiServer
    ca_file: Path
    ca_pem: str
    kvfleet_token: str
    kvfleet_user: str
    admin_token: str


@pytest.fixture
def twin(sandbox_factory: Any, tmp_path: Path) -> Twin:
    sandbox = sandbox_factory(controllers=())
    name = next(iter(sandbox.twins))
    server = sandbox.servers[name]
    assert sandbox.rbac_enforced and sandbox.tls is not None
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(sandbox.tls.ca_pem)
    server.authenticator.static_tokens[IMPERSONATOR_TOKEN] = UserInfo("impersonator", ("impersonators",))
    return Twin(sandbox.twin(name).store, server, ca_file, sandbox.tls.ca_pem,
                presigned_token(KVFLEET_ACCESS_KEY, sandbox.twin(name).region),
                server.authenticator.identities[KVFLEET_ACCESS_KEY].name, sandbox.admin_token)


@pytest.fixture
def kube(twin: Twin) -> Iterator[Any]:
    """``kube(token, **impersonate_headers) -> kubernetes.client.ApiClient`` over HTTPS, verifying the CA."""
    made: list[Any] = []

    def make(token: str, **headers: str) -> Any:
        config = client.Configuration()
        config.host = twin.server.https_url
        config.ssl_ca_cert = str(twin.ca_file)
        config.api_key = {"authorization": f"Bearer {token}"}
        api = client.ApiClient(config)
        for key, value in headers.items():
            api.set_default_header(key.replace("_", "-"), value)
        made.append(api)
        return api

    try:
        yield make
    finally:
        for api in made:
            api.close()


def raw(twin: Twin, method: str, path: str, token: str, headers: list[tuple[str, str]],
        body: Any = None) -> tuple[int, str, str]:
    """One HTTPS request with headers that may repeat: (status, content type, body text)."""
    context = ssl.create_default_context(cadata=twin.ca_pem)
    conn = http.client.HTTPSConnection("127.0.0.1", twin.server.port, context=context, timeout=10)
    try:
        data = b"" if body is None else json.dumps(body).encode()
        conn.putrequest(method, path)
        for key, value in [("Authorization", f"Bearer {token}"), ("Content-Type", "application/json"),
                           ("Content-Length", str(len(data))), *headers]:
            conn.putheader(key, value)
        conn.endheaders(data)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
    finally:
        conn.close()


def forbidden(requester: str, resource: str, name: str, group: str = "", sub: str = "",
              namespace: str | None = None) -> str:
    facts = FACTS["errors"]["forbidden"]
    template = facts["message_namespaced"] if namespace else facts["message_cluster"]
    return template.format(qualified=f"{resource}.{group}" if group else resource, name=name, requester=requester,
                           resource_and_sub=f"{resource}/{sub}" if sub else resource, group=group,
                           namespace=namespace)


def status_of(exc: pytest.ExceptionInfo[client.ApiException]) -> tuple[int, dict[str, Any]]:
    return exc.value.status, json.loads(exc.value.body)


def impersonate_checks(server: KubeApiServer, requester: str) -> list[tuple[str, str, str | None, str | None, bool]]:
    return [(a.group, a.resource, a.namespace, a.name, ok) for a, ok in list(server.authorizer.log)
            if a.verb == FACTS["checks"]["verb"] and a.user.name == requester]


def pwn_binding(user: str) -> dict[str, Any]:
    return {"metadata": {"name": "kvfleet-pwn"},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": "kvfleet"},
                         {"apiGroup": RBAC, "kind": "User", "name": user}]}


# --- (1) kvfleet's identity can impersonate nobody ------------------------------------------------------------


@pytest.mark.parametrize("target", ["admin", "kubernetes-admin", "self", SA_USER])
def test_kvfleet_cannot_impersonate_a_user_and_the_request_has_no_effect(twin: Twin, kube: Any,
                                                                         target: str) -> None:
    store, server = twin.store, twin.server
    target = twin.kvfleet_user if target == "self" else target  # even itself: the grant is what counts
    # Without impersonation kvfleet may list nodes (k8s/rbac/cluster.yaml); impersonating, it may do nothing.
    assert client.CoreV1Api(kube(twin.kvfleet_token)).list_node().items
    rbac_api = client.RbacAuthorizationV1Api(kube(twin.kvfleet_token, Impersonate_User=target))
    core = client.CoreV1Api(kube(twin.kvfleet_token, Impersonate_User=target,
                                 Impersonate_Group="system:masters"))
    if target == SA_USER:
        namespace, name = target.split(":")[2:]
        expected = forbidden(twin.kvfleet_user, "serviceaccounts", name, namespace=namespace)
        details = {"name": name, "kind": "serviceaccounts"}
    else:
        expected = forbidden(twin.kvfleet_user, "users", target)
        details = {"name": target, "kind": "users"}
    before = len(store.list(RBAC, "clusterrolebindings"))
    with pytest.raises(client.ApiException) as exc:
        rbac_api.create_cluster_role_binding(pwn_binding(twin.kvfleet_user))
    code, body = status_of(exc)
    assert code == FACTS["errors"]["forbidden"]["code"] == 403
    assert body["reason"] == FACTS["errors"]["forbidden"]["reason"] and body["message"] == expected
    assert body["details"] == details
    # with Impersonate-Group too, the user is checked first and is what is refused
    with pytest.raises(client.ApiException) as exc:
        core.delete_namespace("kube-system")
    assert status_of(exc)[0] == 403 and status_of(exc)[1]["message"] == expected
    with pytest.raises(client.ApiException) as exc:
        core.list_namespaced_secret("kube-system")
    assert status_of(exc)[1]["message"] == expected
    # no effect: nothing created or deleted, and no request ran as anybody
    assert store.get(RBAC, "clusterrolebindings", "kvfleet-pwn") is None
    assert len(store.list(RBAC, "clusterrolebindings")) == before
    assert store.get("", "namespaces", "kube-system") is not None
    assert not [r for r in store.request_log if r.user == target and target != twin.kvfleet_user]
    ns, name = (SA_USER.split(":")[2], SA_USER.split(":")[3]) if target == SA_USER else (None, target)
    resource = "serviceaccounts" if target == SA_USER else "users"
    assert impersonate_checks(server, twin.kvfleet_user) == [("", resource, ns, name, False)] * 3


def test_kvfleet_cannot_impersonate_system_masters_with_or_without_a_user(twin: Twin) -> None:
    store = twin.store
    facts = FACTS["errors"]["without_user"]
    path = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    # Impersonate-Group without Impersonate-User: 500 in plain text, before any authorization
    code, ctype, text = raw(twin, "POST", path, twin.kvfleet_token, [("Impersonate-Group", "system:masters")],
                            pwn_binding(twin.kvfleet_user))
    assert code == facts["code"] == 500 and ctype == facts["content_type"]
    assert text.rstrip("\n") == facts["message"].format(request_uri=path, requests=facts["example_requests"])
    code, _, text = raw(twin, "GET", "/api/v1/namespaces/kube-system/secrets", twin.kvfleet_token,
                        [("Impersonate-Group", "system:masters"), ("Impersonate-Group", "system:authenticated"),
                         ("Impersonate-Uid", "0")])
    assert code == 500 and text.rstrip("\n") == facts["message"].format(
        request_uri="/api/v1/namespaces/kube-system/secrets",
        requests="[{Group  system:masters    } {Group  system:authenticated    } "
                 "{UID  0  authentication.k8s.io/v1  }]")
    assert impersonate_checks(twin.server, twin.kvfleet_user) == []  # refused before any check
    # with a user: 403 on the user, the first check
    code, _, text = raw(twin, "POST", path, twin.kvfleet_token,
                        [("Impersonate-User", "admin"), ("Impersonate-Group", "system:masters"),
                         ("Impersonate-Extra-Scopes", "admin"), ("Impersonate-Uid", "0")],
                        pwn_binding(twin.kvfleet_user))
    assert code == 403 and json.loads(text)["message"] == forbidden(twin.kvfleet_user, "users", "admin")
    assert store.get(RBAC, "clusterrolebindings", "kvfleet-pwn") is None
    # and the same request without impersonation is refused by RBAC as kvfleet itself
    code, _, text = raw(twin, "POST", path, twin.kvfleet_token, [], pwn_binding(twin.kvfleet_user))
    assert code == 403
    assert f'User "{twin.kvfleet_user}" cannot create resource "clusterrolebindings"' in json.loads(text)["message"]
    assert store.get(RBAC, "clusterrolebindings", "kvfleet-pwn") is None


def test_k8s_rbac_grants_kvfleet_no_impersonate() -> None:
    """The premise of the tests above, read from the files the twin bootstraps."""
    root = Path(__file__).resolve().parents[3] / "k8s" / "rbac"
    docs = [d for f in sorted(root.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    verbs = {v for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d.get("rules") or []
             for v in r.get("verbs") or []}
    assert verbs and FACTS["checks"]["verb"] not in verbs and "*" not in verbs


# --- (2) the sandbox admin may impersonate; the request is then authorized as the impersonated user ------------


def test_admin_impersonating_a_user_is_authorized_as_that_user(twin: Twin, kube: Any) -> None:
    store, server = twin.store, twin.server
    store.create("", "secrets", {"metadata": {"name": "s", "namespace": "kube-system"}, "data": {}})
    assert client.CoreV1Api(kube(twin.admin_token)).list_namespaced_secret("kube-system").items
    as_nobody = client.CoreV1Api(kube(twin.admin_token, Impersonate_User="nobody"))
    with pytest.raises(client.ApiException) as exc:
        as_nobody.list_namespaced_secret("kube-system")
    code, body = status_of(exc)
    assert code == 403
    assert body["message"] == ('secrets is forbidden: User "nobody" cannot list resource "secrets" in API group "" '
                               'in the namespace "kube-system"')
    # the impersonated user has no group but system:authenticated (facts: impersonated_user)
    denied = [a for a, ok in server.authorizer.log if not ok and a.user.name == "nobody"]
    assert [a.user.groups for a in denied] == [("system:authenticated",)]
    assert FACTS["impersonated_user"]["groups"]["user_without_groups"] == []
    assert [(r.verb, r.resource, r.user, r.allowed) for r in store.request_log if r.user == "nobody"] == [
        ("list", "secrets", "nobody", False)]
    admin = server.authenticator.static_tokens[twin.admin_token].name
    assert impersonate_checks(server, admin) == [("", "users", None, "nobody", True)]
    # discovery is open to the impersonated user (system:authenticated)
    assert client.CoreApi(kube(twin.admin_token, Impersonate_User="nobody")).get_api_versions().versions


def test_admin_impersonating_groups_and_service_accounts(twin: Twin) -> None:
    store, server = twin.store, twin.server
    admin = server.authenticator.static_tokens[twin.admin_token].name
    secrets = "/api/v1/namespaces/kube-system/secrets"
    # groups given are the authority: system:masters makes nobody a superuser; system:authenticated is appended
    code, _, _ = raw(twin, "GET", secrets, twin.admin_token,
                     [("Impersonate-User", "nobody"), ("Impersonate-Group", "system:masters"),
                      ("Impersonate-Group", "team"), ("Impersonate-Uid", "u-1"),
                      ("Impersonate-Extra-Scopes", "view"), ("Impersonate-Extra-Acme.com%2Fproject", "p")])
    assert code == 200
    assert impersonate_checks(server, admin) == [
        ("", "users", None, "nobody", True), ("", "groups", None, "system:masters", True),
        ("", "groups", None, "team", True),
        ("authentication.k8s.io", "userextras/scopes", None, "view", True),
        ("authentication.k8s.io", "userextras/acme.com/project", None, "p", True),
        ("authentication.k8s.io", "uids", None, "u-1", True)]
    assert [r.user for r in store.request_log if r.resource == "secrets"] == ["nobody"]
    # a service account: its fixed groups, then system:authenticated
    code, _, _ = raw(twin, "GET", secrets, twin.admin_token, [("Impersonate-User", SA_USER)])
    assert code == 403
    ns = SA_USER.split(":")[2]
    expected = [g.replace("<ns>", ns) for g in FACTS["impersonated_user"]["groups"]["service_account_without_groups"]]
    denied = [a.user for a, ok in server.authorizer.log if not ok and a.user.name == SA_USER]
    assert [u.groups for u in denied] == [(*expected, "system:authenticated")]
    assert impersonate_checks(server, admin)[-1] == ("", "serviceaccounts", ns, SA_USER.split(":")[3], True)
    # system:unauthenticated among the groups: system:authenticated is not added
    raw(twin, "GET", secrets, twin.admin_token, [("Impersonate-User", "ghost"),
                                                 ("Impersonate-Group", "system:unauthenticated")])
    assert [a.user.groups for a, ok in server.authorizer.log if a.user.name == "ghost"] == [
        ("system:unauthenticated",)]


# --- (3) a grant on users named bob allows bob and nobody else -------------------------------------------------


def test_impersonate_grant_with_resource_names(twin: Twin, kube: Any) -> None:
    store, server = twin.store, twin.server
    admin_rbac = client.RbacAuthorizationV1Api(kube(twin.admin_token))
    admin_rbac.create_cluster_role({"metadata": {"name": "impersonate-bob"}, "rules": [
        {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["bob"]}]})
    admin_rbac.create_cluster_role_binding({
        "metadata": {"name": "impersonate-bob"},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "impersonate-bob"},
        "subjects": [{"apiGroup": RBAC, "kind": "User", "name": "impersonator"}]})
    admin_rbac.create_cluster_role({"metadata": {"name": "configmap-reader"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]})
    admin_rbac.create_namespaced_role_binding("default", {
        "metadata": {"name": "bob-reads-configmaps"},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "configmap-reader"},
        "subjects": [{"apiGroup": RBAC, "kind": "User", "name": "bob"}]})

    # as itself the impersonator may not list configmaps; as bob it may
    with pytest.raises(client.ApiException) as exc:
        client.CoreV1Api(kube(IMPERSONATOR_TOKEN)).list_namespaced_config_map("default")
    assert status_of(exc)[0] == 403
    as_bob = client.CoreV1Api(kube(IMPERSONATOR_TOKEN, Impersonate_User="bob"))
    as_bob.list_namespaced_config_map("default")
    assert [r.user for r in store.request_log if r.resource == "configmaps" and r.allowed] == ["bob"]
    with pytest.raises(client.ApiException) as exc:  # bob's rights, not the impersonator's
        as_bob.list_namespaced_config_map("kube-system")
    assert 'User "bob" cannot list resource "configmaps"' in status_of(exc)[1]["message"]

    # carol is not bob
    with pytest.raises(client.ApiException) as exc:
        client.CoreV1Api(kube(IMPERSONATOR_TOKEN, Impersonate_User="carol")).list_namespaced_config_map("default")
    code, body = status_of(exc)
    assert code == 403 and body["message"] == forbidden("impersonator", "users", "carol")
    assert not [r for r in store.request_log if r.user == "carol"]

    # bob, but with a group, extra or uid the grant does not cover: refused at that check
    secrets = "/api/v1/namespaces/kube-system/secrets"
    for header, value, expected in [
        ("Impersonate-Group", "system:masters", forbidden("impersonator", "groups", "system:masters")),
        ("Impersonate-Extra-Scopes", "view",
         forbidden("impersonator", "userextras", "view", group="authentication.k8s.io", sub="scopes")),
        ("Impersonate-Uid", "u-1", forbidden("impersonator", "uids", "u-1", group="authentication.k8s.io"))]:
        code, _, text = raw(twin, "GET", secrets, IMPERSONATOR_TOKEN, [("Impersonate-User", "bob"), (header, value)])
        assert code == 403 and json.loads(text)["message"] == expected, header
    assert FACTS["errors"]["forbidden"]["examples"][1].replace('"bob"', '"impersonator"') == forbidden(
        "impersonator", "userextras", "view", group="authentication.k8s.io", sub="scopes")
    assert not [r for r in store.request_log if r.resource == "secrets"]
    assert impersonate_checks(server, "impersonator") == [
        ("", "users", None, "bob", True), ("", "users", None, "bob", True), ("", "users", None, "carol", False),
        ("", "users", None, "bob", True), ("", "groups", None, "system:masters", False),
        ("", "users", None, "bob", True), ("authentication.k8s.io", "userextras/scopes", None, "view", False),
        ("", "users", None, "bob", True), ("authentication.k8s.io", "uids", None, "u-1", False)]


def test_impersonation_headers_from_an_unauthenticated_request_are_401(twin: Twin) -> None:
    code, _, _ = raw(twin, "GET", "/api/v1/namespaces", "not-a-token", [("Impersonate-User", "bob")])
    assert code == 401
    code, _, _ = raw(twin, "GET", "/api/v1/namespaces", "not-a-token", [("Impersonate-Group", "system:masters")])
    assert code == 401
