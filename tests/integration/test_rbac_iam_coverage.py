"""k8s/rbac and k8s/iam are derived from what kvfleet really calls: replay a rollout, the hit verification and the
drift check against the sandbox, then compare every Kubernetes request (kvfleet's client and the helm it runs) and
every AWS call the emulators saw with the grants in the files.

The sandbox enforces them: kvfleet's EKS token maps to the group ``kvfleet``, the emulator applies the
kvfleet-bootstrap bundle (k8s/rbac, the Curvine charts' roles included) as a cluster admin would and authorizes
every request with Kubernetes RBAC, including the escalation rule (``escalate``/``bind``). Both stand-in Curvine
charts are installed and upgraded as kvfleet, with ``rbac.create=false`` (the runtime chart's pre-upgrade hook Job
runs to completion); any 403 fails the replay, and so does any write of an RBAC object by kvfleet.

- Every (verb, group, resource/subresource, namespace or cluster scope, name) request is allowed by some binding of
  the group ``kvfleet`` in k8s/rbac/*.yaml, evaluated with Kubernetes RBAC semantics (a RoleBinding grants only in
  its namespace; ``resourceNames`` never match a create).
- Every verb on every resource of every rule, and every binding, is used by at least one request, except the few
  listed in ``UNREACHED`` with the code path that needs them.
- k8s/iam/kvfleet-policy.json lists exactly the ``service:Operation`` pairs the AWS emulator served, plus
  sts:GetCallerIdentity (the EKS bearer token is a presigned GetCallerIdentity URL that EKS, not kvfleet, calls).

The replay: `kvfleet preflight` on both clusters (read-only; the EBS CSI role carries an inline policy too, as a
platform team's role may, so every IAM read preflight makes is reached), then stages 1-5 on ml-prod-use1 (patch mode) and ml-stage-usw2 (kyverno mode), in parallel, one endpoint
each; the drift check on both; then the update paths a later rollout takes: an InferenceEndpointConfig whose
labels were edited by hand (patch), an add-on whose configuration changed in the inventory (UpdateAddon) and a
ClusterPolicy edited by hand (patch); last, a Curvine chart upgrade and a worker scale-out on ml-prod-use1 (the
two Curvine DAGs). Reconcilers are retried like Airflow retries a task (they are idempotent).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.fleet import constants as C
from kvfleet.fleet.endpoint_spec import kyverno_policy
from kvfleet.fleet.inventory import Endpoint, Inventory, load_inventory
from kvfleet_sandbox.runtime import start_sandbox
from kvfleet_sandbox.twin import SandboxSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RBAC_DIR = ROOT / "k8s" / "rbac"
IAM_POLICY = ROOT / "k8s" / "iam" / "kvfleet-policy.json"
GROUP = "kvfleet"
PATCH_CLUSTER, KYVERNO_CLUSTER = "ml-prod-use1", "ml-stage-usw2"
ENDPOINT = "retail-assistant"
# Grants the replay cannot reach, each with the code path that needs it.
WATCH = "airflow/triggers/kube_watch.py KubeWatchTrigger: the drift watch (its rules: fleet/watch_rules.py)"
UNREACHED = {
    ("kvfleet:endpoint-namespace", "", "events", "list"):
        "stages/readiness.py curvine_pvcs: explains a PVC that stays Pending (sandbox PVCs bind at once)",
    ("kvfleet:curvine-namespace", "", "pods", "delete"):
        "stages/curvine_upgrade.py replace_stuck_pods: a rollback after a failed upgrade (the replay's succeeds)",
    # The drift watch runs in Airflow's triggerer, not in the replayed tasks; tests/integration/test_triggers.py
    # runs it against the twin, which enforces these same files.
    ("kvfleet:cluster", "", "pods", "watch"): WATCH,
    ("kvfleet:cluster", "apps", "deployments", "watch"): WATCH,
    ("kvfleet:cluster", "inference.sagemaker.aws.amazon.com", "inferenceendpointconfigs", "watch"): WATCH,
    ("kvfleet:curvine-namespace", "", "secrets", "watch"): WATCH,
}
# Not seen by the emulator: EKS's authenticator calls it with the presigned URL of kvfleet's bearer token.
TOKEN_ACTIONS = {"sts:GetCallerIdentity"}
# API operations whose IAM action has another name. S3 HeadBucket is authorized by s3:ListBucket (Amazon S3 API
# Reference, HeadBucket: "you must have permissions to perform the s3:ListBucket action").
IAM_ACTION_OF = {"s3:HeadBucket": "s3:ListBucket"}


@dataclass(frozen=True)
class Request:
    verb: str
    group: str
    resource: str  # "deployments" or "deployments/scale"
    namespace: str | None
    name: str | None


@dataclass(frozen=True)
class Grant:
    binding: str
    role: str
    scope: str | None  # None: a ClusterRoleBinding (every namespace and cluster-scoped resources)
    rule: int
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    names: tuple[str, ...]

    def allows(self, r: Request) -> bool:
        if self.scope is not None and r.namespace != self.scope:
            return False
        if self.names and r.name not in self.names:
            return False
        return ((r.group in self.api_groups or "*" in self.api_groups)
                and (r.resource in self.resources or "*" in self.resources)
                and (r.verb in self.verbs or "*" in self.verbs))


def load_grants() -> list[Grant]:
    docs = [d for f in sorted(RBAC_DIR.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d.get("rules") or []
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    grants = []
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "Group" and s["name"] == GROUP for s in b.get("subjects") or []):
            continue
        ref = b["roleRef"]
        scope = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        key = (ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])
        assert key in roles, f"{b['kind']} {b['metadata']['name']} refers to a missing {ref['kind']} {ref['name']}"
        for i, rule in enumerate(roles[key]):
            grants.append(Grant(f"{b['kind']}/{scope or ''}/{b['metadata']['name']}", ref["name"], scope, i,
                                tuple(rule.get("apiGroups") or ()), tuple(rule.get("resources") or ()),
                                tuple(rule.get("verbs") or ()), tuple(rule.get("resourceNames") or ())))
    return grants


# ---- the replay ---------------------------------------------------------------------------------------------


def _retried(fn: Callable[[], Any], attempts: int = 3) -> Any:
    """Like an Airflow task retry: the reconcilers are idempotent, so a transient failure is retried."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(1)
    return None


