"""Preflight: the prerequisites the source documents name, checked on one cluster before anything changes.

Called by ``kvfleet preflight [--fleet] [--cluster] [--json]`` (:func:`cmd_preflight`) and by the preflight task
at the head of ``kvfleet_rollout`` (:func:`refuse_if_missing`). Read-only: DescribeCluster, DescribeAddon,
IAM Get/List, S3 HeadBucket, Kubernetes get/list — it never creates or updates anything.

What is checked (docs/reference/hyperpod.md#prerequisites; tests/conformance/facts/preflight_minimums.yaml), each
missing item with its exact fix:

1. the EBS CSI driver add-on ``aws-ebs-csi-driver`` is installed and ACTIVE, with an IRSA role;
2. that role exists (the sources name ``aws-ebs-csi-dri-role``) and its policies allow ``ec2:AttachVolume``
   (the AWS managed ``AmazonEBSCSIDriverPolicy`` does);
3. the ``vpc-cni`` and ``aws-ebs-csi-driver`` add-on versions meet :data:`MINIMUM_VERSIONS`
   (sources in ``tests/conformance/facts/preflight_minimums.yaml``);
4. the operator's ``executionRoleArn`` exists and trusts ``sagemaker.amazonaws.com`` and the cluster's OIDC
   provider for the operator's service account (AWS docs, sagemaker-hyperpod-model-deployment-ts-trust);
5. the TLS certificate bucket (``tlsCertificateS3Bucket``) exists;
6. the EBS StorageClass (the inventory's ``ebs_storage_class``) exists;
7. at least two GPU nodes (a single node cannot show cross-node reuse — the sources);
8. on a kyverno-mode cluster, Kyverno and its admission webhook (``stages.kyverno``): absent, it is a warning when
   stage 2 may install it (the fix is the same command, to run beforehand) and an error when it may not;
9. the kvfleet-bootstrap bundle was applied (``kvfleet.fleet.bootstrap_bundle``; k8s/rbac/README.md, Bootstrap):
   the Curvine CSI ServiceAccounts it alone creates, every namespace of the cluster's endpoints, and on a
   kyverno-mode cluster whose Kyverno serves its CRD, kvfleet's ClusterPolicy. kvfleet's
   identity may not create them, so without it the rollout is refused before any change, with the command.

Where the values come from: ``executionRoleArn`` and ``tlsCertificateS3Bucket`` from the inventory's operator
add-on ``configuration`` (what stage 2 sends as configurationValues), unless the inventory carries dedicated
``execution_role_arn`` / ``tls_bucket`` fields (read with getattr; not modelled yet). The EBS CSI role from the
add-on's ``serviceAccountRoleArn``, else the inventory's ``ebs_csi_role`` (getattr), else the sources' name.

A check that cannot be made (e.g. AccessDenied) is itself a problem, naming the call and the permission it
needs: preflight never passes on what it could not see.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import HTTPClientError
from kubernetes.client.exceptions import ApiException

from kvfleet.clients.kube import get_or_none
from kvfleet.errors import KvfleetError, PermanentError, TemporaryError
from kvfleet.fleet import constants as C
from kvfleet.stages.base import StageContext

if TYPE_CHECKING:
    from kvfleet.clients.identity import Identity
    from kvfleet.fleet.inventory import Cluster, Inventory

STAGE = "preflight"
EBS_CSI_ADDON = "aws-ebs-csi-driver"
VPC_CNI_ADDON = "vpc-cni"
EBS_CSI_ROLE = "aws-ebs-csi-dri-role"  # the name the sources use
EBS_CSI_POLICY_ARN = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
EBS_CSI_SERVICE_ACCOUNT = "ebs-csi-controller-sa"
EBS_PROVISIONER = "ebs.csi.aws.com"
EXECUTION_ROLE_SERVICE = "sagemaker.amazonaws.com"
MIN_GPU_NODES = 2
GPU_RESOURCE = "nvidia.com/gpu"
# (major, minor, patch) each add-on must reach; the sources are in tests/conformance/facts/preflight_minimums.yaml.
MINIMUM_VERSIONS: dict[str, tuple[int, int, int]] = {
    VPC_CNI_ADDON: (1, 18, 3),  # AWS docs, sagemaker-hyperpod-eks-prerequisites: "1.18.3 or later"
    EBS_CSI_ADDON: (1, 41, 0),  # no source names one: kvfleet's conservative choice (see the fact sheet)
}
ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::(\d{12}):role/(?:[\w+=,.@-]+/)*([\w+=,.@-]{1,64})$")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class Problem:
    """One missing prerequisite: what is missing (``what``), on which cluster, and the exact fix."""

    cluster: str
    check: str  # ebs_csi_addon | ebs_csi_role | addon_version | execution_role | tls_bucket | storage_class | ...
    what: str
    fix: str
    severity: str = "error"  # "warning" does not refuse the rollout

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _version(text: str | None) -> tuple[int, int, int] | None:
    found = _VERSION.match(text or "")
    return (int(found.group(1)), int(found.group(2)), int(found.group(3))) if found else None


def _show(version: tuple[int, int, int]) -> str:
    return "v" + ".".join(map(str, version))


class _Checker:
    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.cl = ctx.cluster
        self.problems: list[Problem] = []
        self.eks = ""
        self.region = ctx.cluster.region
        self.oidc_provider: str | None = None
        self.account: str | None = None

    @property
    def aws(self) -> Any:
        if "aws_prereqs" not in self.ctx.memo:
            from kvfleet.clients.aws_prereqs import AwsPrereqsClient

            self.ctx.memo["aws_prereqs"] = AwsPrereqsClient(self.region, self.ctx.identity)
        return self.ctx.memo["aws_prereqs"]

    def add(self, check: str, what: str, fix: str, severity: str = "error") -> None:
        self.problems.append(Problem(self.cl.name, check, what, fix, severity))

    def guarded(self, check: str, what: str, permission: str, fn: Callable[[], None]) -> None:
        """Run one check; an error that stops it becomes a problem (never a pass, never a traceback). A transient
        failure (5xx, 429, 409, a timeout or a dropped connection) is raised as ``TemporaryError`` instead: the
        task is retried, and the cluster is not refused for a prerequisite that may well be there."""
        try:
            fn()
        except TemporaryError:
            raise
        except (TimeoutError, ConnectionError, BotoConnectionError, HTTPClientError) as exc:  # before OSError
            raise TemporaryError(f"could not check {what} on {self.cl.name}: {type(exc).__name__}: "
                                 f"{str(exc)[:200]}") from exc
        except ApiException as exc:
            if exc.status in (409, 429) or (exc.status or 0) >= 500:
                raise TemporaryError(f"could not check {what} on {self.cl.name}: {exc.status} {exc.reason}") from exc
            self.add(check, f"could not check {what}: {exc.status} {exc.reason}"[:330],
                     f"grant kvfleet's identity {permission} and run `kvfleet preflight --cluster {self.cl.name}` "
                     "again")
        except (KvfleetError, OSError) as exc:
            self.add(check, f"could not check {what}: {str(exc)[:300]}",
                     f"grant kvfleet's identity {permission} and run `kvfleet preflight --cluster {self.cl.name}` "
                     "again")

    # --- the checks ---------------------------------------------------------------------------------------
    def cluster(self) -> None:
        hp = self.ctx.hyperpod.require_cluster(self.cl.name)
        self.eks = hp.eks_cluster_name
        eks = self.ctx.hyperpod.describe_eks(self.eks)
        issuer = (((eks.get("identity") or {}).get("oidc") or {}).get("issuer") or "").removeprefix("https://")
        self.account = str(eks.get("arn", "")).split(":")[4] if eks.get("arn") else None
        if issuer and self.account:
            self.oidc_provider = f"arn:aws:iam::{self.account}:oidc-provider/{issuer}"

    def addons(self) -> None:
        ebs = self.ctx.hyperpod.describe_addon(self.eks, EBS_CSI_ADDON)
        role_name = self._ebs_role_name(ebs)
        role_arn = f"arn:aws:iam::{self.account or '<account-id>'}:role/{role_name}"
        if ebs is None:
            self.add("ebs_csi_addon", f"EKS add-on {EBS_CSI_ADDON} is not installed on {self.eks} (the Curvine "
                     "master's journal lives on EBS)",
                     f"aws eks create-addon --cluster-name {self.eks} --addon-name {EBS_CSI_ADDON} "
                     f"--service-account-role-arn {role_arn} --region {self.region}")
        else:
            if ebs.get("status") != "ACTIVE":
                self.add("ebs_csi_addon", f"EKS add-on {EBS_CSI_ADDON} is {ebs.get('status')}, not ACTIVE",
                         f"aws eks describe-addon --cluster-name {self.eks} --addon-name {EBS_CSI_ADDON} "
                         f"--region {self.region} --query addon.health, fix the issues it lists, then aws eks "
                         f"update-addon --cluster-name {self.eks} --addon-name {EBS_CSI_ADDON} --resolve-conflicts "
                         f"PRESERVE --region {self.region}")
            if not ebs.get("serviceAccountRoleArn") and not ebs.get("podIdentityAssociations"):
                self.add("ebs_csi_addon", f"EKS add-on {EBS_CSI_ADDON} has no IAM role (no serviceAccountRoleArn "
                         "and no pod identity association), so it cannot attach volumes",
                         f"aws eks update-addon --cluster-name {self.eks} --addon-name {EBS_CSI_ADDON} "
                         f"--service-account-role-arn {role_arn} --resolve-conflicts PRESERVE --region {self.region}")
            self._minimum(EBS_CSI_ADDON, ebs)
        cni = self.ctx.hyperpod.describe_addon(self.eks, VPC_CNI_ADDON)
        if cni is None:
            self.add("addon_version", f"EKS add-on {VPC_CNI_ADDON} is not installed on {self.eks} (HyperPod supports "
                     f"only the Amazon VPC CNI, {_show(MINIMUM_VERSIONS[VPC_CNI_ADDON])} or later)",
                     f"aws eks create-addon --cluster-name {self.eks} --addon-name {VPC_CNI_ADDON} "
                     f"--resolve-conflicts OVERWRITE --region {self.region}")
        else:
            self._minimum(VPC_CNI_ADDON, cni)
        self.guarded("ebs_csi_role", f"IAM role {role_name}", "iam:GetRole, iam:ListAttachedRolePolicies, "
                     "iam:GetPolicy, iam:GetPolicyVersion, iam:ListRolePolicies, iam:GetRolePolicy",
                     lambda: self._ebs_role(role_name))

    def _ebs_role_name(self, ebs: dict[str, Any] | None) -> str:
        arn = (ebs or {}).get("serviceAccountRoleArn")
        if arn:
            return str(arn).rsplit("/", 1)[-1]
        return str(getattr(self.cl, "ebs_csi_role", None) or EBS_CSI_ROLE)

    def _minimum(self, name: str, addon: dict[str, Any]) -> None:
        minimum = MINIMUM_VERSIONS[name]
        live = addon.get("addonVersion")
        parsed = _version(live)
        if parsed is None or parsed < minimum:
            self.add("addon_version", f"EKS add-on {name} is at {live or 'an unknown version'}; kvfleet needs "
                     f"{_show(minimum)} or later",
                     f"aws eks describe-addon-versions --addon-name {name} --kubernetes-version <cluster version> "
                     f"--query 'addons[].addonVersions[].addonVersion' --region {self.region}, pick one at or above "
                     f"{_show(minimum)}, then aws eks update-addon --cluster-name {self.eks} --addon-name {name} "
                     f"--addon-version <that version> --resolve-conflicts PRESERVE --region {self.region}")

    def _ebs_role(self, role_name: str) -> None:
        role = self.aws.get_role(role_name)
        if role is None:
            self.add("ebs_csi_role", f"IAM role {role_name} (the EBS CSI driver's) does not exist",
                     f"eksctl create iamserviceaccount --name {EBS_CSI_SERVICE_ACCOUNT} --namespace kube-system "
                     f"--cluster {self.eks} --region {self.region} --role-name {role_name} --role-only "
                     f"--attach-policy-arn {EBS_CSI_POLICY_ARN} --approve")
            return
        account = self.account or "123456789012"
        samples = [f"arn:aws:ec2:{self.region}:{account}:volume/vol-0", f"arn:aws:ec2:{self.region}:{account}:"
                   "instance/i-0"]
        allowed, _ = self.aws.role_allows(role_name, "ec2:AttachVolume", samples)
        if not allowed:
            self.add("ebs_csi_role", f"IAM role {role_name} may not attach EBS volumes (no policy allows "
                     "ec2:AttachVolume on the cluster's volumes and instances)",
                     f"aws iam attach-role-policy --role-name {role_name} --policy-arn {EBS_CSI_POLICY_ARN}")

    def operator_settings(self) -> tuple[Any, Any]:
        config = dict(self.cl.addon(C.OPERATOR_ADDON).configuration or {})
        role = getattr(self.cl, "execution_role_arn", None) or config.get("executionRoleArn")
        bucket = getattr(self.cl, "tls_bucket", None) or config.get("tlsCertificateS3Bucket")
        return role, bucket

    def execution_role(self) -> None:
        arn, _ = self.operator_settings()
        where = f"clusters.{self.cl.name}.addons.{C.OPERATOR_ADDON}.configuration.executionRoleArn"
        if not arn:
            self.add("execution_role", f"no executionRoleArn for the Inference Operator ({where} is not set)",
                     f"set {where} to the ARN of the operator's execution role (arn:aws:iam::<account>:role/<name>)")
            return
        found = ROLE_ARN.match(str(arn))
        if found is None:
            self.add("execution_role", f"{where}: {str(arn)[:200]!r} is not an IAM role ARN",
                     f"set {where} to arn:aws:iam::<12-digit account>:role/<name>")
            return
        name = found.group(2)
        trust = self._execution_trust()
        role = self.aws.get_role(name)
        if role is None:
            self.add("execution_role", f"IAM role {name} ({where}) does not exist",
                     f"aws iam create-role --role-name {name} --assume-role-policy-document "
                     f"{shlex.quote(json.dumps(trust))}, then attach the operator's permissions (AWS docs: "
                     "sagemaker-hyperpod-model-deployment-setup)")
            return
        missing = []
        if not role.trusts_service(EXECUTION_ROLE_SERVICE):
            missing.append(f"the service principal {EXECUTION_ROLE_SERVICE}")
        subject = f"system:serviceaccount:{C.OPERATOR_NAMESPACE}:{C.OPERATOR_DEPLOYMENT}"
        if self.oidc_provider and not role.trusts_web_identity(self.oidc_provider, subject):
            missing.append(f"the cluster's OIDC provider for {subject}")
        if missing:
            self.add("execution_role", f"IAM role {name} does not trust {' nor '.join(missing)}",
                     f"aws iam update-assume-role-policy --role-name {name} --policy-document "
                     f"{shlex.quote(json.dumps(trust))}")

    def _execution_trust(self) -> dict[str, Any]:
        """The trust policy of the AWS troubleshooting page (sagemaker-hyperpod-model-deployment-ts-trust)."""
        stmts: list[dict[str, Any]] = []
        if self.oidc_provider:
            host = self.oidc_provider.partition(":oidc-provider/")[2]
            stmts.append({"Effect": "Allow", "Principal": {"Federated": self.oidc_provider},
                          "Action": "sts:AssumeRoleWithWebIdentity",
                          "Condition": {"StringLike": {
                              f"{host}:sub": f"system:serviceaccount:{C.OPERATOR_NAMESPACE}:{C.OPERATOR_DEPLOYMENT}",
                              f"{host}:aud": "sts.amazonaws.com"}}})
        stmts.append({"Effect": "Allow", "Principal": {"Service": [EXECUTION_ROLE_SERVICE]},
                      "Action": "sts:AssumeRole"})
        return {"Version": "2012-10-17", "Statement": stmts}

    def tls_bucket(self) -> None:
        _, bucket = self.operator_settings()
        where = f"clusters.{self.cl.name}.addons.{C.OPERATOR_ADDON}.configuration.tlsCertificateS3Bucket"
        if not bucket:
            self.add("tls_bucket", f"no TLS certificate bucket for the Inference Operator ({where} is not set)",
                     f"set {where} to a bucket named hyperpod-tls-<suffix> in {self.region}")
            return
        if not self.aws.bucket_exists(str(bucket)):
            location = "" if self.region == "us-east-1" else \
                f" --create-bucket-configuration LocationConstraint={self.region}"
            self.add("tls_bucket", f"S3 bucket {bucket} (the operator's TLS certificate bucket, {where}) does not "
                     "exist", f"aws s3api create-bucket --bucket {bucket} --region {self.region}{location}")
        if not str(bucket).startswith("hyperpod-tls-"):
            self.add("tls_bucket", f"TLS bucket {bucket} does not start with hyperpod-tls-: the operator's default "
                     "IAM policy covers only hyperpod-tls-* buckets (AWS setup doc)",
                     f"rename it to hyperpod-tls-<suffix>, or grant the execution role s3:PutObject/s3:GetObject "
                     f"on arn:aws:s3:::{bucket}/*", severity="warning")

    def storage_class(self) -> None:
        name = self.cl.ebs_storage_class
        sc = get_or_none(self.ctx.kube.storage.read_storage_class, name)
        manifest = (f"kubectl apply -f - <<'EOF'\napiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n"
                    f"  name: {name}\nprovisioner: {EBS_PROVISIONER}\nparameters:\n  type: gp3\n  fsType: ext4\n"
                    "volumeBindingMode: WaitForFirstConsumer\nallowVolumeExpansion: true\nEOF")
        if sc is None:
            self.add("storage_class", f"StorageClass {name} (ebs_storage_class; the Curvine master's volumes) does "
                     "not exist", manifest)
        elif getattr(sc, "provisioner", None) != EBS_PROVISIONER:
            self.add("storage_class", f"StorageClass {name} uses provisioner {getattr(sc, 'provisioner', None)}, "
                     f"not {EBS_PROVISIONER}", f"set clusters.{self.cl.name}.ebs_storage_class to an EBS class, or "
                     f"kubectl delete storageclass {name} and create it:\n{manifest}")

    def kyverno(self) -> None:
        from kvfleet.stages import kyverno

        if self.cl.l2_injection != "kyverno":
            return
        state = kyverno.observe(self.ctx)
        if kyverno.is_ready(state):
            return
        if state["deployment"] is not None:
            self.add("kyverno", f"Kyverno is installed but not serving yet ({kyverno.describe(state)})",
                     f"kubectl get deployment -n {state['deployment'].split('/')[0]} -l "
                     f"{kyverno.ADMISSION_SELECTOR}; kubectl get mutatingwebhookconfiguration "
                     f"{kyverno.RESOURCE_WEBHOOK}", severity="warning")
            return
        command = kyverno.install_command(self.ctx.settings)
        values = f"cat > kyverno-values.yaml <<'EOF'\n{kyverno.values_yaml()}EOF\n{command}"
        if kyverno.install_allowed(self.ctx):
            self.add("kyverno", f"Kyverno is not installed (kyverno mode); stage 2 installs chart {kyverno.CHART} "
                     f"{kyverno.CHART_VERSION}, which needs the install grant of k8s/rbac/README.md (Kyverno)",
                     f"let stage 2 install it, or install it now:\n{values}", severity="warning")
        else:
            self.add("kyverno", f"Kyverno is not installed (kyverno mode) and kvfleet may not install it "
                     f"({kyverno.INSTALL_ENV}=refuse)", values)

    def bootstrap(self) -> None:
        from kvfleet.fleet import bootstrap_bundle as bb

        missing: list[str] = []
        ns = self.cl.curvine.namespace
        for account in (bb.CSI_NODE, bb.CSI_CONTROLLER):
            try:
                self.ctx.kube.core.read_namespaced_service_account(account, ns)
            except ApiException as exc:
                if exc.status == 404:
                    missing.append(f"ServiceAccount {ns}/{account}")
                    continue
                if exc.status != 403:
                    raise
                # kvfleet's RoleBinding in the Curvine namespace is part of the bundle too
                missing.append(f"kvfleet's RoleBinding in namespace {ns} (403 reading ServiceAccount {account})")
                break
        for name in sorted({e.namespace for e in self.ctx.inventory.endpoints if e.on(self.cl)}):
            if get_or_none(self.ctx.kube.core.read_namespace, name) is None:
                missing.append(f"Namespace {name}")
        missing += self._bootstrap_policy()
        if missing:
            fleet = self.ctx.inventory.source or "<your fleet.yaml>"
            self.add("bootstrap", f"the kvfleet-bootstrap bundle is not applied on {self.cl.name} (missing: "
                     f"{', '.join(missing)}); kvfleet's own identity may not create these (k8s/rbac/README.md, "
                     "Bootstrap)", f"as a cluster admin: {bb.apply_command(fleet, self.cl.name)}")

    def _bootstrap_policy(self) -> list[str]:
        """On a kyverno-mode cluster whose Kyverno serves its CRD (the kyverno check names a missing Kyverno),
        kvfleet's ClusterPolicy, which only the bundle creates."""
        from kvfleet.fleet.endpoint_spec import kyverno_policy
        from kvfleet.stages import kyverno

        if self.cl.l2_injection != "kyverno" or get_or_none(
                self.ctx.kube.apiext.read_custom_resource_definition, kyverno.POLICY_CRD) is None:
            return []
        policy = kyverno_policy(self.ctx.inventory.settings)["metadata"]["name"]
        found = get_or_none(self.ctx.kube.custom.get_cluster_custom_object, "kyverno.io", "v1", "clusterpolicies",
                            policy)
        return [] if found is not None else [f"ClusterPolicy {policy}"]

    def gpu_nodes(self) -> None:
        nodes = self.ctx.kube.core.list_node().items
        gpus = [n for n in nodes if int(((n.status.allocatable or {}) if n.status else {}).get(GPU_RESOURCE, 0)
                                        or 0) > 0]
        if len(gpus) < MIN_GPU_NODES:
            self.add("gpu_nodes", f"{len(gpus)} GPU node(s) in the cluster; cross-node reuse of the L2 cache needs "
                     f"at least {MIN_GPU_NODES}",
                     f"aws sagemaker update-cluster --cluster-name {self.cl.name} --instance-groups "
                     "InstanceGroupName=<gpu group>,InstanceType=<type>,InstanceCount=2,LifeCycleConfig=<as "
                     f"today>,ExecutionRole=<as today> --region {self.region} (keep the group's other settings)")


