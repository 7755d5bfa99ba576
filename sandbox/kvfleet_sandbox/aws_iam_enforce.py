"""IAM identity-policy enforcement in the sandbox's AWS emulator: every call a non-admin principal makes is authorized
by the policies attached to it in the emulator's IAM (moto's backend), the way the Kubernetes side authorizes with
RBAC (``runtime.rbac_enforced``).

Called from :class:`kvfleet_sandbox.aws.AwsEmulator` (``enforce_iam``; then ``_authorize`` on every request, kvfleet's
own SageMaker, EKS and STS emulation and moto's IAM, S3 and SNS alike) and from the sandbox runtime
(:func:`attach_kvfleet_policies` at start-up: kvfleet's principal in each account gets ``k8s/iam``'s policy files,
the list the runtime is given, then enforcement is turned on).

What is modelled (facts and sources: tests/conformance/facts/iam_enforcement.yaml):

- The principal is the caller the emulator resolved from the SigV4 key (:mod:`kvfleet_sandbox.aws_sts`): an IAM user
  (its inline, attached and group policies) or an assumed-role session (its role's inline and attached policies).
  Only identity-based policies: no resource policies, permission boundaries, SCPs or session policies.
- Evaluation ("Policy evaluation logic", IAM User Guide): an explicit ``Deny`` that applies wins; else an ``Allow``
  that applies allows; else the request is implicitly denied. A statement applies when its ``Action``/``NotAction``
  (case-insensitive, ``*`` and ``?``), its ``Resource``/``NotResource`` (an ARN matched segment by segment,
  case-sensitive wildcards, policy variables such as ``${aws:PrincipalAccount}``) and every condition match.
- Conditions: the String*, Arn*, ``Bool`` and ``Null`` operators, the ``IfExists`` suffix and the
  ``ForAllValues:``/``ForAnyValue:`` qualifiers, on the request context: ``aws:PrincipalAccount``,
  ``aws:PrincipalArn``, ``aws:username``, ``aws:userid``, ``aws:RequestedRegion``, ``aws:PrincipalTag/<k>`` (session
  tags), ``aws:ResourceTag/<k>`` (the resource's tags: SageMaker HyperPod clusters keep theirs),
  ``aws:RequestTag/<k>`` and ``aws:TagKeys``. An operator the twin does not model fails the call loudly (500) rather
  than being skipped, so a policy cannot pass on the twin by a condition nobody evaluated.
- Each operation's action and resource follow the Service Authorization Reference: e.g. ``sagemaker:UpdateCluster``
  on ``arn:aws:sagemaker:<region>:<account>:cluster/<id>``, ``eks:CreateAddon`` on the EKS cluster's ARN,
  ``eks:UpdateAddon`` on ``arn:aws:eks:<region>:<account>:addon/<cluster>/<addon>/<uuid>``, S3 ``HeadBucket`` as
  ``s3:ListBucket`` on ``arn:aws:s3:::<bucket>``. ``sts:GetCallerIdentity`` needs no permission (the STS API
  reference), and is never refused.
- A refusal is the service's own error: SageMaker ``AccessDeniedException`` (400), EKS ``AccessDeniedException``
  (403, its model's status), IAM, STS and SNS ``AccessDenied`` (403), S3 ``AccessDenied`` (403), with the message
  "User: <arn> is not authorized to perform: <action> on resource: <arn> because no identity-based policy allows the
  <action> action" (or "... with an explicit deny in an identity-based policy").

moto 5.2.5 has an evaluator (``moto/iam/access_control.py``: ``IAMPolicy``, ``IAMPolicyStatement``) but it is not
used for the decision: a statement whose condition fails is answered DENIED even when its effect is Allow, it
implements ``StringEquals`` alone, substitutes no policy variable, ignores ``NotResource`` and matches actions
case-sensitively. The policies are read from moto's IAM backend as its ``collect_policies`` does.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvfleet_sandbox.aws_sts import BASE_USER, Caller, parse_policy, tags_of
from kvfleet_sandbox.aws_wire import AwsError

if TYPE_CHECKING:
    from kvfleet.fleet.inventory import Inventory
    from kvfleet_sandbox.aws import AwsEmulator

log = logging.getLogger(__name__)

IAM_DIR = Path(__file__).resolve().parents[2] / "k8s" / "iam"
# What kvfleet's principal holds in each account, by default: the one policy k8s/iam/README.md documents.
DEFAULT_POLICY_FILES: tuple[Path, ...] = (IAM_DIR / "kvfleet-policy.json",)
# What the hub holds when the fleet reaches other accounts through their roles (k8s/iam/README.md).
HUB_POLICY_FILES: tuple[Path, ...] = (IAM_DIR / "hub-policy.json",)

ALLOW, EXPLICIT_DENY, IMPLICIT_DENY = "Allow", "ExplicitDeny", "ImplicitDeny"
NOT_ALLOWED = "User: {arn} is not authorized to perform: {action} on resource: {resource} because no " \
              "identity-based policy allows the {action} action"
DENIED = "User: {arn} is not authorized to perform: {action} on resource: {resource} with an explicit deny in an " \
         "identity-based policy"
# Operations that need no permission ("GetCallerIdentity", AWS STS API Reference: "No permissions are required to
# perform this operation").
FREE = frozenset({("sts", "GetCallerIdentity")})


class UnmodelledCondition(ValueError):
    """A policy uses a condition operator the twin does not evaluate."""


# --- evaluation ---------------------------------------------------------------------------------------------------


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _wildcard(pattern: str, value: str, *, case: bool) -> bool:
    """``*`` (any run) and ``?`` (one character), nothing else special (fnmatch's ``[`` is escaped)."""
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, value, 0 if case else re.IGNORECASE | re.DOTALL) is not None


