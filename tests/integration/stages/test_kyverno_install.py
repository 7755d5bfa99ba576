"""Kyverno on a kyverno-mode cluster, against the twin: missing, it is installed by kvfleet with
helm from the chart repository at the pinned version, its admission webhook is verified ready, and only then is
the ClusterPolicy applied; not allowed to install, kvfleet refuses with the exact helm command and changes nothing.

The twin starts the cluster without Kyverno (``SandboxSettings(kyverno="chart")``): its Kyverno simulation serves
only once the stand-in chart's admission controller Deployment is available, as the real admission controller
registers its webhooks only once it runs. The sandbox enforces k8s/rbac, which does not grant the install
(k8s/rbac/README.md, "Kyverno"): a test that lets kvfleet install binds the group to a cluster-admin role first,
as the README tells a platform team to."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from twinenv import stage_contexts, use_twin

from kvfleet.errors import PermanentError
from kvfleet.fleet.endpoint_spec import kyverno_policy
from kvfleet.fleet.inventory import load_inventory
from kvfleet.stages import addons, endpoints, kyverno
from kvfleet.stages.base import StageContext, Timeouts

pytestmark = pytest.mark.integration

CLUSTER = "ml-stage-usw2"  # kyverno mode in fleet.example.yaml
PATCH_CLUSTER = "ml-prod-use1"
RBAC = "rbac.authorization.k8s.io"


@pytest.fixture
def chart_env(sandbox_factory, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    sandbox = use_twin(sandbox_factory(kyverno="chart"), monkeypatch)
    monkeypatch.setenv(kyverno.INSTALL_ENV, "install")  # these tests let kvfleet install (grant_install binds it)
    return sandbox


@pytest.fixture
def make_ctx(chart_env, example_fleet) -> Iterator[Callable[..., StageContext]]:  # type: ignore[no-untyped-def]
    with stage_contexts(load_inventory(example_fleet), CLUSTER) as make:
        yield make


def grant_install(sandbox: Any) -> None:
    """What k8s/rbac/README.md asks of a platform team that lets kvfleet install Kyverno: the group kvfleet bound
    to a cluster-admin role (written as the cluster's admin)."""
    store = sandbox.twin(CLUSTER).store
    store.create(RBAC, "clusterroles", {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole",
                                        "metadata": {"name": "test-cluster-admin"},
                                        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]})
    store.create(RBAC, "clusterrolebindings", {
        "apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kvfleet-installs-kyverno"},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "test-cluster-admin"},
        "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": "kvfleet"}]})


def nothing_installed(sandbox: Any) -> bool:
    store = sandbox.twin(CLUSTER).store
    return (store.get("apiextensions.k8s.io", "customresourcedefinitions", kyverno.POLICY_CRD) is None
            and store.get("apps", "deployments", kyverno.ADMISSION_DEPLOYMENT, kyverno.NAMESPACE) is None
            and not store.list("", "secrets", kyverno.NAMESPACE))


