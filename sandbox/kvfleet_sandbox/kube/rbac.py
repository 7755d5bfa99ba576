"""RBAC for the Kubernetes emulator: the authorizer and the escalation check, with Kubernetes' semantics.

Called from ``routing.handle`` (``Authorizer.authorize`` for every resource request of a non-admin user) and,
as a store admission hook, on every write of a Role, ClusterRole, RoleBinding or ClusterRoleBinding made through
the API (``Authorizer.admit``; the acting user is set per request by ``acting_as``). The rules and bindings are
the RBAC objects in the store, so ``kubectl apply -f k8s/rbac/`` (or the sandbox's bootstrap, which applies the
same files) is what grants kvfleet its rights.

Sources (kubernetes/kubernetes; facts and commits in tests/conformance/facts/kube_rbac.yaml):
- ``plugin/pkg/auth/authorizer/rbac/rbac.go`` and ``pkg/apis/rbac/v1/evaluation_helpers.go``: a request is
  allowed if any rule of any role bound to the user (ClusterRoleBindings everywhere, RoleBindings in their
  namespace) matches its verb, API group, resource (``resource/subresource``; ``*`` and ``*/sub`` wildcards) and,
  when the rule lists ``resourceNames``, its name. A create has no name, so ``resourceNames`` never match it.
  A list/watch narrowed by ``fieldSelector=metadata.name=<n>`` carries that name (``RequestInfoFactory``).
- ``pkg/registry/rbac/{role,clusterrole}/policybased/storage.go`` and ``escalation_check.go``: creating or
  updating a Role/ClusterRole is allowed to ``system:masters``, to a user allowed the ``escalate`` verb on it
  (``RoleEscalationAuthorized``: the request's own resource, namespace and name), or to a user who already holds
  every right it grants (``ConfirmNoEscalation``, rules resolved in the role's namespace).
- ``pkg/registry/rbac/{rolebinding,clusterrolebinding}/policybased/storage.go``: creating or updating a binding
  is allowed to ``system:masters``, to a user allowed ``bind`` on the referenced role (``BindingAuthorized``:
  resource ``roles``/``clusterroles``, name = roleRef.name, namespace = the binding's), or to a user who holds
  every right of the referenced role; a missing role is then an error.
- ``pkg/registry/rbac/validation/policy_comparator.go`` (``Covers``): the owner's rules cover a rule if every
  (group, resource, verb, resourceName) it breaks down into is matched by one owner rule; an owner rule with
  ``resourceNames`` covers only rules listing names from it.

Impersonation (kubernetes/apiserver at tag kubernetes-1.33.0, commit 9529108a5dff5a998bca0afd61510c9c0e34b2e3;
facts in tests/conformance/facts/kube_impersonation.yaml): ``Authorizer.authorize_impersonation`` makes
``WithImpersonation``'s checks (``pkg/endpoints/filters/impersonation.go``), one ``impersonate`` per thing asked
for, as the requesting user: ``users``/``groups`` (group "", name = the user or group), ``serviceaccounts`` (group
"", the service account's namespace and name), ``userextras/<key>`` and ``uids`` (group
``authentication.k8s.io``, name = the value). The first refusal is a 403 rendered like
``responsewriters.ForbiddenStatusError`` (``pkg/endpoints/handlers/responsewriters/errors.go``):
``<resource>[.<group>] "<name>" is forbidden: User "<requester>" cannot impersonate resource "<resource>[/<key>]"
in API group "<group>" at the cluster scope`` (``in the namespace "<ns>"`` for a service account).
"""

from __future__ import annotations

import collections
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvfleet_sandbox.kube.auth import ImpersonationRequest, UserInfo
from kvfleet_sandbox.kube.errors import ApiError

if TYPE_CHECKING:
    from kvfleet_sandbox.kube.store import KubeStore

