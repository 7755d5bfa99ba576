"""`kvfleet preflight` against the twin: each prerequisite the sources name, missing, is listed with its exact
fix; a fully prepared cluster gives no problem; and preflight changes nothing (AWS or Kubernetes)."""

from __future__ import annotations

import argparse
import json

import pytest
from preflightkit import CLUSTER, aws_client

from kvfleet.stages import preflight
from kvfleet_sandbox.aws_prereqs import EBS_CSI_POLICY_ARN, EBS_CSI_ROLE

pytestmark = pytest.mark.integration

EXEC_ROLE = "hyperpod-inference-exec"
TLS_BUCKET = "hyperpod-tls-ml-stage-usw2"
# Every call whose name starts with one of these changes something.
MUTATING_PREFIXES = ("Create", "Update", "Delete", "Put", "Attach", "Detach", "Tag", "Untag", "Publish")


def by_check(problems: list[preflight.Problem]) -> dict[str, list[preflight.Problem]]:
    found: dict[str, list[preflight.Problem]] = {}
    for p in problems:
        found.setdefault(p.check, []).append(p)
    return found


def test_prepared_cluster_has_no_problem_and_preflight_changes_nothing(prepared, make_ctx) -> None:
    for twin in prepared.twins.values():
        twin.store.reset_request_log()
    prepared.aws.reset_request_log()

    for cluster in ("ml-stage-usw2", "ml-prod-use1"):
        assert preflight.check(make_ctx(cluster)) == [], cluster

    aws_calls = [f"{e.service}:{e.operation}" for e in prepared.aws.request_log]
    assert "iam:GetRole" in aws_calls and "s3:HeadBucket" in aws_calls and "eks:DescribeAddon" in aws_calls
    assert [c for c in aws_calls if c.split(":")[1].startswith(MUTATING_PREFIXES)] == []
    for twin in prepared.twins.values():
        assert [r.verb for r in twin.store.request_log
                if r.verb in {"create", "update", "patch", "delete", "deletecollection"}] == []


def test_missing_execution_role_and_tls_bucket_are_listed_with_their_fixes(prepared, make_ctx) -> None:
    aws_client(prepared, "iam").delete_role(RoleName=EXEC_ROLE)
    aws_client(prepared, "s3").delete_bucket(Bucket=TLS_BUCKET)

    problems = preflight.check(make_ctx(CLUSTER))

    found = by_check(problems)
    assert sorted(found) == ["execution_role", "tls_bucket"]
    (role,) = found["execution_role"]
    assert f"IAM role {EXEC_ROLE}" in role.what and "does not exist" in role.what
    assert role.fix.startswith(f"aws iam create-role --role-name {EXEC_ROLE} --assume-role-policy-document ")
    trust = json.loads(role.fix.split("--assume-role-policy-document ", 1)[1].split("'")[1])
    principals = [s["Principal"] for s in trust["Statement"]]
    assert {"Service": ["sagemaker.amazonaws.com"]} in principals
    assert any("Federated" in p for p in principals)
    (bucket,) = found["tls_bucket"]
    assert TLS_BUCKET in bucket.what
    assert bucket.fix == (f"aws s3api create-bucket --bucket {TLS_BUCKET} --region us-west-2 "
                          "--create-bucket-configuration LocationConstraint=us-west-2")
    text = preflight.render(problems, [CLUSTER])
    assert f"fix: aws iam create-role --role-name {EXEC_ROLE}" in text
    assert f"fix: aws s3api create-bucket --bucket {TLS_BUCKET}" in text
    assert preflight.exit_code(problems) == 1
    # The other cluster's bucket is still there; only what is missing is listed.
    assert [p.check for p in preflight.check(make_ctx("ml-prod-use1"))] == ["execution_role"]