def check(ctx: StageContext) -> list[Problem]:
    """Every missing prerequisite of ``ctx.cluster``, with its fix (empty: ready). Changes nothing."""
    c = _Checker(ctx)
    try:
        c.cluster()
    except TemporaryError:
        raise  # retried: a transient failure is not a missing prerequisite
    except KvfleetError as exc:
        c.add("cluster", f"could not describe HyperPod cluster {ctx.cluster.name}: {str(exc)[:300]}",
              "check the inventory's cluster name and region and grant sagemaker:DescribeCluster and "
              "eks:DescribeCluster")
        return c.problems
    c.guarded("ebs_csi_addon", "the EKS add-ons", "eks:DescribeAddon", c.addons)
    c.guarded("execution_role", "the operator's execution role", "iam:GetRole", c.execution_role)
    c.guarded("tls_bucket", "the TLS certificate bucket", "s3:ListBucket on the bucket (HeadBucket)", c.tls_bucket)
    c.guarded("bootstrap", "the kvfleet-bootstrap bundle", "get on namespaces and on the Curvine CSI "
              "ServiceAccounts (k8s/rbac)", c.bootstrap)
    c.guarded("storage_class", "the EBS StorageClass", "get on storageclasses", c.storage_class)
    c.guarded("gpu_nodes", "the GPU nodes", "list on nodes", c.gpu_nodes)
    c.guarded("kyverno", "Kyverno", "k8s/rbac/kyverno-mode.yaml (get on Kyverno's CRD and webhook configuration)",
              c.kyverno)
    return c.problems


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def render(problems: list[Problem], clusters: list[str] | None = None) -> str:
    """Text for a terminal: per problem what is missing and the fix, then a verdict line."""
    lines: list[str] = []
    for p in problems:
        label = "MISSING" if p.severity == "error" else "WARNING"
        lines.append(f"[{p.cluster}] {label} ({p.check}): {p.what}")
        lines.extend(f"    fix: {line}" if i == 0 else f"         {line}" for i, line in enumerate(p.fix.splitlines()))
    bad = sorted({p.cluster for p in errors(problems)})
    checked = clusters if clusters is not None else sorted({p.cluster for p in problems})
    ready = [c for c in checked if c not in bad]
    if bad:
        lines.append(f"preflight: {len(errors(problems))} missing prerequisite(s) on {', '.join(bad)}; "
                     "a rollout there is refused until they are fixed")
    if ready:
        lines.append(f"preflight: {', '.join(ready)} ready")
    return "\n".join(lines)