def _endpoint(inv: Inventory, cluster: str) -> Endpoint:
    return next(e for e in inv.endpoints if e.cluster == cluster and e.name == ENDPOINT)


def _ctx(inv: Inventory, cluster: str) -> Any:
    from kvfleet.stages.base import StageContext, Timeouts

    return StageContext(inventory=inv, cluster=inv.cluster(cluster), aws_conn_id=None,
                        timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=60, pvc_s=30))


def _changed_operator_config(inv: Inventory, cluster: str) -> Inventory:
    def change(cl: Any) -> Any:
        addons = [a.model_copy(update={"configuration": {**dict(a.configuration or {}), "kvfleetTest": True}})
                  if a.name == C.OPERATOR_ADDON else a for a in cl.addons]
        return cl.model_copy(update={"addons": addons})

    return inv.model_copy(update={"clusters": [change(c) if c.name == cluster else c for c in inv.clusters]})


def _replay_cluster(sandbox: Any, inv: Inventory, cluster: str) -> None:
    from kvfleet.stages import addons, curvine, endpoints, tiered_storage, verify

    twin = sandbox.twin(cluster)
    ep = _endpoint(inv, cluster)
    ctx = _ctx(inv, cluster)
    try:
        from kvfleet.stages import preflight  # kvfleet preflight and the rollout's preflight task

        assert preflight.errors(preflight.check(ctx)) == []
        for stage in (tiered_storage, addons, curvine):  # kvfleet_rollout: cluster_stages
            _retried(lambda stage=stage: stage.reconcile(ctx))
        _retried(lambda: endpoints.reconcile_wave(ctx, [ep], holder=f"rbac/{cluster}"))  # cluster_waves
        nodes, why = verify.endpoint_nodes(ctx, [ep])  # kvfleet_hit_verification's batch plan (one pod list)
        assert why is None and nodes.get(ep.key), why  # a 403 would come back as the reason, not raise
        result = verify.verify_endpoint(ctx, ep, 2000)  # the wave gate and kvfleet_hit_verification
        # The hit is functional; the verdict also weighs TTFT, which a loaded test machine may degrade.
        assert result.hit_ratio == 1.0, result
        from kvfleet.stages import advise  # kvfleet advise and kvfleet_hit_verification's advise task

        assert advise.advise_cluster(ctx).errors == []
        if importlib.util.find_spec("kvfleet.stages.drift") is not None:  # kvfleet_drift_check
            from kvfleet.stages import drift

            assert drift.check(ctx).reachable
        # Update paths of a later rollout.
        if cluster == KYVERNO_CLUSTER:
            name = kyverno_policy(inv.settings)["metadata"]["name"]

            def hand_edit(policy: dict[str, Any]) -> dict[str, Any]:
                policy["spec"]["background"] = True
                return policy

            twin.store.mutate("kyverno.io", "clusterpolicies", name, None, hand_edit)
            assert endpoints.ensure_kyverno_policy(ctx) == "changed"
        else:
            def drop_lob(iec: dict[str, Any]) -> dict[str, Any]:
                iec["metadata"]["labels"].pop(C.LOB_LABEL, None)
                return iec

            twin.store.mutate(C.IEC_GROUP, C.IEC_PLURAL, ep.name, ep.namespace, drop_lob)
            assert endpoints.apply_iec(ctx, ep) == "changed"
            changed = _ctx(_changed_operator_config(inv, cluster), cluster)
            try:
                _retried(lambda: addons.reconcile(changed))
            finally:
                changed.close()
    finally:
        ctx.close()