_VARIABLE = re.compile(r"\$\{([^}]+)\}")


def substitute(text: str, context: dict[str, Any]) -> str | None:
    """``text`` with its policy variables replaced from ``context`` ("IAM policy elements: Variables and tags");
    ``${*}``, ``${?}`` and ``${$}`` are the literal characters; None when a variable has no value (the element then
    matches nothing)."""
    missing = False

    def one(found: re.Match[str]) -> str:
        nonlocal missing
        name, _, default = found.group(1).partition(",")
        name = name.strip()
        if name in ("*", "?", "$"):
            return "\\" + name if name != "$" else "$"
        value = context.get(name.lower())
        if isinstance(value, list):
            value = value[0] if len(value) == 1 else None
        if value is None:
            default = default.strip()
            if default.startswith("'") and default.endswith("'") and len(default) >= 2:
                return default[1:-1]
            missing = True
            return ""
        return str(value)

    out = _VARIABLE.sub(one, text)
    return None if missing else out


def _literal_wildcard(pattern: str, value: str, *, case: bool) -> bool:
    # ${*} and ${?} were written as \* and \?: literal characters, not wildcards.
    parts = re.split(r"(\\\*|\\\?|\*|\?)", pattern)
    regex = "".join(".*" if p == "*" else "." if p == "?" else re.escape(p[1:]) if p in ("\\*", "\\?")
                    else re.escape(p) for p in parts)
    return re.fullmatch(regex, value, 0 if case else re.IGNORECASE | re.DOTALL) is not None


def resource_matches(pattern: str, resource: str, context: dict[str, Any]) -> bool:
    """An ARN pattern against a resource ARN: ``*`` matches anything; else the six ARN segments are matched one by
    one (a wildcard does not cross a ``:`` between segments; the last, the resource, keeps its own colons), with
    case-sensitive wildcards ("IAM JSON policy elements: Resource")."""
    text = substitute(pattern, context)
    if text is None:
        return False
    if text == "*":
        return True
    if not text.startswith("arn:") or not resource.startswith("arn:"):
        return _literal_wildcard(text, resource, case=True)
    want, have = text.split(":", 5), resource.split(":", 5)
    if len(want) != 6 or len(have) != 6:
        return False
    return all(_literal_wildcard(w, h, case=True) for w, h in zip(want, have, strict=True))


def action_matches(patterns: Any, action: str) -> bool:
    return any(_wildcard(str(p), action, case=False) for p in _listed(patterns))


_STRING_OPS: dict[str, Callable[[str, str], bool]] = {
    "stringequals": lambda want, have: want == have,
    "stringequalsignorecase": lambda want, have: want.lower() == have.lower(),
    "stringlike": lambda want, have: _literal_wildcard(want, have, case=True),
    "arnequals": lambda want, have: want == have,
    "arnlike": lambda want, have: resource_matches(want, have, {}),
    "bool": lambda want, have: want.lower() == have.lower(),
}
_NEGATED = {"stringnotequals": "stringequals", "stringnotequalsignorecase": "stringequalsignorecase",
            "stringnotlike": "stringlike", "arnnotequals": "arnequals", "arnnotlike": "arnlike"}


