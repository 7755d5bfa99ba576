"""The drift watch's rules: what it watches, which change of a watched object it reports, and when.

Pure (no I/O, no clients): the triggers in ``kvfleet.airflow.triggers`` feed it the objects their Kubernetes watches
deliver, as plain dicts, and emit what it says. Tested alone in ``tests/unit/test_watch_rules.py``.

- ``WATCHED``: the collections the drift check observes (``stages.drift``), each with its label selector, a filter
  the API server cannot express (a name prefix), the parts of an object a change of the desired state changes
  (``fingerprint``) and the event types that count. ``RBAC_CLUSTER_RULES`` / ``RBAC_CURVINE_NAMESPACE_RULES`` are
  the ``watch`` grants this asks of k8s/rbac, derived from ``WATCHED``.
- ``judge``: one watch event against the versions seen before. A change is reported when it changes the
  fingerprint (a status update, a new ``resourceVersion`` or a controller's own annotation does not) and kvfleet
  did not make it: the newest ``managedFields`` entry is not kvfleet's field manager (the User-Agent product
  ``kvfleet``, which the API server records for a write that names no manager, docs/reference/kubernetes.md).
  Nothing an object's author can write into the object itself (an annotation, a label) makes a change count as
  kvfleet's.
- ``Burst``: the changes seen since the last event, due after ``quiet_s`` of quiet (or ``max_burst_s`` of churn).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kvfleet.fleet.constants import (
    IEC_GROUP,
    IEC_PLURAL,
    MANAGED_BY_LABEL,
    OPERATOR_DEPLOYMENTS,
    OPERATOR_NAMESPACE,
)

OWN_FIELD_MANAGER_PREFIX: Final = "kvfleet"
# Annotations controllers rewrite on their own (the Deployment revision): not a change of the desired state.
NOISY_ANNOTATION_PREFIXES: Final = ("deployment.kubernetes.io/",)
# What a watch delivers: the first list's objects, the watch's events. BOOKMARK only moves the version.
OBJECT_EVENTS: Final = frozenset({"LISTED", "ADDED", "MODIFIED", "DELETED"})
CHANGE_EVENTS: Final = frozenset({"ADDED", "MODIFIED", "DELETED"})


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _everything(_obj: Mapping[str, Any]) -> bool:
    return True


def is_curvine_release(obj: Mapping[str, Any]) -> bool:
    """A Helm release record (``owner=helm`` Secret) of a release named ``curvine*``."""
    return str((_meta(obj).get("labels") or {}).get("name", "")).startswith("curvine")


def is_watched_deployment(obj: Mapping[str, Any]) -> bool:
    """An endpoint's Deployment (``managed-by=kvfleet``) or the Inference Operator's controller (by name)."""
    meta = _meta(obj)
    if (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == "kvfleet":
        return True
    return meta.get("namespace") == OPERATOR_NAMESPACE and meta.get("name") in OPERATOR_DEPLOYMENTS


@dataclass(frozen=True)
class Watched:
    """One watched collection: ``kind`` names it in events; ``group``/``resource`` are what RBAC grants;
    ``curvine_namespace``: watched in Curvine's namespace only, never cluster-wide; ``selector`` is sent to the API
    server; ``keep`` filters what it cannot express; ``fingerprint_of`` the top-level parts a change of the desired
    state changes (beside labels and annotations); ``events`` the event types that count as a change."""

    kind: str
    group: str
    resource: str
    selector: str | None = None
    curvine_namespace: bool = False
    fingerprint_of: tuple[str, ...] = ("spec",)
    keep: Callable[[Mapping[str, Any]], bool] = _everything
    events: frozenset[str] = CHANGE_EVENTS


MANAGED: Final = f"{MANAGED_BY_LABEL}=kvfleet"
WATCHED: Final = (
    Watched("InferenceEndpointConfig", IEC_GROUP, IEC_PLURAL, MANAGED),
    # Every Deployment: the endpoints' (managed-by label) and the operator's controller (by name).
    Watched("Deployment", "apps", "deployments", keep=is_watched_deployment),
    # Pods come and go with every rollout and node loss (the Deployment shows what was asked); a Pod counts when
    # its labels or annotations are changed by hand.
    Watched("Pod", "", "pods", MANAGED, fingerprint_of=(), events=frozenset({"MODIFIED"})),
    # Helm's release records: a new revision (an upgrade or rollback by hand) is a new Secret; deleting an old one
    # is Helm's own history pruning.
    Watched("Secret", "", "secrets", "owner=helm", curvine_namespace=True, fingerprint_of=("data",),
            keep=is_curvine_release, events=frozenset({"ADDED", "MODIFIED"})),
)


def rbac_rules(*, curvine_namespace: bool) -> tuple[dict[str, list[str]], ...]:
    """The ``watch`` grants ``WATCHED`` needs beyond the drift check's LISTs (k8s/rbac): cluster-wide, or in
    Curvine's namespace (``kvfleet:curvine-namespace``)."""
    return tuple({"apiGroups": [w.group], "resources": [w.resource], "verbs": ["watch"]}
                 for w in WATCHED if w.curvine_namespace == curvine_namespace)