@dataclass
class Replay:
    requests: list[Request]
    aws_actions: set[str]
    drift_ran: bool
    denied: list[str]  # requests and escalate/bind checks of kvfleet's identity that RBAC refused
    checks: set[tuple[str, str, str | None]]  # allowed escalate/bind checks: (verb, resource, name)
    hook_jobs: list[str]  # "<verb> <name>" of kvfleet's requests on batch/jobs (the pre-upgrade hook)
    iam_enforced: bool = False  # the twin authorized every AWS call with k8s/iam/kvfleet-policy.json
    iam_denied: list[str] = dataclasses.field(default_factory=list)  # AWS calls IAM refused: "action on resource"


def _replay_curvine_operations(inv: Inventory, history: Any) -> None:
    """kvfleet_curvine_upgrade and kvfleet_curvine_scale_out on the patch cluster, under their cluster leases."""
    from kvfleet.history.keys import StepKey
    from kvfleet.stages import curvine, curvine_scale, curvine_upgrade

    history.runs.start("rbac/curvine", dag_id="rbac", run_id="curvine", trigger="test", triggered_by=None,
                      params={})
    ctx = _ctx(inv, PATCH_CLUSTER)
    ctx.history, ctx.step_key = history, StepKey("rbac/curvine", "curvine")
    try:
        up = curvine_upgrade.upgrade(ctx, curvine_upgrade.UpgradeRequest(version="0.3.3-alpha", timeout_s=60),
                                     holder="rbac/curvine")
        assert up.outcome == "changed", up
        workers = curvine_scale.observe(ctx).replicas
        out = curvine_scale.scale(ctx, curvine_scale.ScaleRequest(target=workers + 1, timeout_s=60),
                                  holder="rbac/curvine")
        assert out.outcome == "changed", out
        # The CSI chart is upgraded too (--reuse-values: still rbac.create=false, so no role is written).
        ns = ctx.cluster.curvine.namespace
        ctx.helm.run("upgrade", C.CURVINE_CSI_RELEASE, ctx.cluster.curvine.csi_chart, "--repo",
                     curvine.repo_url(ctx), "--version", ctx.cluster.curvine.version, "-n", ns, "--reuse-values",
                     what="helm upgrade curvine-csi")
    finally:
        ctx.close()