def test_missing_kyverno_is_installed_then_its_webhook_is_ready_then_the_policy(chart_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    twin = chart_env.twin(CLUSTER)
    assert nothing_installed(chart_env) and not twin.services["kyverno"].serving
    grant_install(chart_env)

    ctx = make_ctx()
    state = kyverno.observe(ctx)
    assert not kyverno.is_ready(state) and state["deployment"] is None

    outcome = kyverno.reconcile(ctx)

    assert outcome.outcome == "changed", outcome
    assert outcome.detail["chart"] == f"kyverno {kyverno.CHART_VERSION}"
    release = ctx.helm.status(kyverno.RELEASE, kyverno.NAMESPACE)
    assert release is not None
    assert ctx.helm.values(kyverno.RELEASE, kyverno.NAMESPACE, all_values=False) == kyverno.VALUES
    dep = twin.store.get("apps", "deployments", kyverno.ADMISSION_DEPLOYMENT, kyverno.NAMESPACE)
    assert dep is not None and dep["spec"]["replicas"] == 3
    assert int(dep["status"]["availableReplicas"]) >= 1
    webhook = twin.store.get("admissionregistration.k8s.io", "mutatingwebhookconfigurations",
                             kyverno.RESOURCE_WEBHOOK)
    assert webhook is not None and twin.services["kyverno"].serving

    # Then the policy: kvfleet may not create it (stage 4 refuses, naming the bundle), the admin applies the
    # bootstrap bundle now that Kyverno serves, and the policy is admitted after the webhook existed.
    desired = kyverno_policy(ctx.inventory.settings)
    name = desired["metadata"]["name"]
    with pytest.raises(PermanentError, match=f"ClusterPolicy {name} does not exist on cluster {CLUSTER}.*"
                                             "kvfleet bootstrap --print"):
        endpoints.ensure_kyverno_policy(ctx)
    assert twin.store.get("kyverno.io", "clusterpolicies", name) is None
    twin.store.create("kyverno.io", "clusterpolicies", desired)  # the cluster admin, with the bundle
    assert endpoints.ensure_kyverno_policy(ctx) == "unchanged"
    policy = twin.store.get("kyverno.io", "clusterpolicies", name)
    assert policy is not None and policy["status"]["ready"] is True
    assert int(webhook["metadata"]["resourceVersion"]) < int(policy["metadata"]["resourceVersion"])

    # Idempotent: a second pass observes Kyverno ready and installs nothing.
    again = kyverno.reconcile(make_ctx())
    assert again.outcome == "unchanged"


def test_stage_2_installs_kyverno_on_a_kyverno_cluster_only(chart_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    grant_install(chart_env)
    outcome = addons.reconcile(make_ctx())
    assert outcome.outcome == "changed" and outcome.detail["kyverno"] == "changed"
    patch = addons.reconcile(make_ctx(PATCH_CLUSTER))
    assert patch.detail["kyverno"] == "unchanged"
    assert chart_env.twin(PATCH_CLUSTER).store.get("apps", "deployments", kyverno.ADMISSION_DEPLOYMENT,
                                                   kyverno.NAMESPACE) is None


def test_not_allowed_to_install_refuses_with_the_exact_command(chart_env, make_ctx,  # type: ignore[no-untyped-def]
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    grant_install(chart_env)
    monkeypatch.setenv(kyverno.INSTALL_ENV, "refuse")
    with pytest.raises(PermanentError) as refused:
        kyverno.reconcile(make_ctx())
    text = str(refused.value)
    repo = chart_env.exports()["KVFLEET_HELM_REPO_KYVERNO"]
    assert (f"helm upgrade --install kyverno kyverno --repo {repo} --version {kyverno.CHART_VERSION} -n kyverno "
            "--create-namespace -f kyverno-values.yaml") in text
    assert "admissionController:\n  replicas: 3\ncrds:\n  install: true\n" in text
    assert CLUSTER in text and "l2_injection: kyverno" in text
    assert nothing_installed(chart_env)

    monkeypatch.setenv(kyverno.INSTALL_ENV, "sometimes")
    with pytest.raises(PermanentError, match="KVFLEET_KYVERNO_INSTALL='sometimes': .*allowed: install or refuse"):
        kyverno.reconcile(make_ctx())


def test_an_install_rbac_forbids_is_refused_with_the_command(chart_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    """Without the install grant (k8s/rbac alone), helm's 403 becomes the refusal, not a retried failure."""
    with pytest.raises(PermanentError) as refused:
        kyverno.reconcile(make_ctx())
    assert "may not install it" in str(refused.value)
    assert f"--version {kyverno.CHART_VERSION} -n kyverno --create-namespace" in str(refused.value)


def test_dry_run_plans_the_install_and_changes_nothing(chart_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx(dry_run=True)
    outcome = kyverno.reconcile(ctx)
    assert outcome.outcome == "planned"
    (planned,) = ctx.planned
    assert planned.action == kyverno.install_command() and "MutatingWebhookConfiguration" in (planned.diff or "")
    assert nothing_installed(chart_env)


def test_a_preinstalled_kyverno_is_verified_not_reinstalled(sandbox_factory, example_fleet,  # type: ignore[no-untyped-def]
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox = use_twin(sandbox_factory(), monkeypatch)  # the default: a platform team's Kyverno is there
    inv = load_inventory(example_fleet)
    ctx = StageContext(inventory=inv, cluster=inv.cluster(CLUSTER), aws_conn_id=None,
                       timeouts=Timeouts(pods_s=60))
    try:
        ready = kyverno.wait_ready(ctx)
        assert ready["deployment"] == f"{kyverno.NAMESPACE}/{kyverno.ADMISSION_DEPLOYMENT}"
        assert kyverno.reconcile(ctx).outcome == "unchanged"
        # kvfleet installed nothing: no helm release Secret in the namespace.
        assert not [s for s in sandbox.twin(CLUSTER).store.list("", "secrets", kyverno.NAMESPACE)
                    if (s["metadata"].get("labels") or {}).get("owner") == "helm"]
    finally:
        ctx.close()


def test_drift_reports_a_missing_kyverno_and_remediation_installs_it_before_the_policy(chart_env,  # type: ignore[no-untyped-def]
                                                                                       make_ctx) -> None:
    from kvfleet.stages import drift

    before = drift.check(make_ctx())
    (missing,) = [f for f in before.findings if f.kind == "kyverno_missing"]
    assert missing.severity == "high" and "absent" in missing.actual
    assert "policy_missing" in {f.kind for f in before.findings}

    # Not allowed to install (k8s/rbac alone): refused, and the policy waits for it.
    refused = drift.check(make_ctx(), remediate=True)
    outcomes = {r["action"]: r["outcome"] for r in refused.remediations}
    assert outcomes["ensure_kyverno"] == "refused" and outcomes["ensure_kyverno_policy"] == "refused"
    assert nothing_installed(chart_env)

    grant_install(chart_env)
    fixed = drift.check(make_ctx(), remediate=True)
    order = [r["action"] for r in fixed.remediations]
    assert order.index("ensure_kyverno") < order.index("ensure_kyverno_policy")
    # Kyverno installed; the policy is the bootstrap bundle's, which kvfleet may not create: refused with the command
    (policy,) = [r for r in fixed.remediations if r["action"] == "ensure_kyverno_policy"]
    assert policy["outcome"] == "refused" and "kvfleet bootstrap --print" in policy["detail"]["reason"]
    after = {f.kind for f in drift.check(make_ctx()).findings}
    assert "kyverno_missing" not in after and "policy_missing" in after


def test_preflight_names_a_missing_kyverno(chart_env, make_ctx, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A warning while stage 2 may install it (the command to run beforehand as the fix); an error when not."""
    from kvfleet.stages import preflight

    (problem,) = preflight.check(make_ctx())
    assert (problem.check, problem.severity) == ("kyverno", "warning")
    assert kyverno.install_command() in problem.fix and "3.9.0" in problem.what
    assert preflight.check(make_ctx(PATCH_CLUSTER)) == []  # patch mode needs no Kyverno

    monkeypatch.setenv(kyverno.INSTALL_ENV, "refuse")
    (problem,) = preflight.check(make_ctx())
    assert (problem.check, problem.severity) == ("kyverno", "error")
    assert problem.fix.endswith(kyverno.install_command())
    assert nothing_installed(chart_env)