def _parse_operator(operator: str) -> tuple[str, str, bool]:
    """(qualifier, operator, IfExists) of a condition operator, lower-cased: "ForAllValues:StringEqualsIfExists" ->
    ("forallvalues", "stringequals", True)."""
    qualifier, _, name = operator.rpartition(":")
    qualifier = qualifier.lower()
    if qualifier not in ("", "forallvalues", "foranyvalue"):
        raise UnmodelledCondition(f"condition qualifier {operator!r}")
    lowered = name.lower()
    if_exists = lowered.endswith("ifexists") and lowered != "ifexists"
    return qualifier, lowered[: -len("ifexists")] if if_exists else lowered, if_exists


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _operator_holds(operator: str, key: str, wanted: list[Any], context: dict[str, Any]) -> bool:
    """One (operator, key, values) test of a Condition block ("IAM JSON policy elements: Condition operators")."""
    qualifier, name, if_exists = _parse_operator(operator)
    raw = context.get(key.lower())
    present = raw is not None and raw != []
    values = [_text(v) for v in _listed(raw)]
    if name == "null":
        # "true": the key is absent from the request context; "false": it is present.
        return any((_text(w) == "true") != present for w in wanted)
    negated = name in _NEGATED
    test = _STRING_OPS.get(_NEGATED.get(name, name))
    if test is None:
        raise UnmodelledCondition(f"condition operator {operator!r}")
    wanted_text = [t for t in (substitute(_text(w), context) for w in wanted) if t is not None]

    def matches(value: str) -> bool:
        return any(test(w, value) for w in wanted_text)

    if qualifier == "forallvalues":
        # True when every value of the request matches (and when the request has none).
        holds = all(matches(v) for v in values)
    elif qualifier == "foranyvalue":
        if not present:
            return False
        holds = any(matches(v) for v in values)
    elif not present:
        # Absent key: a positive operator is false, a negated one true; ...IfExists is true.
        return if_exists or negated
    else:
        holds = any(matches(v) for v in values)
    return (not holds) if negated else holds


def conditions_hold(conditions: Any, context: dict[str, Any]) -> bool:
    """Every operator and every key of the block holds (AND); the values listed for one key are alternatives
    (OR)."""
    if not conditions:
        return True
    if not isinstance(conditions, dict):
        raise UnmodelledCondition(f"Condition block {conditions!r}")
    for operator, tests in conditions.items():
        if not isinstance(tests, dict):
            raise UnmodelledCondition(f"condition {operator!r}: {tests!r}")
        for key, wanted in tests.items():
            if not _operator_holds(str(operator), str(key), _listed(wanted), context):
                return False
    return True


def statement_applies(statement: dict[str, Any], action: str, resource: str, context: dict[str, Any]) -> bool:
    if "NotAction" in statement:
        if action_matches(statement["NotAction"], action):
            return False
    elif not action_matches(statement.get("Action"), action):
        return False
    if "NotResource" in statement:
        if any(resource_matches(str(p), resource, context) for p in _listed(statement["NotResource"])):
            return False
    elif not any(resource_matches(str(p), resource, context) for p in _listed(statement.get("Resource"))):
        return False
    return conditions_hold(statement.get("Condition"), context)


def evaluate(policies: Iterable[dict[str, Any]], action: str, resource: str, context: dict[str, Any]) -> str:
    """ALLOW, EXPLICIT_DENY or IMPLICIT_DENY for one request under identity-based ``policies``."""
    allowed = False
    for policy in policies:
        for statement in _listed(policy.get("Statement")):
            if not isinstance(statement, dict) or not statement_applies(statement, action, resource, context):
                continue
            if statement.get("Effect") == "Deny":
                return EXPLICIT_DENY
            if statement.get("Effect") == "Allow":
                allowed = True
    return ALLOW if allowed else IMPLICIT_DENY