def _inline_policy_on_the_ebs_csi_role(sandbox: Any) -> None:
    """A platform team's role may carry inline policies beside the managed one: preflight then reads them too
    (iam:ListRolePolicies, iam:GetRolePolicy). Written as the sandbox admin, before the request log is reset."""
    import boto3

    from kvfleet_sandbox.aws_prereqs import EBS_CSI_ROLE

    iam = boto3.client("iam", endpoint_url=sandbox.aws.url, region_name="us-east-1",
                       aws_access_key_id="sandbox-admin", aws_secret_access_key="sandbox-admin")
    iam.put_role_policy(RoleName=EBS_CSI_ROLE, PolicyName="kvfleet-test-describe", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:DescribeVolumes",
                                                "Resource": "*"}]}))


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory, pg: Any) -> Iterator[Replay]:
    from kvfleet.history.db import get_engine
    from kvfleet.history.repos import HistoryRepos

    pg.ensure_database("rbac_replay")
    history = HistoryRepos.on(get_engine(pg.url("rbac_replay")))
    inv = load_inventory(ROOT / "tests" / "fleets" / "twin.yaml")
    # The patch cluster is replayed with the scale-to-zero strategy: `auto` rolls 2-replica endpoints (no scale
    # subresource), and the scale grant must still be proven used, since scale-to-zero needs it.
    inv = inv.model_copy(update={"clusters": [
        c.model_copy(update={"update_strategy": "scale-to-zero"}) if c.name == PATCH_CLUSTER else c
        for c in inv.clusters]})
    sandbox = start_sandbox(inv, tmp_path_factory.mktemp("rbac-sandbox"), SandboxSettings(time_scale=0.01))
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in sandbox.exports().items():
                mp.setenv(key, value)
            mp.setenv("KVFLEET_POLL_SECONDS", "0.1")
            mp.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)  # boto3 reads AWS_ENDPOINT_URL natively
            _inline_policy_on_the_ebs_csi_role(sandbox)
            for twin in sandbox.twins.values():
                twin.store.reset_request_log()
            sandbox.aws.reset_request_log()
            errors: dict[str, BaseException] = {}

            def run(cluster: str) -> None:
                try:
                    _replay_cluster(sandbox, inv, cluster)
                except BaseException as exc:
                    errors[cluster] = exc

            threads = [threading.Thread(target=run, args=(c,)) for c in (PATCH_CLUSTER, KYVERNO_CLUSTER)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=240)
            if errors:
                raise next(iter(errors.values()))
            _replay_curvine_operations(inv, history)
            kvfleet_user = sandbox.servers[PATCH_CLUSTER].authenticator.identities["sandbox"].name
            records = [r for twin in sandbox.twins.values() for r in list(twin.store.request_log)
                       if r.verb not in ("discovery", "unauthorized") and r.user == kvfleet_user]
            requests = [Request(r.verb, r.group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource,
                                r.namespace, r.name) for r in records]
            decisions = [(a, ok) for server in sandbox.servers.values() for a, ok in list(server.authorizer.log)
                         if a.user.name == kvfleet_user and a.verb in ("escalate", "bind")]
            requests += [Request(a.verb, a.group, a.resource, a.namespace, a.name) for a, ok in decisions if ok]
            denied = [_fmt(Request(r.verb, r.group, r.resource, r.namespace, r.name)) for r in records
                      if not r.allowed]
            denied += [f"{a.verb} {a.resource} {a.name} ({a.namespace or 'cluster scope'})"
                       for a, ok in decisions if not ok and not any(
                           o and b.verb == a.verb and b.name == a.name for b, o in decisions)]
            checks = {(a.verb, a.resource, a.name) for a, ok in decisions if ok}
            hooks = [f"{r.verb} {r.name or ''}".strip() for r in records if (r.group, r.resource) == ("batch", "jobs")]
            aws = {IAM_ACTION_OF.get(f"{e.service}:{e.operation}", f"{e.service}:{e.operation}")
                   for e in list(sandbox.aws.request_log)}
            iam_denied = [f"{d[3]} on {d[4]} ({d[5]}, {d[2]})" for d in sandbox.aws.iam_denials()]
        yield Replay(requests, aws, importlib.util.find_spec("kvfleet.stages.drift") is not None, denied, checks,
                     hooks, sandbox.iam_enforced, iam_denied)
    finally:
        sandbox.stop()


# ---- the checks ---------------------------------------------------------------------------------------------


def _fmt(r: Request) -> str:
    where = f"namespace {r.namespace}" if r.namespace else "cluster scope"
    return f"{r.verb} {r.group or 'core'}/{r.resource}{' ' + r.name if r.name else ''} ({where})"


def test_every_request_kvfleet_and_helm_made_is_allowed_by_k8s_rbac(replay: Replay) -> None:
    grants = load_grants()
    assert replay.requests, "the replay made no Kubernetes request"
    denied = sorted({_fmt(r) for r in replay.requests if not any(g.allows(r) for g in grants)})
    assert denied == [], "k8s/rbac does not allow:\n  " + "\n  ".join(denied)


def test_the_emulator_refused_nothing_kvfleet_asked(replay: Replay) -> None:
    """The sandbox enforces k8s/rbac: a 403 anywhere in the replay (a request, or a Role/ClusterRole/binding write
    that failed the escalation check) fails here, naming it."""
    assert replay.denied == [], "refused by RBAC in the sandbox:\n  " + "\n  ".join(replay.denied)