GROUP = "rbac.authorization.k8s.io"
AUTHENTICATION_GROUP = "authentication.k8s.io"
IMPERSONATE = "impersonate"
# WithImpersonation: the (API group, resource) checked for each kind of impersonation request.
IMPERSONATED_RESOURCES = {"ServiceAccount": ("", "serviceaccounts"), "User": ("", "users"), "Group": ("", "groups"),
                          "UserExtra": (AUTHENTICATION_GROUP, "userextras"), "UID": (AUTHENTICATION_GROUP, "uids")}
LOGGED_VERBS = ("escalate", "bind", IMPERSONATE)  # checks logged whatever their outcome
# responsewriters' sanitizer: "Avoid emitting errors that look like valid HTML".
_SANITIZE = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
ROLE_RESOURCES = {"roles": "Role", "clusterroles": "ClusterRole"}
BINDING_RESOURCES = {"rolebindings": "RoleBinding", "clusterrolebindings": "ClusterRoleBinding"}


@dataclass(frozen=True)
class Attributes:
    """One authorization question (Kubernetes' ``authorizer.Attributes`` for a resource request)."""

    user: UserInfo
    verb: str
    group: str
    resource: str  # "pods" or "pods/log"
    namespace: str | None
    name: str | None

    def describe(self) -> str:
        res = self.resource.split("/", 1)
        what = f'resource "{res[0]}"' + (f' subresource "{res[1]}"' if len(res) > 1 else "")
        where = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        return f'User "{self.user.name}" cannot {self.verb} {what} in API group "{self.group}" {where}'


def _has(values: list[str], value: str) -> bool:
    return "*" in values or value in values


def _resource_matches(resources: list[str], resource: str) -> bool:
    if "*" in resources or resource in resources:
        return True
    sub = resource.partition("/")[2]
    return bool(sub) and f"*/{sub}" in resources


def rule_allows(rule: dict[str, Any], verb: str, group: str, resource: str, name: str | None) -> bool:
    """Kubernetes' ``RuleAllows`` for a resource request."""
    if not _has(list(rule.get("verbs") or []), verb):
        return False
    if not _has(list(rule.get("apiGroups") or []), group):
        return False
    if not _resource_matches(list(rule.get("resources") or []), resource):
        return False
    names = list(rule.get("resourceNames") or [])
    return not names or (bool(name) and name in names)


def _breakdown(rule: dict[str, Any]) -> Iterator[tuple[str, str, str, str | None]]:
    names = list(rule.get("resourceNames") or []) or [None]
    for group in rule.get("apiGroups") or []:
        for resource in rule.get("resources") or []:
            for verb in rule.get("verbs") or []:
                for name in names:
                    yield group, resource, verb, name


def _owner_covers(owner: dict[str, Any], group: str, resource: str, verb: str, name: str | None) -> bool:
    if not _has(list(owner.get("verbs") or []), verb) or not _has(list(owner.get("apiGroups") or []), group):
        return False
    if resource != "*" and not _resource_matches(list(owner.get("resources") or []), resource):
        return False
    if resource == "*" and "*" not in (owner.get("resources") or []):
        return False
    names = list(owner.get("resourceNames") or [])
    return not names or (name is not None and name in names)


def uncovered(owner_rules: list[dict[str, Any]], rules: list[dict[str, Any]]) -> list[str]:
    """The parts of ``rules`` that no owner rule covers (``Covers``), as readable strings; [] if covered."""
    missing = []
    for rule in rules:
        if rule.get("nonResourceURLs"):
            missing += [f"nonResourceURLs {rule['nonResourceURLs']}"] if not any(
                "*" in (o.get("nonResourceURLs") or []) for o in owner_rules) else []
            continue
        for group, resource, verb, name in _breakdown(rule):
            if not any(_owner_covers(o, group, resource, verb, name) for o in owner_rules):
                missing.append(f"{{APIGroups:[{group!r}], Resources:[{resource!r}], Verbs:[{verb!r}]"
                               + (f", ResourceNames:[{name!r}]" if name else "") + "}")
    return missing


_current = threading.local()


