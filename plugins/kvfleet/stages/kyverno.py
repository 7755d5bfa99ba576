"""Kyverno for kyverno-mode clusters (docs/reference/kyverno.md#webhooks): present and its admission webhook ready
before the ClusterPolicy.

Called by stage 2 (``stages.addons.reconcile``) once the operator is verified, on a cluster whose
``l2_injection`` is ``kyverno``; stage 4 (``stages.endpoints.ensure_kyverno_policy``) then applies the
ClusterPolicy. Nothing is assumed: a missing Kyverno is installed with helm at a pinned chart version, or, when
the install is not allowed, the cluster is refused with the exact command to run.

Observe (read-only, three calls): the CRD ``clusterpolicies.kyverno.io``; the admission controller Deployment,
found by the chart's labels ``app.kubernetes.io/component=admission-controller`` and
``app.kubernetes.io/part-of=kyverno`` in any namespace (so a platform team's own install, under the chart's
default release name, counts); and the MutatingWebhookConfiguration ``kyverno-resource-mutating-webhook-cfg``,
which the admission controller itself creates once it is healthy (Kyverno's webhook controller; the chart does
not ship it).

- all three there and the Deployment available: ``unchanged``;
- no Deployment: install (below), then wait until the Deployment is available and the webhook configuration
  exists, and record ``changed`` with what was verified;
- a Deployment that is there but not available, or no webhook configuration yet: wait for them (never a second
  install over a running one).

The install (facts and sources: ``tests/conformance/facts/kyverno_chart.yaml``): release ``kyverno``, chart
``kyverno`` from ``https://kyverno.github.io/kyverno/`` at :data:`CHART_VERSION`, in the dedicated namespace
``kyverno`` (Kyverno's install docs: never a shared or system namespace), values as a file (:data:`VALUES`:
the CRDs installed by the chart, three admission controller replicas for high availability). The repository
URL can point at a mirror through ``KVFLEET_HELM_REPO_KYVERNO`` (as ``KVFLEET_HELM_REPO_CURVINE`` does for
Curvine; both obey the inventory's https rule, ``kvfleet.fleet.shared_rules``).

Whether kvfleet may install: ``KVFLEET_KYVERNO_INSTALL`` (``refuse``, the default, or ``install``). Refused: a
``PermanentError`` naming the cluster and the exact ``helm`` command, recorded as ``refused``. Installing
Kyverno creates CRDs, ClusterRoles and bindings that grant wide rights: kvfleet's least-privilege identity in
``k8s/rbac`` cannot do it, so a platform team that lets kvfleet install binds it for the install (see
``k8s/rbac/README.md``) or sets ``refuse`` and runs the command itself; a 403 from helm is refused the same way.
"""

from __future__ import annotations

import shlex
from typing import Any

from kvfleet.clients.helm import render
from kvfleet.clients.kube import call, get_or_none, wait_for
from kvfleet.errors import KvfleetError, PermanentError
from kvfleet.settings import Settings, load_settings
from kvfleet.stages.base import Outcome, StageContext

STAGE = "kyverno"
RELEASE = "kyverno"
CHART = "kyverno"
REPO = "https://kyverno.github.io/kyverno/"
CHART_VERSION = "3.9.0"  # appVersion v1.19.0 (kyverno/kyverno tag kyverno-chart-3.9.0, charts/kyverno/Chart.yaml)
NAMESPACE = "kyverno"
# Values kvfleet installs with (real keys of charts/kyverno/values.yaml at that tag).
VALUES: dict[str, Any] = {"crds": {"install": True}, "admissionController": {"replicas": 3}}
POLICY_CRD = "clusterpolicies.kyverno.io"
ADMISSION_SELECTOR = "app.kubernetes.io/component=admission-controller,app.kubernetes.io/part-of=kyverno"
ADMISSION_DEPLOYMENT = "kyverno-admission-controller"  # the chart's name for release "kyverno"
RESOURCE_WEBHOOK = "kyverno-resource-mutating-webhook-cfg"  # pkg/config/config.go MutatingWebhookConfigurationName
INSTALL_ENV = "KVFLEET_KYVERNO_INSTALL"


def repo_url(settings: Settings | None = None) -> str:
    """The chart repository: :data:`REPO`, unless ``KVFLEET_HELM_REPO_KYVERNO`` names a mirror."""
    return (settings or load_settings()).helm_repo_kyverno or REPO


def install_allowed(ctx: StageContext) -> bool:
    return ctx.settings.kyverno_install == "install"


def install_command(settings: Settings | None = None, values_file: str = "kyverno-values.yaml") -> str:
    """The exact command a platform team runs (the values in the file are :data:`VALUES`)."""
    words = ["helm", "upgrade", "--install", RELEASE, CHART, "--repo", repo_url(settings), "--version",
             CHART_VERSION, "-n", NAMESPACE, "--create-namespace", "-f", values_file]
    return " ".join(shlex.quote(w) for w in words)


def values_yaml() -> str:
    import yaml

    return str(yaml.safe_dump(VALUES, sort_keys=True, default_flow_style=False))


def _refusal(ctx: StageContext, why: str) -> str:
    return (f"cluster {ctx.cluster.name} is in kyverno mode (clusters.{ctx.cluster.name}.l2_injection: kyverno) "
            f"and Kyverno is missing; {why}. Install it, then run the rollout again:\n"
            f"cat > kyverno-values.yaml <<'EOF'\n{values_yaml()}EOF\n{install_command(ctx.settings)}")


# ---- observation ----------------------------------------------------------------------------------------------