def test_cli_handler_lists_problems_as_json_and_exits_1(prepared, example_fleet, capsys) -> None:
    aws_client(prepared, "s3").delete_bucket(Bucket=TLS_BUCKET)
    lines: list[str] = []
    args = argparse.Namespace(fleet=str(example_fleet), cluster=[CLUSTER], json=True)
    assert preflight.cmd_preflight(args, out=lines.append) == 1
    report = json.loads(lines[0])
    assert report["ready"] is False and report["clusters"] == [CLUSTER]
    assert [p["check"] for p in report["problems"]] == ["tls_bucket"]

    aws_client(prepared, "s3").create_bucket(Bucket=TLS_BUCKET,
                                             CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    lines.clear()
    args = argparse.Namespace(fleet=str(example_fleet), cluster=None, json=False)
    assert preflight.cmd_preflight(args, out=lines.append) == 0
    assert lines == ["preflight: ml-prod-use1, ml-stage-usw2 ready"]


def test_ebs_csi_role_missing_or_unable_to_attach(prepared, make_ctx) -> None:
    iam = aws_client(prepared, "iam")
    iam.detach_role_policy(RoleName=EBS_CSI_ROLE, PolicyArn=EBS_CSI_POLICY_ARN)
    (problem,) = preflight.check(make_ctx(CLUSTER))
    assert problem.check == "ebs_csi_role" and "ec2:AttachVolume" in problem.what
    assert problem.fix == f"aws iam attach-role-policy --role-name {EBS_CSI_ROLE} --policy-arn {EBS_CSI_POLICY_ARN}"

    # A policy that allows AttachVolume only with a condition is not credited; a Deny wins over the managed one.
    iam.put_role_policy(RoleName=EBS_CSI_ROLE, PolicyName="conditional", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:AttachVolume", "Resource": "*",
                                                "Condition": {"StringEquals": {"aws:RequestTag/x": "y"}}}]}))
    assert [p.check for p in preflight.check(make_ctx(CLUSTER))] == ["ebs_csi_role"]
    iam.attach_role_policy(RoleName=EBS_CSI_ROLE, PolicyArn=EBS_CSI_POLICY_ARN)
    assert preflight.check(make_ctx(CLUSTER)) == []
    iam.put_role_policy(RoleName=EBS_CSI_ROLE, PolicyName="deny", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Action": "ec2:*Volume", "Resource": "*"}]}))
    assert [p.check for p in preflight.check(make_ctx(CLUSTER))] == ["ebs_csi_role"]

    iam.delete_role_policy(RoleName=EBS_CSI_ROLE, PolicyName="deny")
    iam.delete_role_policy(RoleName=EBS_CSI_ROLE, PolicyName="conditional")
    iam.detach_role_policy(RoleName=EBS_CSI_ROLE, PolicyArn=EBS_CSI_POLICY_ARN)
    iam.delete_role(RoleName=EBS_CSI_ROLE)
    (problem,) = preflight.check(make_ctx(CLUSTER))
    assert problem.check == "ebs_csi_role" and "does not exist" in problem.what
    assert problem.fix.startswith("eksctl create iamserviceaccount --name ebs-csi-controller-sa --namespace kube-system "
                                  "--cluster ml-stage-usw2-eks --region us-west-2 "
                                  f"--role-name {EBS_CSI_ROLE} --role-only --attach-policy-arn {EBS_CSI_POLICY_ARN}")


def test_execution_role_must_trust_sagemaker(prepared, make_ctx) -> None:
    iam = aws_client(prepared, "iam")
    iam.update_assume_role_policy(RoleName=EXEC_ROLE, PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}))
    (problem,) = preflight.check(make_ctx(CLUSTER))
    assert problem.check == "execution_role"
    assert "does not trust the service principal sagemaker.amazonaws.com" in problem.what
    assert "the cluster's OIDC provider" in problem.what
    assert problem.fix.startswith(f"aws iam update-assume-role-policy --role-name {EXEC_ROLE} --policy-document ")


def test_addon_versions_and_missing_addons(prepared, make_ctx) -> None:
    eks = "ml-stage-usw2-eks"
    prepared.aws.add_addon(eks, "vpc-cni", version="v1.18.2-eksbuild.1", replace=True)
    (problem,) = preflight.check(make_ctx(CLUSTER))
    assert problem.check == "addon_version" and "v1.18.2-eksbuild.1" in problem.what and "v1.18.3" in problem.what
    assert "aws eks update-addon --cluster-name ml-stage-usw2-eks --addon-name vpc-cni" in problem.fix

    prepared.aws.add_addon(eks, "vpc-cni", version="v1.18.3-eksbuild.1", replace=True)
    assert preflight.check(make_ctx(CLUSTER)) == []

    prepared.aws._eks.clusters[eks].addons.pop("aws-ebs-csi-driver")
    (problem,) = preflight.check(make_ctx(CLUSTER))
    assert problem.check == "ebs_csi_addon" and "not installed" in problem.what
    assert problem.fix == ("aws eks create-addon --cluster-name ml-stage-usw2-eks --addon-name aws-ebs-csi-driver "
                           f"--service-account-role-arn arn:aws:iam::123456789012:role/{EBS_CSI_ROLE} "
                           "--region us-west-2")


