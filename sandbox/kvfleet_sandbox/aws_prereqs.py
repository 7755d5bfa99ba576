"""The AWS prerequisites a platform team has in place before kvfleet's first rollout, created in the twin.

Called from the sandbox's start-up (``kvfleet_sandbox.runtime``, one line after the clusters are registered) and
from tests that need a cluster that passes ``kvfleet preflight``. Per inventory cluster it creates what the
source documents ask for before stage 3 (docs/reference/hyperpod.md#prerequisites) and what the operator add-on's
configuration names (docs/reference/hyperpod.md#add-on-configuration-values):

- the EKS add-ons ``vpc-cni`` and ``aws-ebs-csi-driver``, ACTIVE, at the versions the twin's kube-system
  workloads run (``aws-node`` v1.19.2, ``ebs-csi-controller`` v1.41.0), the EBS CSI one with its IRSA role;
- IAM role ``aws-ebs-csi-dri-role`` (the seeds' name), trusting the cluster's OIDC provider for
  ``kube-system:ebs-csi-controller-sa``, with the AWS managed ``AmazonEBSCSIDriverPolicy`` attached
  (it grants ``ec2:AttachVolume``);
- the operator's execution role (the add-on configuration's ``executionRoleArn``), trusting
  ``sagemaker.amazonaws.com`` and the cluster's OIDC provider for the operator's service account, as the AWS
  troubleshooting page "IAM trust relationship issue" (sagemaker-hyperpod-model-deployment-ts-trust) shows;
- the TLS certificate bucket (``tlsCertificateS3Bucket``) in the cluster's region.

IAM and S3 are created through boto3 against the emulator, i.e. through moto, exactly as a platform team's
scripts would call AWS. Every step is idempotent: calling it again (or after the runtime did) changes nothing.
``omit`` leaves named items out, so a test can build a cluster that fails preflight on exactly that item.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import ClientError

from kvfleet.fleet.constants import OPERATOR_ADDON, OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE

if TYPE_CHECKING:
    from kvfleet.fleet.inventory import Cluster
    from kvfleet_sandbox.aws import AwsEmulator


EBS_CSI_ROLE = "aws-ebs-csi-dri-role"
EBS_CSI_POLICY_ARN = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
EBS_CSI_SERVICE_ACCOUNT = "system:serviceaccount:kube-system:ebs-csi-controller-sa"
# The versions the twin's kube-system workloads run (runtime._seed_eks_defaults: aws-node and ebs-csi-controller).
VPC_CNI_VERSION = "v1.19.2-eksbuild.1"
EBS_CSI_VERSION = "v1.41.0-eksbuild.1"
# What ``omit`` may name.
ITEMS = frozenset({"vpc-cni", "aws-ebs-csi-driver", "ebs_csi_role", "ebs_csi_policy", "execution_role",
                   "tls_bucket"})


def _client(service: str, aws: AwsEmulator, region: str, account: str | None = None) -> Any:
    """A boto3 client of the sandbox's administrator in ``account`` (None: the base account)."""
    key = aws.admin_key(account)
    return boto3.client(service, endpoint_url=aws.url, region_name=region,
                        aws_access_key_id=key, aws_secret_access_key=key)


def account_of(cluster: Cluster) -> str | None:
    """The 12-digit account a cluster is in, or None for the base identity's own (a cluster that names no account,
    whose ``ClusterRef.account`` is ``default``)."""
    return cluster.ref.account if cluster.account else None


def _oidc(aws: AwsEmulator, eks_name: str, region: str, account: str | None) -> tuple[str, str]:
    """(provider ARN, issuer host/path) of an EKS cluster, from the emulator's own DescribeCluster."""
    eks = _client("eks", aws, region, account)
    issuer = eks.describe_cluster(name=eks_name)["cluster"]["identity"]["oidc"]["issuer"]
    host = issuer.removeprefix("https://")
    return f"arn:aws:iam::{account or aws.account_id}:oidc-provider/{host}", host