# --- the request: action, resource, context -----------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One authorization an operation needs: the IAM action on one resource, with the keys of the request context
    that come from the resource or the request (tags)."""

    action: str
    resource: str
    context: dict[str, Any] = field(default_factory=dict)


def tag_context(resource_tags: dict[str, str] | None = None, request_tags: dict[str, str] | None = None
                ) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for key, value in (resource_tags or {}).items():
        context[f"aws:resourcetag/{key}".lower()] = value
    if request_tags is not None:
        for key, value in request_tags.items():
            context[f"aws:requesttag/{key}".lower()] = value
        if request_tags:
            context["aws:tagkeys"] = list(request_tags)
    return context


def principal_context(caller: Caller, region: str) -> dict[str, Any]:
    context: dict[str, Any] = {
        "aws:principalaccount": caller.account,
        "aws:principalarn": caller.role_arn or caller.arn,
        "aws:userid": caller.user_id,
        "aws:requestedregion": region,
    }
    if caller.role_arn is None and ":user/" in caller.arn:
        context["aws:username"] = caller.arn.rsplit("/", 1)[-1]
    for key, value in caller.tags:
        context[f"aws:principaltag/{key}".lower()] = value
    return context


def _sagemaker_tags(params: dict[str, Any]) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value", "")) for t in params.get("Tags") or [] if isinstance(t, dict)}


def _s3_action(operation: str) -> str:
    # Amazon S3 API Reference, each operation's "Permissions" section.
    return {"HeadBucket": "s3:ListBucket", "ListObjects": "s3:ListBucket", "ListObjectsV2": "s3:ListBucket",
            "HeadObject": "s3:GetObject", "ListBuckets": "s3:ListAllMyBuckets",
            "GetBucketLocation": "s3:GetBucketLocation"}.get(operation, f"s3:{operation}")


def checks_of(emulator: AwsEmulator, service: str, operation: str, params: dict[str, Any], region: str,
              caller: Caller) -> list[Check]:
    """The authorizations ``service:operation`` needs (empty: none), per the Service Authorization Reference."""
    if (service, operation) in FREE:
        return []
    build = _CHECKS.get(service)
    if build is None:
        return [Check(f"{service}:{operation}", "*")]
    return build(emulator, f"{service}:{operation}", operation, params, region, caller.account)


def _sts_checks(emulator: AwsEmulator, action: str, operation: str, params: dict[str, Any], region: str,
                account: str) -> list[Check]:
    if operation != "AssumeRole":
        return [Check(action, "*")]
    role = str(params.get("RoleArn", "*"))
    tags = dict(tags_of(params))
    out = [Check("sts:AssumeRole", role)]
    if tags:  # passing session tags needs sts:TagSession too ("Pass session tags in AWS STS")
        out.append(Check("sts:TagSession", role, tag_context(None, tags)))
    return out


def _iam_checks(emulator: AwsEmulator, action: str, operation: str, params: dict[str, Any], region: str,
                account: str) -> list[Check]:
    if params.get("PolicyArn"):
        resource = str(params["PolicyArn"])
    elif params.get("RoleName"):
        resource = emulator._moto.role_arn(account, str(params["RoleName"]))
    elif params.get("UserName"):
        resource = f"arn:aws:iam::{account}:user/{params['UserName']}"
    else:
        resource = "*"
    return [Check(action, resource)]


def _s3_checks(emulator: AwsEmulator, action: str, operation: str, params: dict[str, Any], region: str,
               account: str) -> list[Check]:
    bucket, key = params.get("Bucket"), params.get("Key")
    resource = "*" if not bucket else f"arn:aws:s3:::{bucket}" + (f"/{key}" if key else "")
    return [Check(_s3_action(operation), resource)]


def _sns_checks(emulator: AwsEmulator, action: str, operation: str, params: dict[str, Any], region: str,
                account: str) -> list[Check]:
    arn = params.get("TopicArn") or params.get("TargetArn") or params.get("ResourceArn")
    if operation == "CreateTopic" and params.get("Name"):
        arn = f"arn:aws:sns:{region}:{account}:{params['Name']}"
    return [Check(action, str(arn or "*"))]


def _sagemaker_check(emulator: AwsEmulator, action: str, operation: str, params: dict[str, Any], region: str,
                     account: str) -> Check:
    state = emulator._account(account).sagemaker
    if operation == "ListClusters":
        return Check(action, "*")  # no resource type (Service Authorization Reference, ListClusters)
    name = params.get("ClusterName") or params.get("ResourceArn")
    request_tags = _sagemaker_tags(params) if operation in ("CreateCluster", "AddTags") else None
    if not name:
        return Check(action, "*", tag_context(None, request_tags))
    cluster = state.lookup(str(name))
    if cluster is None:
        resource = str(name) if str(name).startswith("arn:") else \
            f"arn:aws:sagemaker:{region}:{account}:cluster/{name}"
        return Check(action, resource, tag_context(None, request_tags))
    return Check(action, cluster.arn, tag_context(cluster.tags, request_tags))


def _eks_check(emulator: AwsEmulator, action: str, operation: str, params: dict[str, Any], region: str,
               account: str) -> Check:
    eks = emulator._account(account).eks
    cluster = str(params.get("clusterName") or params.get("name") or "")
    addon = params.get("addonName")
    request_tags = params.get("tags") if operation in ("CreateAddon", "TagResource") else None
    cluster_arn = eks.arn(cluster, region) if cluster else "*"
    if addon and operation != "CreateAddon":  # CreateAddon is authorized on the cluster (resource type cluster*)
        found = eks.clusters.get(cluster)
        item = found.addons.get(addon) if found else None
        resource = item.arn if item else f"arn:aws:eks:{region}:{account}:addon/{cluster}/{addon}/*"
        return Check(action, resource, tag_context(None, request_tags))
    return Check(action, cluster_arn, tag_context(None, request_tags))


_CHECKS: dict[str, Callable[..., list[Check]]] = {
    "sagemaker": lambda *args: [_sagemaker_check(*args)],
    "eks": lambda *args: [_eks_check(*args)],
    "sts": _sts_checks,
    "iam": _iam_checks,
    "s3": _s3_checks,
    "sns": _sns_checks,
}


# --- the principal's policies -------------------------------------------------------------------------------------


def _document(policy: Any) -> dict[str, Any]:
    versions = getattr(policy, "versions", None)
    if versions:
        default = next((v for v in versions if getattr(v, "is_default", False)), versions[-1])
        return parse_policy(default.document)
    return parse_policy(getattr(policy, "document", policy))


def identity_policies(backend: Any, caller: Caller) -> list[dict[str, Any]]:
    """The identity-based policies of ``caller`` in moto's IAM ``backend`` of its account: an assumed role's inline
    and attached policies, a user's inline, attached and group policies (moto/iam/access_control.py
    ``collect_policies``). A principal IAM does not hold has none."""
    if caller.role_arn:
        role = next((r for r in backend.roles.values() if r.arn == caller.role_arn), None)
        if role is None:
            return []
        return [parse_policy(doc) for doc in role.policies.values()] + \
            [_document(p) for p in role.managed_policies.values()]
    name = caller.arn.rsplit("/", 1)[-1] if ":user/" in caller.arn else None
    user = backend.users.get(name) if name else None
    if user is None:
        return []
    out = [parse_policy(doc) for doc in user.policies.values()] + \
        [_document(p) for p in user.managed_policies.values()]
    for group in backend.get_groups_for_user(user.name):
        out += [parse_policy(doc) for doc in group.policies.values()]
        out += [_document(p) for p in group.managed_policies.values()]
    return out


# --- refusals -----------------------------------------------------------------------------------------------------


def access_denied(service: str, caller: Caller, check: Check, decision: str) -> AwsError:
    """The service's own AccessDenied for a refused ``check`` (see the module docstring)."""
    template = DENIED if decision == EXPLICIT_DENY else NOT_ALLOWED
    message = template.format(arn=caller.arn, action=check.action, resource=check.resource)
    if service == "sagemaker":
        return AwsError("AccessDeniedException", message, status=400)
    if service == "eks":
        return AwsError("AccessDeniedException", message)  # 403: botocore's EKS model declares it
    return AwsError("AccessDenied", message, status=403)


