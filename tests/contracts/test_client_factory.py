"""A cluster's clients are built in one place (kvfleet.clients.factory), from its reference (account, region, name):
no other module of the product constructs a HyperPod client or a Kubernetes access itself, so reaching an account
with its own identity changes one module. The triggers carry the account with the cluster across a deferral."""

from __future__ import annotations

import ast
from pathlib import Path

from kvfleet.airflow.triggers.kube_watch import KubeWatchTrigger
from kvfleet.airflow.triggers.readiness import ClusterReadyTrigger, KubeReadyTrigger
from kvfleet.fleet.cluster_ref import ClusterRef

PRODUCT = Path(__file__).resolve().parents[2] / "plugins" / "kvfleet"
FACTORY = PRODUCT / "clients" / "factory.py"


def _builds(tree: ast.AST) -> list[str]:
    """The calls ``HyperPodClient(...)`` and ``ClusterAccess.from_hyperpod(...)`` in a module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "HyperPodClient":
                out.append(f"HyperPodClient line {node.lineno}")
            if isinstance(f, ast.Attribute) and f.attr == "from_hyperpod":
                out.append(f"from_hyperpod line {node.lineno}")
    return out


def test_only_the_factory_builds_a_cluster_s_clients() -> None:
    found = {str(p.relative_to(PRODUCT)): b for p in sorted(PRODUCT.rglob("*.py")) if p != FACTORY
             and (b := _builds(ast.parse(p.read_text(encoding="utf-8"))))}
    assert found == {}, found
    assert _builds(ast.parse(FACTORY.read_text(encoding="utf-8")))  # the scan finds what it looks for


def test_the_triggers_carry_the_cluster_s_account() -> None:
    for trigger in (ClusterReadyTrigger("ml-prod", "us-east-1", account="222222222222", addon="cert-manager"),
                    KubeReadyTrigger("ml-prod", "us-east-1", account="222222222222", check="operator"),
                    KubeWatchTrigger("ml-prod", "us-east-1", account="222222222222")):
        path, kwargs = trigger.serialize()
        again = type(trigger)(**kwargs)
        assert again.serialize() == (path, kwargs)
        assert again.ref == ClusterRef("222222222222", "us-east-1", "ml-prod")
    assert ClusterReadyTrigger("c1", "us-east-1").ref.account == "default"  # a trigger from before accounts
