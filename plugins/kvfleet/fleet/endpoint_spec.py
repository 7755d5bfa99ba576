"""The desired state of one endpoint: its InferenceEndpointConfig, and the rules a Deployment and its pods must
satisfy for cross-pod L2 sharing to work.

Pure. Used by stage 4 (render, patch, verify), stage 5 and the drift check, so "what correct looks like" is
written once. The L2 overlay of the rendered Deployment (URL, serde, seed, volume, mount) is ONE value,
``fleet.overlay.desired_overlay``; ``l2_violations``, ``overlay_violations``, ``l2_patch`` and ``kyverno_policy``
here are thin derivations of it, kept under their names for stage 4's callers.

Sources: docs/reference/hyperpod.md#what-the-operator-renders. The L2 URL is kept out of the CR: declaring it there
produces a duplicate entry beside the one the operator injects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvfleet.fleet import constants as C
from kvfleet.fleet import overlay as ov
from kvfleet.fleet.inventory import Endpoint, Settings
from kvfleet.fleet.overlay import Violation

# Fields of the CR that the operator refuses to change on an existing endpoint (CRD descriptions, cited in
# tests/conformance/facts/inference_endpoint_config.yaml: "Once set, the enabled field cannot be modified";
# intelligentRoutingSpec "Adding this configuration to an existing deployment will be rejected").
IMMUTABLE_FIELDS = ("intelligentRoutingSpec.enabled",)
# Sections of the spec that cannot be added to an existing endpoint.
NOT_ADDABLE_SECTIONS = ("intelligentRoutingSpec",)
# The CRD's defaults for those fields: what the API server stores when the section is present without the field.
IMMUTABLE_DEFAULTS: dict[str, Any] = {"intelligentRoutingSpec.enabled": False}


def managed_labels(ep: Endpoint) -> dict[str, str]:
    labels = {C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE, C.LOB_LABEL: ep.lob}
    if ep.l2:
        labels[C.L2_LABEL] = "curvine"
    return labels


def worker_env(ep: Endpoint, settings: Settings) -> list[dict[str, str]]:
    """The worker env kvfleet declares in the CR (never the L2 URL: see module docstring)."""
    env = {
        C.ENV_REMOTE_SERDE: settings.serde,
        C.ENV_HASHSEED: settings.hash_seed,
        C.ENV_CHUNK_SIZE: str(settings.chunk_size),
        **{k: str(v) for k, v in ep.env.items()},
    }
    return [{"name": k, "value": env[k]} for k in sorted(env)]


def render_iec(ep: Endpoint, settings: Settings) -> dict[str, Any]:
    kv: dict[str, Any] = {"enableL1Cache": ep.l1, "enableL2Cache": ep.l2}
    if ep.l2:
        kv["l2CacheSpec"] = {"l2CacheBackend": "tieredstorage"}
    return {
        "apiVersion": f"{C.IEC_GROUP}/{C.IEC_VERSION}",
        "kind": C.IEC_KIND,
        "metadata": {"name": ep.name, "namespace": ep.namespace, "labels": managed_labels(ep)},
        "spec": {
            "modelName": ep.model,
            "endpointName": ep.name,
            "instanceType": ep.instance_type,
            "replicas": ep.replicas,
            "invocationEndpoint": "v1/chat/completions",
            "modelSourceConfig": {"modelSourceType": "huggingface", "huggingFaceModel": {"modelId": ep.model_id}},
            "worker": {
                "image": ep.image,
                "modelInvocationPort": {"containerPort": 8000, "name": "http"},
                "modelVolumeMount": {"name": "model-weights", "mountPath": "/opt/ml/model"},
                "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 1}},
                "environmentVariables": worker_env(ep, settings),
            },
            "kvCacheSpec": kv,
            "intelligentRoutingSpec": {"enabled": True, "routingStrategy": ep.routing},
        },
    }


def _get(obj: Mapping[str, Any] | None, dotted: str) -> Any:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


# Fields kvfleet owns in the CR; anything else (defaults the API server filled in) is not compared.
OWNED_FIELDS = ("modelName", "instanceType", "replicas", "worker.image", "kvCacheSpec.enableL1Cache",
                "kvCacheSpec.enableL2Cache", "intelligentRoutingSpec.enabled", "intelligentRoutingSpec.routingStrategy")


def _env_map(env: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    return {str(e.get("name")): e.get("value") for e in env or []}


def cr_differences(live_spec: Mapping[str, Any], desired_spec: Mapping[str, Any]) -> list[Violation]:
    diffs = []
    for field in OWNED_FIELDS:
        want, have = _get(desired_spec, field), _get(live_spec, field)
        if want != have:
            diffs.append(Violation("cr_mismatch", f"spec.{field}", str(want), str(have)))
    want_env = _env_map(_get(desired_spec, "worker.environmentVariables"))
    have_env = _env_map(_get(live_spec, "worker.environmentVariables"))
    for name, value in sorted(want_env.items()):
        if have_env.get(name) != value:
            diffs.append(Violation("cr_mismatch", f"spec.worker.environmentVariables[{name}]", str(value),
                                   str(have_env.get(name))))
    return diffs


def immutable_changes(live_spec: Mapping[str, Any], desired_spec: Mapping[str, Any]) -> list[str]:
    """What the operator would reject on the existing endpoint whose spec is ``live_spec``: a section added that
    the CRD says cannot be added to an existing deployment (intelligentRoutingSpec), or an immutable field changed.
    Each entry names the field, the live and the wanted value; the caller says how to proceed (delete and
    recreate the endpoint deliberately, or revert the inventory)."""
    out = []
    added = set()
    for section in NOT_ADDABLE_SECTIONS:
        if _get(live_spec, section) is None and _get(desired_spec, section) is not None:
            added.add(section)
            out.append(f"spec.{section}: absent on the live endpoint, inventory adds {_get(desired_spec, section)!r} "
                       "(the CRD: adding this configuration to an existing deployment will be rejected)")
    for field in IMMUTABLE_FIELDS:
        if field.split(".", 1)[0] in added:
            continue
        have, want = _get(live_spec, field), _get(desired_spec, field)
        section = field.rsplit(".", 1)[0]
        if have is None and isinstance(_get(live_spec, section), Mapping):
            have = IMMUTABLE_DEFAULTS.get(field)
        if have is not None and have != want:
            out.append(f"spec.{field}: live {have!r}, inventory wants {want!r}")
    return out


# ---- the L2 overlay on the rendered Deployment --------------------------------------------------------------


def vllm_container_index(deployment: Mapping[str, Any]) -> int:
    """The operator names the vLLM container after the Deployment and puts it first
    (docs/reference/hyperpod.md#what-the-operator-renders)."""
    return ov.find_container(_get(deployment, "spec.template.spec") or {}, str(_get(deployment, "metadata.name")))[0]


def pod_is_live(pod: Mapping[str, Any]) -> bool:
    """THE definition of a live pod, whose spec must carry the overlay: not terminating, and Running, Pending or
    not yet given a phase. Stage 4's checks and the drift check both count these."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return not meta.get("deletionTimestamp") and status.get("phase") in ("Running", "Pending", None)


def l2_violations(pod_spec: Mapping[str, Any], container_name: str, settings: Settings,
                  pvc_name: str = C.CURVINE_PVC) -> list[Violation]:
    """Every way a pod spec (a Deployment template or a running pod) breaks cross-pod L2 sharing."""
    return ov.violations(ov.overlay_for(container_name, settings, pvc_name), pod_spec)


# What the L2 overlay (patch or Kyverno) is responsible for: every kind of l2_violations.
OVERLAY_KINDS = ov.VIOLATION_KINDS


def overlay_violations(pod_spec: Mapping[str, Any], container_name: str, settings: Settings,
                       pvc_name: str = C.CURVINE_PVC) -> list[Violation]:
    """Kept for stage 4's callers: the overlay is all of l2_violations now (the patch fixes every kind)."""
    return l2_violations(pod_spec, container_name, settings, pvc_name)


def l2_patch(deployment: Mapping[str, Any], settings: Settings, pvc_name: str = C.CURVINE_PVC) -> list[dict[str, Any]]:
    """ONE JSON patch that puts the overlay on the Deployment (``fleet.overlay.json_patch``); empty exactly when
    its template has no ``l2_violations``."""
    name = str(_get(deployment, "metadata.name"))
    return ov.json_patch(ov.overlay_for(name, settings, pvc_name), deployment)


def pvc_manifest(namespace: str, storage_class: str, size: str = "100Gi", name: str = C.CURVINE_PVC) -> dict[str, Any]:
    """The ReadWriteMany PVC the inference pods mount (one per endpoint namespace)."""
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE}},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": storage_class,
                 "resources": {"requests": {"storage": size}}},
    }


def kyverno_policy(settings: Settings, pvc_name: str = C.CURVINE_PVC,
                   name: str = "kvfleet-curvine-l2") -> dict[str, Any]:
    """The ClusterPolicy of `kyverno` mode: on every admission of a Deployment labelled tiered-kv/l2=curvine,
    inject the overlay (``fleet.overlay.kyverno_mutation``) into the vLLM container — the one named after the
    Deployment, selected with a conditional anchor."""
    overlay = ov.overlay_for(ov.KYVERNO_CONTAINER, settings, pvc_name)
    return {
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
        "metadata": {"name": name, "labels": {C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE},
                     "annotations": {"policies.kyverno.io/description":
                                     "Inject the Curvine L2 mount and LMCache fs:// URL into operator-rendered "
                                     "vLLM Deployments, so they survive every operator re-render."}},
        "spec": {
            "background": False,
            "rules": [{
                "name": "curvine-l2",
                "match": {"any": [{"resources": {"kinds": ["Deployment"],
                                                 "selector": {"matchLabels": {C.L2_LABEL: "curvine"}}}}]},
                "mutate": {"patchStrategicMerge": ov.kyverno_mutation(overlay)},
            }],
        },
    }