RBAC_CLUSTER_RULES: Final = rbac_rules(curvine_namespace=False)
RBAC_CURVINE_NAMESPACE_RULES: Final = rbac_rules(curvine_namespace=True)


def fingerprint(obj: Mapping[str, Any], parts: tuple[str, ...]) -> str:
    """What a change of the desired state changes: labels, annotations (without controller noise), ``parts``."""
    meta = _meta(obj)
    notes = {k: v for k, v in (meta.get("annotations") or {}).items()
             if not str(k).startswith(NOISY_ANNOTATION_PREFIXES)}
    body = {"labels": meta.get("labels") or {}, "annotations": notes, **{p: obj.get(p) for p in parts}}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def newest_manager(obj: Mapping[str, Any]) -> str | None:
    """The field manager of the newest ``managedFields`` entry, None when there is none."""
    entries = _meta(obj).get("managedFields") or []
    if not isinstance(entries, list) or not entries:
        return None
    newest = max((e for e in entries if isinstance(e, Mapping)), key=lambda e: str(e.get("time") or ""),
                 default=None)
    return str((newest or {}).get("manager") or "") or None


def is_own_change(obj: Mapping[str, Any]) -> bool:
    """Did a kvfleet run make this version? Its field manager wrote last (``managedFields``, kept by the API
    server). What the object itself says (annotations, labels) is not asked: anyone who edits it can write that."""
    manager = newest_manager(obj)
    return manager is not None and manager.startswith(OWN_FIELD_MANAGER_PREFIX)


def object_ref(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (``-`` for a cluster-scoped object)."""
    meta = _meta(obj)
    return f"{meta.get('namespace') or '-'}/{meta.get('name')}"


def what_changed(prev: Mapping[str, Any] | None, obj: Mapping[str, Any]) -> str:
    """For the log: which top-level parts differ from the version seen before."""
    if prev is None:
        return ""
    meta, old = _meta(obj), _meta(prev)
    parts = [k for k in ("labels", "annotations") if meta.get(k) != old.get(k)]
    parts += [k for k in ("spec", "data") if obj.get(k) != prev.get(k)]
    return f": {', '.join(parts)} changed" if parts else ""


@dataclass(frozen=True)
class Change:
    """One reported change: ``type`` is the event's (``added`` / ``modified`` / ``deleted``) or ``resync`` (the
    watch re-listed after a 410 Gone: changes may have been missed); ``detail`` says what differs, for the log."""

    kind: str
    type: str
    object: str
    resource_version: str = ""
    detail: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "type": self.type, "object": self.object,
                "resource_version": self.resource_version}


def resync(kind: str) -> Change:
    return Change(kind, "resync", "*")


# (kind, namespace/name) -> (fingerprint, object) of the version seen last
Seen = dict[tuple[str, str], tuple[str, Mapping[str, Any]]]


def judge(watched: Watched, etype: str, obj: Mapping[str, Any], seen: Seen) -> Change | None:
    """The change one watch event reports, or None; ``seen`` is updated with the event's version. A listed
    object is the baseline (a resumed watch compares its replayed versions with it); a ``MODIFIED`` whose
    fingerprint did not move is a status, ``resourceVersion`` or controller-noise update."""
    if etype not in OBJECT_EVENTS or not watched.keep(obj):
        return None
    key = (watched.kind, object_ref(obj))
    prev = seen.get(key)
    print_ = fingerprint(obj, watched.fingerprint_of)
    if etype == "DELETED":
        seen.pop(key, None)
    else:
        seen[key] = (print_, obj)
    if etype not in watched.events:
        return None
    if etype == "MODIFIED" and prev is not None and prev[0] == print_:
        return None
    if etype != "DELETED" and is_own_change(obj):
        return None
    return Change(watched.kind, etype.lower(), key[1], str(_meta(obj).get("resourceVersion") or ""),
                  what_changed(prev[1] if prev else None, obj))


@dataclass
class Burst:
    """Changes seen since the last event; due once the watch has been quiet for ``quiet_s`` (or the burst has
    lasted ``max_burst_s``: steady churn still reports)."""

    first_at: float = 0.0
    last_at: float = 0.0
    changes: list[Change] = field(default_factory=list)

    def add(self, change: Change, now: float) -> None:
        if not self.changes:
            self.first_at = now
        self.last_at = now
        self.changes.append(change)

    def due(self, now: float, quiet_s: float, max_burst_s: float) -> bool:
        return bool(self.changes) and (now - self.last_at >= quiet_s or now - self.first_at >= max_burst_s)

    def objects(self, limit: int = 50) -> list[str]:
        """``kind:namespace/name`` of each changed object, once, sorted; at most ``limit``."""
        return sorted({f"{c.kind}:{c.object}" for c in self.changes})[:limit]
