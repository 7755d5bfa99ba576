"""`kvfleet bootstrap --print`: one cluster's kvfleet-bootstrap bundle, for a cluster admin to apply.

The bundle is what kvfleet's runtime identity may not write itself (k8s/rbac/README.md, Bootstrap): the runtime
roles, the cluster's namespaces with their RoleBindings, and the Curvine charts' RBAC. Bad input exits 2 naming
the value and the choices, and prints nothing on stdout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvfleet.cli import main
from kvfleet.fleet import bootstrap_bundle as bb

ROOT = Path(__file__).resolve().parents[2]
FLEET = str(ROOT / "fleet.example.yaml")
TWIN = str(ROOT / "tests" / "fleets" / "twin.yaml")  # its ml-prod-use1 is a patch-mode cluster


def _objects(text: str) -> list[dict]:  # type: ignore[type-arg]
    return [d for d in yaml.safe_load_all(text) if d]


def _keys(docs: list[dict]) -> set[tuple[str, str | None, str]]:  # type: ignore[type-arg]
    return {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs}


def test_the_bundle_of_a_patch_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    from kvfleet.fleet.inventory import load_inventory

    assert main(["bootstrap", "--print", "--fleet", TWIN, "--cluster", "ml-prod-use1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# kvfleet-bootstrap for cluster ml-prod-use1")
    assert f"bootstrap --print --fleet {TWIN} --cluster ml-prod-use1 | kubectl apply -f -" in out
    assert "helm upgrade --install kyverno" not in out  # patch mode: no Kyverno
    docs = _objects(out)
    keys = _keys(docs)
    # the runtime roles and their bindings, without the kyverno-mode role
    assert {("ClusterRole", None, "kvfleet:cluster"), ("ClusterRoleBinding", None, "kvfleet:cluster"),
            ("ClusterRole", None, "kvfleet:endpoint-namespace"), ("ClusterRole", None, "kvfleet:curvine-namespace")
            } <= keys
    assert ("ClusterRole", None, "kvfleet:kyverno-mode") not in keys
    assert "ClusterPolicy" not in {k[0] for k in keys}
    # this cluster's endpoint namespaces and its Curvine namespace, each with kvfleet's RoleBinding
    inv = load_inventory(TWIN)
    endpoint_namespaces = {e.namespace for e in inv.endpoints if e.cluster == "ml-prod-use1"}
    other = {e.namespace for e in inv.endpoints} - endpoint_namespaces
    assert {k for k in keys if k[0] == "Namespace"} == {("Namespace", None, n)
                                                         for n in endpoint_namespaces | {"curvine"}}
    assert {("RoleBinding", n, "kvfleet-endpoint") for n in endpoint_namespaces} <= keys
    assert ("RoleBinding", "curvine", "kvfleet-curvine") in keys
    assert not any(k[1] in other for k in keys)
    # the Curvine charts' RBAC, kept by helm when an old release drops it
    assert _keys(bb.curvine_rbac("curvine")) <= keys
    for d in docs:
        if (d["metadata"].get("labels") or {}).get(bb.BUNDLE_LABEL):
            assert d["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    # a namespace comes before anything that lives in it
    first = {d["metadata"]["name"]: i for i, d in enumerate(docs) if d["kind"] == "Namespace"}
    assert all(first[d["metadata"]["namespace"]] < i for i, d in enumerate(docs) if d["metadata"].get("namespace"))


def test_a_kyverno_cluster_gets_its_role_and_the_kyverno_install_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bootstrap", "--print", "--fleet", FLEET, "--cluster", "ml-stage-usw2"]) == 0
    out = capsys.readouterr().out
    header = out.split("\napiVersion", 1)[0]
    assert "kyverno mode" in header and "helm upgrade --install kyverno kyverno" in header
    docs = _objects(out)
    assert ("ClusterRole", None, "kvfleet:kyverno-mode") in _keys(docs)
    # kvfleet's ClusterPolicy, last (it needs Kyverno's CRD): the runtime role may only get and patch it
    assert docs[-1]["kind"] == "ClusterPolicy" and docs[-1]["metadata"]["name"] == "kvfleet-curvine-l2"


@pytest.mark.parametrize(("argv", "message"), [
    (["bootstrap", "--print", "--fleet", FLEET], "--cluster is required: the fleet"),
    (["bootstrap", "--print", "--fleet", FLEET, "--cluster", "ml-nowhere"],
     "--cluster 'ml-nowhere' is not a cluster of"),
    (["bootstrap", "--fleet", FLEET, "--cluster", "ml-prod-use1"], "kvfleet never applies the bundle itself"),
])
def test_bad_input_exits_2_naming_the_fix_and_prints_nothing(argv: list[str], message: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err and "Traceback" not in captured.err
    if "--cluster" in message:
        assert "ml-prod-use1, ml-stage-usw2" in captured.err


def test_the_checked_in_files_are_the_bundle_of_the_example_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    """k8s/rbac/curvine-rbac.yaml and endpoint-namespaces.yaml (applied by hand or by the sandbox) hold what
    `kvfleet bootstrap --print` prints for fleet.example.yaml's first cluster."""
    assert main(["bootstrap", "--print", "--fleet", FLEET, "--cluster", "ml-prod-use1"]) == 0
    printed = _keys(_objects(capsys.readouterr().out))
    files = set()
    for name in ("cluster.yaml", "endpoints.yaml", "curvine-rbac.yaml"):
        files |= _keys(_objects((ROOT / "k8s" / "rbac" / name).read_text()))
    assert files <= printed