def web_identity_statement(provider_arn: str, host: str, subject: str) -> dict[str, Any]:
    return {"Effect": "Allow", "Principal": {"Federated": provider_arn},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {f"{host}:sub": subject, f"{host}:aud": "sts.amazonaws.com"}}}


def _ensure_role(iam: Any, name: str, statements: list[dict[str, Any]]) -> None:
    document = json.dumps({"Version": "2012-10-17", "Statement": statements})
    try:
        iam.create_role(RoleName=name, AssumeRolePolicyDocument=document)
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "EntityAlreadyExists":
            raise
        # Another cluster's statements may already be there: keep them, add ours.
        have = iam.get_role(RoleName=name)["Role"]["AssumeRolePolicyDocument"]
        merged = list(have.get("Statement", [])) + [s for s in statements if s not in have.get("Statement", [])]
        iam.update_assume_role_policy(RoleName=name, PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": merged}))


def _ensure_bucket(s3: Any, bucket: str, region: str) -> None:
    kwargs: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        s3.create_bucket(**kwargs)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


def operator_settings(cluster: Cluster) -> tuple[str | None, str | None]:
    """(executionRoleArn, tlsCertificateS3Bucket) from the operator add-on's configuration in the inventory."""
    config = dict(cluster.addon(OPERATOR_ADDON).configuration or {})
    role, bucket = config.get("executionRoleArn"), config.get("tlsCertificateS3Bucket")
    return (role if isinstance(role, str) and role else None, bucket if isinstance(bucket, str) and bucket else None)


def _eks_name(aws: AwsEmulator, cluster: str, account: str | None) -> str:
    described = aws.hyperpod_cluster(cluster, account=account)
    if described is None:
        raise KeyError(f"no HyperPod cluster {cluster!r} in the AWS emulator; seed the fleet first")
    return str(described["Orchestrator"]["Eks"]["ClusterArn"]).rsplit("/", 1)[-1]


def seed_prerequisites(aws: AwsEmulator, clusters: Iterable[Cluster], *, omit: Collection[str] = ()) -> None:
    """Create, per cluster, the prerequisites listed in the module docstring (minus ``omit``)."""
    unknown = set(omit) - ITEMS
    if unknown:
        raise ValueError(f"omit names unknown items {sorted(unknown)}; known: {sorted(ITEMS)}")
    for cluster in clusters:
        account = account_of(cluster)
        eks_name = _eks_name(aws, cluster.name, account)
        region = cluster.region
        iam = _client("iam", aws, region, account)
        provider, host = _oidc(aws, eks_name, region, account)
        role_arn = f"arn:aws:iam::{account or aws.account_id}:role/{EBS_CSI_ROLE}"
        if "ebs_csi_role" not in omit:
            _ensure_role(iam, EBS_CSI_ROLE, [web_identity_statement(provider, host, EBS_CSI_SERVICE_ACCOUNT)])
            if "ebs_csi_policy" not in omit:
                iam.attach_role_policy(RoleName=EBS_CSI_ROLE, PolicyArn=EBS_CSI_POLICY_ARN)
        for addon, version, sa_role in (("vpc-cni", VPC_CNI_VERSION, None),
                                        ("aws-ebs-csi-driver", EBS_CSI_VERSION, role_arn)):
            if addon not in omit and aws.addon_status(eks_name, addon, account=account) is None:
                aws.add_addon(eks_name, addon, version=version, service_account_role_arn=sa_role, account=account)
        execution_role, bucket = operator_settings(cluster)
        if execution_role and "execution_role" not in omit:
            operator_sa = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_DEPLOYMENT}"
            _ensure_role(iam, execution_role.rsplit("/", 1)[-1], [
                {"Effect": "Allow", "Principal": {"Service": ["sagemaker.amazonaws.com"]},
                 "Action": "sts:AssumeRole"},
                web_identity_statement(provider, host, operator_sa),
            ])
        if bucket and "tls_bucket" not in omit:
            _ensure_bucket(_client("s3", aws, region, account), bucket, region)
