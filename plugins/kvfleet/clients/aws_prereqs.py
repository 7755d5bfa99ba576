"""IAM and S3, read-only, for ``kvfleet preflight``: does a role exist, whom does it trust, may it attach EBS
volumes, does a bucket exist.

Called by :mod:`kvfleet.stages.preflight`. Clients are built exactly as :mod:`kvfleet.clients.hyperpod` builds
its own: Airflow's AWS hook with the same connection id, so the connection's ``endpoint_url`` (the sandbox) or
the default credential chain (``AWS_ENDPOINT_URL`` included) applies unchanged. Only Get/List/Head calls.

"Not found" is a state (``None`` / ``False``); any other AWS error becomes kvfleet's error model through
:func:`kvfleet.clients.hyperpod.classify`, so the caller can report "could not check" instead of guessing.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from botocore.exceptions import ClientError

from kvfleet.clients.hyperpod import classify
from kvfleet.clients.identity import Identity

# Read-only operations this module calls (for the RBAC/IAM derivation and the "changes nothing" tests).
READ_OPS = frozenset({"GetRole", "ListAttachedRolePolicies", "GetPolicy", "GetPolicyVersion", "ListRolePolicies",
                      "GetRolePolicy", "HeadBucket"})


def policy_document(raw: Any) -> dict[str, Any]:
    """A policy document as boto3 hands it over: already decoded, or URL-encoded JSON text."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(unquote(raw))
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    found = document.get("Statement", [])
    items = found if isinstance(found, list) else [found]
    return [s for s in items if isinstance(s, dict)]


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _matches(patterns: list[str], action: str) -> bool:
    return any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in patterns)


def allows(document: dict[str, Any], action: str, resources: list[str]) -> bool | None:
    """True if Allow statements without a condition cover ``action`` on every one of ``resources`` (example
    ARNs such as ``arn:aws:ec2:us-east-1:123456789012:volume/vol-0``), False if a statement denies it, None if
    the document does not grant it. A conservative reading: conditions, NotAction and NotResource statements are
    not credited."""
    covered: set[str] = set()
    for s in statements(document):
        if not _matches(_as_list(s.get("Action")), action):
            continue
        patterns = _as_list(s.get("Resource"))
        hits = {r for r in resources if any(fnmatch.fnmatchcase(r, p) for p in patterns)}
        if s.get("Effect") == "Deny" and hits and not s.get("Condition"):
            return False
        if s.get("Effect") == "Allow" and not s.get("Condition"):
            covered |= hits
    return True if covered == set(resources) else None


@dataclass(frozen=True)
class Role:
    name: str
    arn: str
    trust: dict[str, Any]

    def trusts_service(self, service: str) -> bool:
        """Does an Allow statement with ``sts:AssumeRole`` name ``service`` as its principal?"""
        for s in statements(self.trust):
            services = _as_list((s.get("Principal") or {}).get("Service")) if isinstance(s.get("Principal"),
                                                                                        dict) else []
            if s.get("Effect") == "Allow" and service in services and _matches(_as_list(s.get("Action")),
                                                                                "sts:AssumeRole"):
                return True
        return False

    def trusts_web_identity(self, provider_arn: str, subject: str) -> bool:
        """Does an Allow statement let ``subject`` (``system:serviceaccount:<ns>:<sa>``) of the OIDC provider
        assume the role (``sts:AssumeRoleWithWebIdentity``; a ``:sub`` condition, if any, must admit it)?"""
        host = provider_arn.partition(":oidc-provider/")[2]
        for s in statements(self.trust):
            principal = s.get("Principal")
            federated = _as_list(principal.get("Federated")) if isinstance(principal, dict) else []
            if s.get("Effect") != "Allow" or provider_arn not in federated:
                continue
            if not _matches(_as_list(s.get("Action")), "sts:AssumeRoleWithWebIdentity"):
                continue
            subs = [v for op in (s.get("Condition") or {}).values() if isinstance(op, dict)
                    for key, val in op.items() if key == f"{host}:sub" for v in _as_list(val)]
            if not subs or any(fnmatch.fnmatchcase(subject, v) for v in subs):
                return True
        return False


class AwsPrereqsClient:
    """IAM (global) and S3 for one region, read-only."""

    def __init__(self, region: str, identity: Identity | str | None = "aws_default") -> None:
        from kvfleet.clients import aws

        self.region = region
        self.iam = aws.client("iam", region, identity)
        self.s3 = aws.client("s3", region, identity)

    # ---- IAM ---------------------------------------------------------------------------------------------
    def get_role(self, name: str) -> Role | None:
        try:
            raw = self.iam.get_role(RoleName=name)["Role"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchEntity":
                return None
            raise classify(exc, f"IAM GetRole {name}") from exc
        return Role(raw["RoleName"], raw["Arn"], policy_document(raw.get("AssumeRolePolicyDocument")))

    def _attached(self, role: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """(policy ARN, default version document) of every managed policy attached to ``role``."""
        kwargs: dict[str, Any] = {"RoleName": role}
        while True:
            page = self.iam.list_attached_role_policies(**kwargs)
            for item in page.get("AttachedPolicies", []):
                arn = item["PolicyArn"]
                version = self.iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
                doc = self.iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
                yield arn, policy_document(doc)
            if not page.get("IsTruncated"):
                return
            kwargs["Marker"] = page["Marker"]

    def _inline(self, role: str) -> Iterator[tuple[str, dict[str, Any]]]:
        kwargs: dict[str, Any] = {"RoleName": role}
        while True:
            page = self.iam.list_role_policies(**kwargs)
            for name in page.get("PolicyNames", []):
                doc = self.iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
                yield f"inline:{name}", policy_document(doc)
            if not page.get("IsTruncated"):
                return
            kwargs["Marker"] = page["Marker"]

    def role_allows(self, role: str, action: str, resources: list[str]) -> tuple[bool, list[str]]:
        """(allowed, the policies that allow it) from the role's identity policies (managed and inline).

        Read from the documents rather than with ``SimulatePrincipalPolicy`` so that the check needs only
        ``iam:Get*``/``iam:List*``; an explicit unconditional Deny anywhere wins. Each single policy must cover
        every resource (a grant split over two policies is not credited: conservative)."""
        granting: list[str] = []
        try:
            for source, doc in [*self._attached(role), *self._inline(role)]:
                verdict = allows(doc, action, resources)
                if verdict is False:
                    return False, []
                if verdict:
                    granting.append(source)
        except ClientError as exc:
            raise classify(exc, f"IAM policies of {role}") from exc
        return bool(granting), granting

    # ---- S3 ----------------------------------------------------------------------------------------------
    def bucket_exists(self, bucket: str) -> bool:
        """HeadBucket: True (200, or 301 for a bucket in another region), False (404); 403 and the rest raise."""
        try:
            self.s3.head_bucket(Bucket=bucket)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if status == 404 or code in ("404", "NoSuchBucket", "NotFound"):
                return False
            if status == 301:
                return True
            raise classify(exc, f"S3 HeadBucket {bucket}") from exc
        return True