@contextlib.contextmanager
def acting_as(user: UserInfo | None, authorizer: Authorizer | None,
              request_name: str | None = None) -> Iterator[None]:
    """The user on whose behalf this thread's store writes run (None for the sandbox's own controllers), and the
    name on the request's URL (None for a create), which is what ``escalate`` is checked against."""
    previous = getattr(_current, "value", None)
    _current.value = (user, authorizer, request_name)
    try:
        yield
    finally:
        _current.value = previous


class Authorizer:
    """RBAC over the RBAC objects of one ``KubeStore``. ``log`` keeps the last ``LOG_LIMIT`` refusals and
    ``escalate``/``bind``/``impersonate`` checks (the replay test reads which were made; every request itself is
    in the store's request log, with its user and decision)."""

    LOG_LIMIT = 10_000

    def __init__(self, store: KubeStore) -> None:
        self.store = store
        self.log: collections.deque[tuple[Attributes, bool]] = collections.deque(maxlen=self.LOG_LIMIT)
        self._lock = threading.Lock()

    # --- rule resolution --------------------------------------------------------------------------------

    @staticmethod
    def _subject_matches(subject: dict[str, Any], user: UserInfo, binding_ns: str | None) -> bool:
        kind = subject.get("kind")
        if kind == "Group":
            return subject.get("name") in user.groups
        if kind == "User":
            return subject.get("name") == user.name
        if kind == "ServiceAccount":
            ns = subject.get("namespace") or binding_ns
            return user.name == f"system:serviceaccount:{ns}:{subject.get('name')}"
        return False

    def _role_rules(self, ref: dict[str, Any], namespace: str | None) -> list[dict[str, Any]] | None:
        if ref.get("kind") == "ClusterRole":
            role = self.store.get(GROUP, "clusterroles", ref.get("name", ""))
        elif ref.get("kind") == "Role" and namespace:
            role = self.store.get(GROUP, "roles", ref.get("name", ""), namespace)
        else:
            return None
        return None if role is None else list(role.get("rules") or [])

    def rules_for(self, user: UserInfo, namespace: str | None) -> list[dict[str, Any]]:
        """Every rule bound to ``user`` that applies in ``namespace`` (None: cluster scope)."""
        rules: list[dict[str, Any]] = []
        bindings: list[tuple[dict[str, Any], str | None]] = [
            (b, None) for b in self.store.list(GROUP, "clusterrolebindings")]
        if namespace:
            bindings += [(b, namespace) for b in self.store.list(GROUP, "rolebindings", namespace)]
        for binding, ns in bindings:
            if any(self._subject_matches(s, user, ns) for s in binding.get("subjects") or []):
                rules += self._role_rules(binding.get("roleRef") or {}, ns) or []
        return rules

    # --- decisions --------------------------------------------------------------------------------------

    def allowed(self, attrs: Attributes) -> bool:
        ok = attrs.user.is_master or any(
            rule_allows(r, attrs.verb, attrs.group, attrs.resource, attrs.name)
            for r in self.rules_for(attrs.user, attrs.namespace))
        if not ok or attrs.verb in LOGGED_VERBS:
            with self._lock:
                self.log.append((attrs, ok))
        return ok

    def authorize(self, attrs: Attributes) -> None:
        if not self.allowed(attrs):
            raise forbidden(attrs.resource, attrs.name, attrs.group, attrs.describe())

    def authorize_impersonation(self, requester: UserInfo, requests: list[ImpersonationRequest]) -> None:
        """``WithImpersonation``'s loop: each request in order is an ``impersonate`` check for ``requester``; the
        first refused is a 403 ``Forbidden`` (``ForbiddenStatusError``, no reason: RBAC gives none)."""
        for request in requests:
            group, resource = IMPERSONATED_RESOURCES[request.kind]
            if request.kind == "UserExtra":
                resource = f"{resource}/{request.field_path}"
            attrs = Attributes(requester, IMPERSONATE, group, resource, request.namespace or None, request.name)
            if not self.allowed(attrs):
                raise forbidden_status(attrs)

    # --- escalation (store admission hook) ----------------------------------------------------------------

    def admit(self, op: str, group: str, resource: str, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        state = getattr(_current, "value", None)
        if group != GROUP or state is None or op not in ("CREATE", "UPDATE"):
            return
        user, authorizer, _ = state
        if user is None or authorizer is not self or user.is_master:
            return
        meta = new.get("metadata") or {}
        name, namespace = meta.get("name", ""), meta.get("namespace")
        if resource in ROLE_RESOURCES:
            self._check_role(user, op, resource, name, namespace, new)
        elif resource in BINDING_RESOURCES:
            self._check_binding(user, resource, name, namespace, new)

    def _check_role(self, user: UserInfo, op: str, resource: str, name: str, namespace: str | None,
                    role: dict[str, Any]) -> None:
        # RoleEscalationAuthorized: the request's own attributes, with "escalate" (a create has no name).
        request_name = getattr(_current, "value", (None, None, None))[2]
        if self.allowed(Attributes(user, "escalate", GROUP, resource, namespace, request_name)):
            return
        if role.get("aggregationRule") and resource == "clusterroles":
            missing = uncovered(self.rules_for(user, None), [{"apiGroups": ["*"], "resources": ["*"],
                                                               "verbs": ["*"]}])
            if missing:
                raise forbidden(resource, name, GROUP, f'user "{user.name}" must have cluster-admin privileges '
                                                       "to use the aggregationRule")
        missing = uncovered(self.rules_for(user, namespace), list(role.get("rules") or []))
        if missing:
            raise forbidden(resource, name, GROUP, f'user "{user.name}" (groups={list(user.groups)}) is '
                            f"attempting to grant RBAC permissions not currently held:\n" + "\n".join(missing))

    def _check_binding(self, user: UserInfo, resource: str, name: str, namespace: str | None,
                       binding: dict[str, Any]) -> None:
        ref = binding.get("roleRef") or {}
        kind = ref.get("kind")
        role_resource = {"ClusterRole": "clusterroles", "Role": "roles"}.get(kind or "")
        if role_resource and self.allowed(Attributes(user, "bind", ref.get("apiGroup") or GROUP, role_resource,
                                                     namespace, ref.get("name"))):
            return
        rules = self._role_rules(ref, namespace)
        if rules is None:
            raise ApiError(404, "NotFound", f'{role_resource or "roles"}.{GROUP} "{ref.get("name")}" not found')
        missing = uncovered(self.rules_for(user, namespace), rules)
        if missing:
            raise forbidden(resource, name, GROUP, f'user "{user.name}" (groups={list(user.groups)}) is '
                            f"attempting to grant RBAC permissions not currently held:\n" + "\n".join(missing))


def forbidden(resource: str, name: str | None, group: str, reason: str) -> ApiError:
    target = f"{resource.split('/')[0]}{'.' + group if group else ''}"
    subject = f'{target} "{name}"' if name else target
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {reason}")


def _go_quote(value: str) -> str:
    """Go's ``%q`` for the names and messages here (a JSON string is the same for printable text)."""
    return json.dumps(value, ensure_ascii=False)


def forbidden_status(attrs: Attributes) -> ApiError:
    """``responsewriters.ForbiddenStatusError`` with an empty reason, and ``apierrors.NewForbidden``'s message
    and details (kubernetes/apiserver ``pkg/endpoints/handlers/responsewriters/errors.go``, kubernetes-1.33.0):
    ``forbiddenMessage`` names the resource as ``resource/subresource``; the qualified resource and the details'
    kind carry the resource alone."""
    resource = attrs.resource.split("/", 1)[0]
    where = f"in the namespace {_go_quote(attrs.namespace)}" if attrs.namespace else "at the cluster scope"
    message = (f"User {_go_quote(attrs.user.name)} cannot {attrs.verb} resource {_go_quote(attrs.resource)} "
               f"in API group {_go_quote(attrs.group)} {where}").translate(_SANITIZE)
    qualified = f"{resource}.{attrs.group}" if attrs.group else resource
    subject = f"{qualified} {_go_quote(attrs.name)}" if attrs.name else qualified
    details = {k: v for k, v in (("name", attrs.name), ("group", attrs.group), ("kind", resource)) if v}
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {message}", details)