@dataclass
class IamEnforcement:
    """Enforcement state of one emulator: which access keys bypass it (the sandbox's own administrators) and what
    was refused (``denials``: (service, operation, caller ARN, action, resource, decision))."""

    bypass_keys: set[str] = field(default_factory=set)
    bypass_prefixes: tuple[str, ...] = ()
    denials: list[tuple[str, str, str, str, str, str]] = field(default_factory=list)

    def bypassed(self, caller: Caller) -> bool:
        key = caller.access_key
        return key in self.bypass_keys or (bool(self.bypass_prefixes) and key.startswith(self.bypass_prefixes))


# --- attachment at sandbox start ----------------------------------------------------------------------------------


def policy_documents(files: Sequence[str | Path]) -> list[tuple[str, str]]:
    """(policy name, JSON text) of each file: the name is the file's stem, as ``put-role-policy --policy-name``."""
    return [(Path(f).stem, Path(f).read_text()) for f in files]


def _put_user(aws: AwsEmulator, account: str, documents: list[tuple[str, str]]) -> str:
    """The user ``kvfleet-sandbox`` of ``account`` (created as the administrator) with ``documents`` inline."""
    import boto3

    key = aws.admin_key(account)
    client = boto3.client("iam", endpoint_url=aws.url, region_name="us-east-1", aws_access_key_id=key,
                          aws_secret_access_key=key)
    try:
        arn = str(client.create_user(UserName=BASE_USER)["User"]["Arn"])
    except client.exceptions.EntityAlreadyExistsException:
        arn = str(client.get_user(UserName=BASE_USER)["User"]["Arn"])
    for name, text in documents:
        aws._moto.put_inline_policy(account, "user", BASE_USER, name, text)
    return arn