def observe(ctx: StageContext) -> dict[str, Any]:
    """``{"crd", "deployment", "available", "webhook"}``: what of Kyverno the cluster has now."""
    kube = ctx.kube
    crd = get_or_none(kube.apiext.read_custom_resource_definition, POLICY_CRD)
    served = crd is not None and any(v.served for v in crd.spec.versions or [])
    deps = call(kube.apps.list_deployment_for_all_namespaces, label_selector=ADMISSION_SELECTOR,
                what="list Kyverno's admission controller Deployments").items
    dep = deps[0] if deps else None
    ready = available = 0
    if dep is not None:
        ready = getattr(dep.status, "ready_replicas", None) or 0
        conditions = getattr(dep.status, "conditions", None) or []
        available = any(c.type == "Available" and c.status == "True" for c in conditions)
    from kubernetes import client

    webhook = get_or_none(client.AdmissionregistrationV1Api(kube.api_client).read_mutating_webhook_configuration,
                          RESOURCE_WEBHOOK)
    return {"crd": served, "deployment": f"{dep.metadata.namespace}/{dep.metadata.name}" if dep else None,
            "ready": ready, "available": bool(dep is not None and ready >= 1 and available),
            "webhook": webhook is not None}


def is_ready(state: dict[str, Any]) -> bool:
    return bool(state["crd"] and state["available"] and state["webhook"])


def describe(state: dict[str, Any]) -> str:
    return (f"CRD {POLICY_CRD} served={state['crd']}, admission controller {state['deployment'] or 'absent'} "
            f"ready {state['ready']} available={state['available']}, MutatingWebhookConfiguration "
            f"{RESOURCE_WEBHOOK} {'present' if state['webhook'] else 'absent'}")


def wait_ready(ctx: StageContext) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def check() -> tuple[bool, str]:
        last.update(observe(ctx))
        return is_ready(last), describe(last)

    wait_for(check, timeout_s=ctx.timeouts.pods_s, poll_s=ctx.poll_s, what=f"[{ctx.cluster.name}] Kyverno",
             progress=ctx.progress)
    return last


# ---- the reconciler -------------------------------------------------------------------------------------------


def reconcile(ctx: StageContext) -> Outcome:
    """Ensure Kyverno and its admission webhook on a kyverno-mode cluster (nothing on a patch-mode one)."""
    cl = ctx.cluster
    if cl.l2_injection != "kyverno":
        return ctx.record("kyverno", STAGE, "unchanged", mode=cl.l2_injection, kyverno="not needed")
    state = observe(ctx)
    if is_ready(state):
        ctx.say(f"kyverno: ready ({describe(state)})")
        return ctx.record("kyverno", STAGE, "unchanged", verified=describe(state))
    if state["deployment"] is not None:  # installed, not (yet) serving: wait, never install over it
        if ctx.dry_run:
            return ctx.record("kyverno", STAGE, "unchanged", observed=describe(state),
                              note="installed; a rollout waits for its webhook")
        ready = wait_ready(ctx)
        return ctx.record("kyverno", STAGE, "unchanged", verified=describe(ready), waited=True)
    if not install_allowed(ctx):
        why = f"{INSTALL_ENV}=refuse does not let kvfleet install it"
        ctx.record("kyverno", STAGE, "refused", reason=why, command=install_command(ctx.settings),
                   observed=describe(state))
        raise PermanentError(_refusal(ctx, why))
    if ctx.dry_run:
        ctx.plan(STAGE, install_command(ctx.settings), diff=f"+ Kyverno {CHART_VERSION} in namespace {NAMESPACE} "
                 f"(values: {values_yaml().strip()})\n  then wait: admission controller available, "
                 f"MutatingWebhookConfiguration {RESOURCE_WEBHOOK}")
        return ctx.record("kyverno", STAGE, "planned", command=install_command(ctx.settings))
    _install(ctx, state)
    ready = wait_ready(ctx)
    ctx.say(f"kyverno: installed {CHART} {CHART_VERSION}; {describe(ready)}")
    return ctx.record("kyverno", STAGE, "changed", chart=f"{CHART} {CHART_VERSION}", repo=repo_url(ctx.settings),
                      namespace=NAMESPACE, values=VALUES, verified=describe(ready))


def _install(ctx: StageContext, state: dict[str, Any]) -> None:
    # upgrade --install: a release an earlier try left failed (no admission Deployment) is upgraded, not refused
    # with "cannot re-use a name"
    args = ["upgrade", "--install", RELEASE, CHART, "--repo", repo_url(ctx.settings), "--version", CHART_VERSION,
            "-n", NAMESPACE, "--create-namespace", "-f", ctx.helm.values_file(VALUES, "kyverno")]
    ctx.say(f"kyverno: {render(['helm', *args])}   # Kyverno missing: {describe(state)}")
    with ctx.write_ahead("helm_install", f"release {NAMESPACE}/{RELEASE} {CHART_VERSION} (Kyverno)") as wa:
        try:
            ctx.helm.run(*args, what=f"helm upgrade --install {RELEASE} (Kyverno)")
        except KvfleetError as exc:  # a 403 is no transient failure: refuse with the command, do not retry
            if "forbidden" in str(exc).lower():
                why = f"kvfleet's identity may not install it (helm: {str(exc)[:300]})"
                ctx.record("kyverno", STAGE, "refused", reason=why, command=install_command(ctx.settings))
                raise PermanentError(_refusal(ctx, why)) from exc
            raise
        if wa is not None:
            wa.detail = {"chart": f"{CHART} {CHART_VERSION}", "repo": repo_url(ctx.settings), "values": VALUES}