def test_iam_refused_no_aws_call_kvfleet_made(replay: Replay) -> None:
    """The twin enforces k8s/iam/kvfleet-policy.json on every AWS call (kvfleet_sandbox.aws_iam_enforce): an
    AccessDenied anywhere in the replay fails here, naming the action and resource."""
    assert replay.iam_enforced
    assert replay.iam_denied == [], "refused by IAM in the sandbox:\n  " + "\n  ".join(replay.iam_denied)


def test_kvfleet_wrote_no_rbac_object_and_needed_no_escalate_or_bind(replay: Replay) -> None:
    """The charts' roles come with the bootstrap bundle (k8s/rbac/curvine-rbac.yaml): installing and upgrading both
    charts, kvfleet's identity made no request on an RBAC object and passed no escalation check."""
    assert replay.checks == set()
    assert [_fmt(r) for r in replay.requests if r.group == "rbac.authorization.k8s.io"] == []


def test_the_pre_upgrade_hook_job_ran_as_kvfleet(replay: Replay) -> None:
    """helm created the hook Job, waited for it and deleted it once it succeeded (hook-delete-policy)."""
    assert any(h.startswith(("create", "patch")) for h in replay.hook_jobs), replay.hook_jobs
    assert "delete curvine-pre-upgrade-check" in replay.hook_jobs, replay.hook_jobs


def test_nothing_in_k8s_rbac_goes_unused(replay: Replay) -> None:
    grants = load_grants()
    used_bindings = {g.binding for g in grants for r in replay.requests if g.allows(r)}
    unused_bindings = sorted({g.binding for g in grants} - used_bindings)
    assert unused_bindings == [], f"bindings that allowed no request: {unused_bindings}"
    # Per rule of a role, across its bindings: a role bound in every endpoint namespace is used if any uses it.
    granted, used = set(), set()
    for g in grants:
        for group in g.api_groups:
            for resource in g.resources:
                for verb in g.verbs:
                    element = (g.role, g.rule, group, resource, verb, g.names)
                    granted.add(element)
                    one = dataclasses.replace(g, api_groups=(group,), resources=(resource,), verbs=(verb,))
                    if (g.role, group, resource, verb) in UNREACHED or any(one.allows(r) for r in replay.requests):
                        used.add(element)
    unused = [f"{role} rule {rule}: {verb} {group or 'core'}/{resource}" + (f" {list(names)}" if names else "")
              for role, rule, group, resource, verb, names in granted - used]
    assert sorted(set(unused)) == [], "granted but never used by kvfleet:\n  " + "\n  ".join(sorted(set(unused)))


def test_unreached_grants_name_code_that_exists() -> None:
    for (_role, _group, _resource, _verb), why in UNREACHED.items():
        module, function = why.split(" ", 1)[0], why.split(" ", 2)[1].rstrip(":")
        assert function in (ROOT / "plugins" / "kvfleet" / module).read_text(), why


def test_secrets_are_granted_only_in_the_curvine_namespace() -> None:
    for g in load_grants():
        if "secrets" in g.resources or "*" in g.resources:
            assert g.scope == C.CURVINE_NAMESPACE, f"{g.binding} grants secrets outside {C.CURVINE_NAMESPACE}"


def test_iam_policy_lists_exactly_the_aws_actions_kvfleet_called(replay: Replay) -> None:
    policy = json.loads(IAM_POLICY.read_text())
    assert policy["Version"] == "2012-10-17"
    actions: set[str] = set()
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow" and "NotAction" not in st and st["Resource"]
        listed = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        assert not any("*" in a for a in listed), f"wildcard action in {st['Sid']}"
        actions |= set(listed)
    assert actions == replay.aws_actions | TOKEN_ACTIONS
    assert {"sagemaker:DescribeCluster", "sagemaker:UpdateCluster", "eks:DescribeCluster",
            "eks:CreateAddon", "eks:UpdateAddon"} <= replay.aws_actions
    if replay.drift_ran:
        assert "eks:ListAddons" in replay.aws_actions
    # kvfleet preflight: the IAM and S3 reads it makes.
    assert {"iam:GetRole", "iam:ListAttachedRolePolicies", "iam:GetPolicy", "iam:GetPolicyVersion",
            "iam:ListRolePolicies", "iam:GetRolePolicy", "s3:ListBucket"} <= replay.aws_actions