def _hub_needs_kvfleet(aws: AwsEmulator, inventory: Inventory) -> bool:
    """Whether some cluster is reached as the base identity itself (a cluster without an account, or whose account
    declares neither ``role_arn`` nor ``aws_conn_id``): only then does the hub hold kvfleet's policy too
    (k8s/iam/README.md, "What the hub does not hold")."""
    from kvfleet_sandbox.aws_prereqs import account_of

    by_id = {a.id: a for a in inventory.accounts}
    for cluster in inventory.clusters:
        declared = by_id.get(account_of(cluster) or aws.account_id)
        if declared is None or not (declared.role_arn or declared.aws_conn_id):
            return True
    return False


def attach_kvfleet_policies(aws: AwsEmulator, inventory: Inventory,
                            policy_files: Sequence[str | Path] | None = None,
                            hub_policy_files: Sequence[str | Path] | None = None) -> list[str]:
    """Attach kvfleet's policy files (default :data:`DEFAULT_POLICY_FILES`) to kvfleet's principal in every account
    the fleet uses, as a platform team does (k8s/iam/README.md), then turn enforcement on. Returns the principals'
    ARNs.

    - the base account's user ``kvfleet-sandbox`` (the sandbox's base key ``sandbox``), an inline user policy per
      file; when an account declares a ``role_arn`` that user is the hub: it gets ``hub_policy_files`` (default
      :data:`HUB_POLICY_FILES`), and kvfleet's files only if a cluster is reached as the base identity;
    - each account's declared role (``role_arn``, created by the runtime's ``_seed_accounts``), inline role policies;
    - the user ``kvfleet-sandbox`` of each account reached through its own Airflow connection (``aws_conn_id``).
    """
    documents = policy_documents(policy_files if policy_files is not None else DEFAULT_POLICY_FILES)
    hub = policy_documents([f for f in (hub_policy_files if hub_policy_files is not None else HUB_POLICY_FILES)
                            if Path(f).is_file()])
    if any(a.role_arn for a in inventory.accounts):
        base = (documents if _hub_needs_kvfleet(aws, inventory) else []) + hub
    else:
        base = documents
    principals = [_put_user(aws, aws.account_id, base)]
    for account in inventory.accounts:
        if account.id == aws.account_id:
            continue
        if account.role_arn:
            name = account.role_arn.rsplit("/", 1)[-1]
            for policy, text in documents:
                aws._moto.put_inline_policy(account.id, "role", name, policy, text)
            principals.append(account.role_arn)
        if account.aws_conn_id:
            principals.append(_put_user(aws, account.id, documents))
    aws.enforce_iam()
    return principals


def policy_files_found(files: Sequence[str | Path] | None) -> bool:
    return all(Path(f).is_file() for f in (files if files is not None else DEFAULT_POLICY_FILES))


def load_json(path: str | Path) -> dict[str, Any]:
    value = json.loads(Path(path).read_text())
    return value if isinstance(value, dict) else {}


__all__ = ["ALLOW", "EXPLICIT_DENY", "IMPLICIT_DENY", "Check", "IamEnforcement", "UnmodelledCondition",
           "access_denied", "attach_kvfleet_policies", "checks_of", "evaluate", "identity_policies",
           "principal_context"]