def exit_code(problems: list[Problem]) -> int:
    """0: every checked cluster is ready (warnings allowed); 1: something is missing."""
    return 1 if errors(problems) else 0


def record(ctx: StageContext, problems: list[Problem]) -> None:
    ctx.record("preflight", STAGE, "refused" if errors(problems) else "unchanged",
               problems=[p.as_dict() for p in problems])


def refuse_if_missing(ctx: StageContext) -> list[Problem]:
    """The rollout's first task: check, record, and refuse (PermanentError listing every fix) when anything
    is missing; returns the warnings otherwise."""
    problems = check(ctx)
    record(ctx, problems)
    if errors(problems):
        raise PermanentError(render(problems, [ctx.cluster.name]))
    for p in problems:
        ctx.say(f"preflight warning: {p.what} (fix: {p.fix})")
    return problems


def cmd_preflight(args: Any, out: Callable[[str], None] = print,
                  identity: Callable[[Inventory, Cluster], Identity] | None = None) -> int:
    """``kvfleet preflight [--fleet F] [--cluster C ...] [--json] [--aws-conn-id X | --profile P]``; exit 0 ready,
    1 something missing (bad input: the inventory loader's own errors, exit 2 in the CLI's dispatcher).
    ``identity``: who to act as on each cluster (else ``args.aws_conn_id`` and the cluster's account role)."""
    from kvfleet.fleet.inventory import load_inventory

    clusters = getattr(args, "cluster", None)
    if isinstance(clusters, str):
        clusters = [clusters]
    inv = load_inventory(args.fleet).select(clusters=clusters)
    problems: list[Problem] = []
    for cl in inv.clusters:
        ctx = StageContext(inventory=inv, cluster=cl, aws_conn_id=getattr(args, "aws_conn_id", None),
                           identity=identity(inv, cl) if identity is not None else None, progress=lambda msg: None)
        try:
            problems.extend(check(ctx))
        finally:
            ctx.close()
    names = [cl.name for cl in inv.clusters]
    if getattr(args, "json", False):
        out(json.dumps({"ready": exit_code(problems) == 0, "clusters": names,
                        "problems": [p.as_dict() for p in problems]}, indent=2, sort_keys=True))
    else:
        out(render(problems, names))
    return exit_code(problems)