def test_missing_storage_class(prepared, make_ctx) -> None:
    prepared.twin(CLUSTER).store.delete("storage.k8s.io", "storageclasses", "ebs-sc")
    (problem,) = preflight.check(make_ctx(CLUSTER))
    assert problem.check == "storage_class" and "ebs-sc" in problem.what
    assert problem.fix.startswith("kubectl apply -f - <<'EOF'") and "provisioner: ebs.csi.aws.com" in problem.fix


def test_refuse_if_missing_raises_with_every_fix(prepared, make_ctx) -> None:
    from kvfleet.errors import PermanentError

    aws_client(prepared, "s3").delete_bucket(Bucket=TLS_BUCKET)
    with pytest.raises(PermanentError) as refused:
        preflight.refuse_if_missing(make_ctx(CLUSTER))
    assert f"fix: aws s3api create-bucket --bucket {TLS_BUCKET}" in str(refused.value)


def test_seeding_is_idempotent(prepared, inventory, make_ctx) -> None:
    from kvfleet_sandbox.aws_prereqs import seed_prerequisites

    seed_prerequisites(prepared.aws, inventory.clusters)  # the runtime may already have seeded: nothing changes
    trust = aws_client(prepared, "iam").get_role(RoleName=EXEC_ROLE)["Role"]["AssumeRolePolicyDocument"]
    # one sagemaker statement, one web-identity statement per cluster (both clusters share the role)
    assert len(trust["Statement"]) == 3
    assert preflight.check(make_ctx(CLUSTER)) == []
    with pytest.raises(ValueError, match="unknown items"):
        seed_prerequisites(prepared.aws, inventory.clusters, omit={"tls-bucket"})


@pytest.mark.parametrize("missing", ["csi_service_accounts", "curvine_role_binding", "endpoint_namespace",
                                     "cluster_policy"])
def test_without_the_bootstrap_bundle_the_rollout_stops_before_any_change_naming_the_command(
        prepared, make_ctx, missing) -> None:
    """kvfleet's identity may not create what the kvfleet-bootstrap bundle holds: preflight (the rollout's first
    task) refuses the cluster with the exact command, and nothing is written."""
    from kvfleet.errors import PermanentError

    store = prepared.twin(CLUSTER).store
    if missing == "csi_service_accounts":
        for name in ("curvine-csi-node", "curvine-csi-controller"):
            store.delete("", "serviceaccounts", name, "curvine")
    elif missing == "curvine_role_binding":
        store.delete("rbac.authorization.k8s.io", "rolebindings", "kvfleet-curvine", "curvine")
    elif missing == "cluster_policy":  # CLUSTER is in kyverno mode, its Kyverno serving
        store.delete("kyverno.io", "clusterpolicies", "kvfleet-curvine-l2")
    else:
        ctx = make_ctx(CLUSTER)
        namespace = next(e.namespace for e in ctx.inventory.endpoints if e.cluster == CLUSTER)
        store.delete("", "namespaces", namespace)
    for twin in prepared.twins.values():
        twin.store.reset_request_log()

    with pytest.raises(PermanentError) as refused:
        preflight.refuse_if_missing(make_ctx(CLUSTER))
    text = str(refused.value)
    assert "(bootstrap): the kvfleet-bootstrap bundle is not applied on" in text
    assert f"fix: as a cluster admin: kvfleet bootstrap --print --fleet twin.yaml --cluster {CLUSTER} " \
           "| kubectl apply -f -" in text
    assert {"csi_service_accounts": "ServiceAccount curvine/curvine-csi-node",
            "curvine_role_binding": "kvfleet's RoleBinding in namespace curvine",
            "endpoint_namespace": "Namespace ", "cluster_policy": "ClusterPolicy kvfleet-curvine-l2"}[missing] in text
    for twin in prepared.twins.values():
        assert [r.verb for r in twin.store.request_log
                if r.verb in {"create", "update", "patch", "delete", "deletecollection"}] == []
