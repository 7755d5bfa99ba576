"""The SageMaker HyperPod Inference Operator, simulated: installation through its EKS add-on, rendering of every
InferenceEndpointConfig into a Deployment and Service, a reconcile loop that overwrites manual patches, and the
conversion webhook that fails while the controller is scaled to 0.

Attached by ``kvfleet_sandbox.runtime`` to every cluster twin, after ``workloads`` (whose pods it waits on). It
exists so that stage 2 and stage 4 of a rollout meet the same traps as on AWS (docs/reference/hyperpod.md):

**Controller name.** The EKS add-on names the controller ``hyperpod-inference-controller-manager``; the
Helm chart of aws/sagemaker-hyperpod-cli ``hyperpod-inference-operator-controller-manager`` (same namespace,
labels ``control-plane=<name>``, ``app.kubernetes.io/name=hyperpod-inference-operator``; facts and sources in
``tests/conformance/facts/inference_operator.yaml``). The twin installs either (``KVFLEET_SANDBOX_OPERATOR_INSTALL=
helm``, or ``reinstall_as(name)``), so kvfleet's discovery is exercised against both.

**Installation.** When the EKS add-on ``amazon-sagemaker-hyperpod-inference`` is about to become ACTIVE on this
twin's EKS cluster, the operator installs namespace ``hyperpod-inference-system``, Deployment
``hyperpod-inference-controller-manager`` (1 replica, container ``manager``, label ``control-plane``), Service
``hyperpod-inference-conversion-webhook`` and the real InferenceEndpointConfig CRD (``sandbox/data``).
*Add-on strictness (a choice, documented here):* the add-on fails (CREATE_FAILED / UPDATE_FAILED, with the text
below as its health issue) unless **all four** dependencies of ``ADDON_ORDER`` are ACTIVE first —
``aws-mountpoint-s3-csi-driver``, ``aws-fsx-csi-driver``, ``metrics-server`` and ``cert-manager``. The AWS setup
guide and the blog list all four as prerequisites; cert-manager is the one that really breaks the operator (its
webhook certificate), and being strict about the others means kvfleet's stage 2 must install them in order, as
the sources say. Message form, one clause per missing add-on::

    amazon-sagemaker-hyperpod-inference requires add-ons that are not ACTIVE on EKS cluster <eks>:
    cert-manager (CREATING). Install them first, in this order: aws-mountpoint-s3-csi-driver, ...

An add-on UPDATE to another version changes :attr:`InferenceOperator.version`, which makes every endpoint
re-render at its next reconcile (the blog: "upgrading the Operator" drops patches).

**Rendering** of InferenceEndpointConfig ``<name>`` in namespace N (the same on every reconcile):

- Deployment ``<name>``: labels = the IEC's metadata labels + ``app=<name>`` (also on the pod template; selector
  ``app=<name>``); annotation ``inference.sagemaker.aws.amazon.com/operator-version``; ownerReference to the IEC;
  ``replicas`` = ``spec.replicas``; default RollingUpdate strategy (25 % / 25 %); required node affinity on
  ``node.kubernetes.io/instance-type`` when ``instanceType``/``instanceTypes`` is set.
- ``containers[0]`` named ``<name>``: ``worker.image``, ``args``/``command``/``workingDir``, port
  ``worker.modelInvocationPort`` (default 8000, name ``http``), ``worker.resources`` (``nvidia.com/gpu: 1`` in
  requests and limits when none is asked for), the ``modelVolumeMount``, and env in this order:
  ``NODE_IP`` (downward API ``status.hostIP``); when L1 is on (``kvCacheSpec.enableL1Cache``, on by default)
  ``LMCACHE_USE_EXPERIMENTAL=True``, ``LMCACHE_LOCAL_CPU=True``, ``LMCACHE_MAX_LOCAL_CPU_SIZE=<GiB>`` (node memory ×
  the cluster's InstanceMemoryAllocationPercentage, 20 % when tiered storage is off), ``LMCACHE_CHUNK_SIZE=256``;
  then ``worker.environmentVariables`` as given. With ``enableL2Cache`` the operator inserts
  ``LMCACHE_REMOTE_URL=sagemaker-hyperpod://$(NODE_IP):9200`` (``l2CacheLocalUrl`` for the redis backend) at an
  index in the middle of that list that depends on the operator version (never first, so ``$(NODE_IP)`` resolves,
  and never last) — docs/reference/hyperpod.md#what-the-operator-renders: the index "varies between Operator versions".
  An L2 URL in the worker's own env is *not* deduplicated: the rendered Deployment then has two entries, as the blog
  warns.
- sidecars ``reverse-proxy`` and ``otel-collector``.
- Service ``<name>``: ClusterIP, port ``http`` 8000 → the vLLM port, selector ``app=<name>``. That a Service is
  rendered is stated by the blog; its name and port are an *assumption* no public source confirms
  (``tests/conformance/facts/service_proxy.yaml``, ``operator_service``). Traffic reaches the pods through the
  API server's Service proxy, ``services/<name>:8000/proxy/...``, which picks only Ready pods (``kube.services``).

**Reconcile**, only while the controller Deployment has at least one Ready pod: on every change of an IEC or of a
Deployment/Service it owns, and every ``settings.operator_resync_s`` model seconds. It re-renders (a full
replace of the Deployment through the API store, so admission — simulated Kyverno — sees it) when the IEC is new
or ``metadata.generation != status.observedGeneration``; the Deployment is missing; the operator version differs
from the one that rendered it; a re-render was forced (:meth:`InferenceOperator.rerender_now`); or the Deployment
is not fully available (observedGeneration lagging, ``spec.replicas`` differing from the IEC, or updated /
available / total replicas not all equal to it). Otherwise the Deployment is left alone, so a patch made while the
operator was paused survives its restore once the pods are Ready. Status (``state``, ``deploymentStatus``,
``replicas``, ``selector``, ``observedGeneration``) is written on every reconcile when it changed.

**Conversion webhook.** While the operator is installed and its controller has no Ready pod, creating or updating
an InferenceEndpointConfig fails with HTTP 500 (InternalError) and the apiserver's "no endpoints available for
service" message. Deleting an IEC deletes its Deployment and Service at once (that is Kubernetes' garbage
collector following ownerReferences, so it happens even while the operator is paused).

``twin.services["operator"]`` is the :class:`InferenceOperator`: ``version``, ``installed``,
``rerender_now(namespace=None, name=None)``, ``controller_ready()``.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import zlib
from pathlib import Path
from typing import Any

import yaml

from kvfleet.fleet.constants import (
    ADDON_ORDER,
    IEC_GROUP,
    IEC_KIND,
    IEC_PLURAL,
    IEC_VERSION,
    OPERATOR_ADDON,
    OPERATOR_DEPLOYMENT,
    OPERATOR_HELM_DEPLOYMENT,
    OPERATOR_L2_URL,
    OPERATOR_NAMESPACE,
)
from kvfleet_sandbox.controllers._objects import (
    ReconcileLoop,
    controller_uid,
    create_quietly,
    delete_quietly,
    ensure_namespace,
    is_ready,
    owner_ref,
    quantity,
    stamp,
)
from kvfleet_sandbox.kube.errors import ApiError
from kvfleet_sandbox.twin import ClusterTwin

log = logging.getLogger(__name__)

CRD_FILE = Path(__file__).resolve().parents[1] / "data" / f"{IEC_GROUP}_{IEC_PLURAL}.yaml"
WEBHOOK_SERVICE = "hyperpod-inference-conversion-webhook"
CONTROL_PLANE_LABEL = "control-plane"
VERSION_ANNOTATION = "inference.sagemaker.aws.amazon.com/operator-version"
DEFAULT_VERSION = "v1.0.0-eksbuild.1"
DEPENDENCIES = tuple(a for a in ADDON_ORDER if a != OPERATOR_ADDON)
SERVICE_PORT = 8000
OPERATOR_IMAGE = "{account}.dkr.ecr.{region}.amazonaws.com/hyperpod-inference-operator:{version}"
REVERSE_PROXY_IMAGE = "{account}.dkr.ecr.{region}.amazonaws.com/hyperpod-inference-reverse-proxy:{version}"
OTEL_IMAGE = "public.ecr.aws/aws-observability/aws-otel-collector:v0.43.1"
WEBHOOK_MESSAGE = (
    f"conversion webhook for {IEC_GROUP}/{IEC_VERSION}, Kind={IEC_KIND} failed: Post "
    f'"https://{WEBHOOK_SERVICE}.{OPERATOR_NAMESPACE}.svc:443/convert?timeout=30s": no endpoints available for '
    f'service "{WEBHOOK_SERVICE}"')


def _webhook_error() -> ApiError:
    return ApiError(500, "InternalError", WEBHOOK_MESSAGE)


def load_crd() -> dict[str, Any]:
    """The real InferenceEndpointConfig CRD, with the Helm placeholders filled in as the add-on installs it."""
    text = CRD_FILE.read_text()
    text = text.replace("{{ .Values.namePrefix }}", "hyperpod-inference").replace(
        "{{ .Values.shortPrefix }}", "hyperpod-inference")
    crd: dict[str, Any] = yaml.safe_load(text)
    return crd


def l2_index(version: str, length: int) -> int:
    """Where the operator puts its L2 URL in an env list of ``length`` entries: in the middle, version-dependent."""
    if length <= 1:
        return length
    return 1 + zlib.crc32(version.encode()) % (length - 1)


def _gib(memory: Any) -> float:
    return quantity(memory) / 2**30


class InferenceOperator:
    """One operator per cluster twin; see the module docstring."""

    def __init__(self, twin: ClusterTwin) -> None:
        self.twin = twin
        self.store = twin.store
        self.clock = twin.clock
        self.version = DEFAULT_VERSION
        self.installed = False
        self._lock = threading.Lock()
        self._dirty: set[tuple[str, str]] = set()
        self._forced: set[tuple[str, str]] = set()
        self._deleted: list[tuple[str, str]] = []  # (namespace, IEC uid) whose objects must go
        self._was_ready = False
        self._last_resync = 0.0
        self._loop = ReconcileLoop(f"operator:{twin.name}", twin.clock, twin.settings.operator_resync_s, self._pass)
        # The controller's name: the EKS add-on's, or the Helm chart's (tests/conformance/facts/
        # inference_operator.yaml); KVFLEET_SANDBOX_OPERATOR_INSTALL=helm, an existing Helm-named Deployment, or
        # reinstall_as() chooses the chart's.
        self.deployment_name = OPERATOR_HELM_DEPLOYMENT if os.environ.get("KVFLEET_SANDBOX_OPERATOR_INSTALL") == \
            "helm" else OPERATOR_DEPLOYMENT
        twin.aws.on_addon_transition(self._on_addon, account=twin.account)
        self.store.add_admission(self._admit)
        self.store.subscribe(self._on_event)
        existing = [n for n in (OPERATOR_DEPLOYMENT, OPERATOR_HELM_DEPLOYMENT)
                    if self.store.get("apps", "deployments", n, OPERATOR_NAMESPACE) is not None]
        if existing:
            self.deployment_name = existing[0]
        if twin.aws.addon_status(twin.eks_name, OPERATOR_ADDON, account=twin.account) == "ACTIVE" or existing:
            self._install()
        twin.services["operator"] = self
        self._loop.start()

    # --- public -------------------------------------------------------------------------------------------

    def rerender_now(self, namespace: str | None = None, name: str | None = None) -> list[tuple[str, str]]:
        """Force a re-render of one endpoint, a namespace's, or all, at the next reconcile (an operator upgrade
        seen from the endpoint's side). Returns the endpoints marked."""
        keys = [k for k in self._iec_keys() if namespace in (None, k[0]) and name in (None, k[1])]
        with self._lock:
            self._forced.update(keys)
            self._dirty.update(keys)
        self._loop.wake()
        return keys

    def controller_ready(self) -> bool:
        pods = self.store.list("", "pods", OPERATOR_NAMESPACE,
                               label_selector=f"{CONTROL_PLANE_LABEL}={self.deployment_name}")
        return any(is_ready(p) for p in pods)

    def reinstall_as(self, name: str) -> str:
        """Move the controller to another name, as a Helm install (``hyperpod-inference-operator-controller-
        manager``) or the EKS add-on (``hyperpod-inference-controller-manager``) would name it. Returns the name."""
        if name not in (OPERATOR_DEPLOYMENT, OPERATOR_HELM_DEPLOYMENT):
            raise ValueError(f"operator controller name must be {OPERATOR_DEPLOYMENT} or {OPERATOR_HELM_DEPLOYMENT}, "
                             f"not {name!r}")
        if name != self.deployment_name:
            delete_quietly(self.store, "apps", "deployments", self.deployment_name, OPERATOR_NAMESPACE)
            delete_quietly(self.store, "", "services", WEBHOOK_SERVICE, OPERATOR_NAMESPACE)
            self.deployment_name = name
        self._install()
        self._loop.wake()
        return name

    def stop(self) -> None:
        self._loop.stop()
        if self.twin.services.get("operator") is self:
            self.twin.services.pop("operator", None)

    # --- add-on and installation --------------------------------------------------------------------------

    def _on_addon(self, eks_name: str, addon_name: str, addon: dict[str, Any]) -> str | None:
        if eks_name != self.twin.eks_name or addon_name != OPERATOR_ADDON:
            return None
        missing = []
        for dep in DEPENDENCIES:
            status = self.twin.aws.addon_status(eks_name, dep, account=self.twin.account)
            if status != "ACTIVE":
                missing.append(f"{dep} ({status or 'not installed'})")
        if missing:
            return (f"{OPERATOR_ADDON} requires add-ons that are not ACTIVE on EKS cluster {eks_name}: "
                    f"{', '.join(missing)}. Install them first, in this order: {', '.join(DEPENDENCIES)}.")
        self.version = addon.get("addonVersion") or self.version
        try:
            self._install()
        except ApiError as err:
            return f"{OPERATOR_ADDON} could not install its controller: {err.message}"
        self._loop.wake()
        return None

    def _install(self) -> None:
        store = self.store
        ensure_namespace(store, OPERATOR_NAMESPACE, {CONTROL_PLANE_LABEL: self.deployment_name})
        create_quietly(store, "", "serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": self.deployment_name, "namespace": OPERATOR_NAMESPACE}})
        crd = load_crd()
        if store.get("apiextensions.k8s.io", "customresourcedefinitions", crd["metadata"]["name"]) is None:
            store.create("apiextensions.k8s.io", "customresourcedefinitions", crd)
        labels = {CONTROL_PLANE_LABEL: self.deployment_name, "app.kubernetes.io/name": "hyperpod-inference-operator"}
        image = OPERATOR_IMAGE.format(account=self.twin.aws.account_id, region=self.twin.region,
                                      version=self.version)
        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": self.deployment_name, "namespace": OPERATOR_NAMESPACE, "labels": dict(labels)},
            "spec": {"replicas": 1, "selector": {"matchLabels": {CONTROL_PLANE_LABEL: self.deployment_name}},
                     "template": {"metadata": {"labels": dict(labels)}, "spec": {
                         "serviceAccountName": self.deployment_name,
                         "containers": [{"name": "manager", "image": image, "args": ["--leader-elect"],
                                         "ports": [{"name": "webhook-server", "containerPort": 9443}],
                                         "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}]}}},
        }
        if create_quietly(store, "apps", "deployments", deployment) is None:
            def upgrade(obj: dict[str, Any]) -> dict[str, Any] | None:
                containers = obj["spec"]["template"]["spec"].get("containers") or []
                if not containers or containers[0].get("image") == image:
                    return None
                containers[0]["image"] = image
                return obj
            store.mutate("apps", "deployments", self.deployment_name, OPERATOR_NAMESPACE, upgrade)
        create_quietly(store, "", "services", {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": WEBHOOK_SERVICE, "namespace": OPERATOR_NAMESPACE, "labels": dict(labels)},
            "spec": {"selector": {CONTROL_PLANE_LABEL: self.deployment_name},
                     "ports": [{"port": 443, "targetPort": 9443, "protocol": "TCP"}]}})
        self.installed = True

    # --- webhook and events -------------------------------------------------------------------------------

    def _admit(self, op: str, group: str, resource: str, new: dict[str, Any],
               old: dict[str, Any] | None) -> dict[str, Any]:
        if (group, resource) == (IEC_GROUP, IEC_PLURAL) and op in ("CREATE", "UPDATE") and self.installed \
                and not self.controller_ready():
            raise _webhook_error()
        return new

    def _on_event(self, kind: str, group: str, resource: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace", "")
        if (group, resource) == (IEC_GROUP, IEC_PLURAL):
            with self._lock:
                if kind == "DELETED":
                    self._deleted.append((ns, meta.get("uid", "")))
                    self._forced.discard((ns, meta["name"]))
                else:
                    self._dirty.add((ns, meta["name"]))
            self._loop.wake()
        elif (group, resource) in (("apps", "deployments"), ("", "services")):
            owner = next((r for r in meta.get("ownerReferences") or [] if r.get("kind") == IEC_KIND), None)
            if owner is not None:
                with self._lock:
                    self._dirty.add((ns, owner["name"]))
                self._loop.wake()
            elif ns == OPERATOR_NAMESPACE:
                self._loop.wake()
        elif resource == "pods" and ns == OPERATOR_NAMESPACE:
            self._loop.wake()

    # --- the loop -----------------------------------------------------------------------------------------

    def _iec_keys(self) -> list[tuple[str, str]]:
        try:
            return [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in self.store.list(IEC_GROUP, IEC_PLURAL)]
        except ApiError:
            return []

    def _pass(self) -> float | None:
        self._collect_garbage()
        resync = self.twin.settings.operator_resync_s
        if not self.installed or not self.controller_ready():
            self._was_ready = False
            return None
        now = self.clock.now()
        full = not self._was_ready or now - self._last_resync >= resync
        self._was_ready = True
        with self._lock:
            keys, self._dirty = set(self._dirty), set()
        if full:
            self._last_resync = now
            keys.update(self._iec_keys())
        for key in sorted(keys):
            try:
                self._reconcile(*key)
            except ApiError as err:
                log.info("operator %s: reconcile of %s/%s: %s", self.twin.name, *key, err.message)
                with self._lock:
                    self._dirty.add(key)
        return max(0.0, resync - (self.clock.now() - self._last_resync))

    def _collect_garbage(self) -> None:
        with self._lock:
            deleted, self._deleted = self._deleted, []
        for ns, uid in deleted:
            for group, resource in (("apps", "deployments"), ("", "services")):
                for obj in self.store.list(group, resource, ns):
                    if controller_uid(obj, IEC_KIND) == uid:
                        delete_quietly(self.store, group, resource, obj["metadata"]["name"], ns)

    def _reconcile(self, ns: str, name: str) -> None:
        iec = self.store.get(IEC_GROUP, IEC_PLURAL, name, ns)
        if iec is None:
            return
        dep = self.store.get("apps", "deployments", name, ns)
        with self._lock:
            forced = (ns, name) in self._forced
        error = None
        if dep is not None and controller_uid(dep, IEC_KIND) != iec["metadata"]["uid"]:
            error = f"Deployment {ns}/{name} exists and is not owned by InferenceEndpointConfig {name}"
        elif self._needs_render(iec, dep, forced):
            try:
                dep = self._render_into_store(iec, dep)
                self._ensure_service(iec)
                with self._lock:
                    self._forced.discard((ns, name))
            except ApiError as err:
                error = f"rendering Deployment {ns}/{name} failed: {err.message}"
                dep = self.store.get("apps", "deployments", name, ns)
        else:
            self._ensure_service(iec)
        self._write_status(iec, dep, error)

    def _needs_render(self, iec: dict[str, Any], dep: dict[str, Any] | None, forced: bool) -> bool:
        observed = (iec.get("status") or {}).get("observedGeneration")
        if forced or dep is None or observed != iec["metadata"].get("generation"):
            return True
        if (dep["metadata"].get("annotations") or {}).get(VERSION_ANNOTATION) != self.version:
            return True
        return not self._fully_available(iec, dep)

    @staticmethod
    def _fully_available(iec: dict[str, Any], dep: dict[str, Any]) -> bool:
        want = int((iec.get("spec") or {}).get("replicas", 1))
        status = dep.get("status") or {}
        return (int(status.get("observedGeneration", 0)) >= int(dep["metadata"].get("generation", 1))
                and int((dep.get("spec") or {}).get("replicas", 1)) == want
                and int(status.get("updatedReplicas", 0)) == want
                and int(status.get("availableReplicas", 0)) >= want
                and int(status.get("replicas", 0)) == want)

    # --- rendering ----------------------------------------------------------------------------------------

    def _l1_size_gib(self) -> str:
        nodes = [n for n in self.store.list("", "nodes") if n["metadata"]["name"] in self.twin.gpu_nodes]
        memory = _gib(((nodes[0].get("status") or {}).get("capacity") or {}).get("memory")) if nodes else 64.0
        cluster = self.twin.aws.hyperpod_cluster(self.twin.name, account=self.twin.account) or {}
        tiered = cluster.get("TieredStorageConfig") or {}
        percent = tiered.get("InstanceMemoryAllocationPercentage") if tiered.get("Mode") == "Enable" else None
        size = memory * float(percent or 20) / 100
        return f"{size:.0f}" if size >= 1 else f"{size:.2f}"

    def render_env(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        kv = spec.get("kvCacheSpec") or {}
        env: list[dict[str, Any]] = [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                                                    "fieldPath": "status.hostIP"}}}]
        if kv.get("enableL1Cache", True):
            env += [{"name": "LMCACHE_USE_EXPERIMENTAL", "value": "True"},
                    {"name": "LMCACHE_LOCAL_CPU", "value": "True"},
                    {"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": self._l1_size_gib()},
                    {"name": "LMCACHE_CHUNK_SIZE", "value": "256"}]
        env += copy.deepcopy((spec.get("worker") or {}).get("environmentVariables") or [])
        if kv.get("enableL2Cache", False):
            l2 = kv.get("l2CacheSpec") or {}
            url = l2.get("l2CacheLocalUrl") if str(l2.get("l2CacheBackend", "")).lower() == "redis" and \
                l2.get("l2CacheLocalUrl") else OPERATOR_L2_URL
            env.insert(l2_index(self.version, len(env)), {"name": "LMCACHE_REMOTE_URL", "value": url})
        return env

    def render(self, iec: dict[str, Any]) -> dict[str, Any]:
        """The Deployment this operator version renders for an InferenceEndpointConfig."""
        meta, spec = iec["metadata"], iec.get("spec") or {}
        name, ns = meta["name"], meta["namespace"]
        worker = spec.get("worker") or {}
        labels = {**(meta.get("labels") or {}), "app": name}
        port = worker.get("modelInvocationPort") or {}
        resources = copy.deepcopy(worker.get("resources") or {})
        if not any("nvidia.com/gpu" in (resources.get(k) or {}) for k in ("limits", "requests")):
            resources.setdefault("requests", {})["nvidia.com/gpu"] = "1"
            resources.setdefault("limits", {})["nvidia.com/gpu"] = "1"
        vllm: dict[str, Any] = {
            "name": name, "image": worker.get("image", ""),
            "ports": [{"name": port.get("name", "http"), "containerPort": int(port.get("containerPort", 8000)),
                       "protocol": "TCP"}],
            "env": self.render_env(spec), "resources": resources, "imagePullPolicy": "IfNotPresent"}
        for key in ("args", "command", "workingDir"):
            if worker.get(key):
                vllm[key] = copy.deepcopy(worker[key])
        volumes = []
        mount = worker.get("modelVolumeMount") or {}
        if mount.get("name"):
            vllm["volumeMounts"] = [{"name": mount["name"], "mountPath": mount.get("mountPath", "/opt/ml/model")}]
            volumes.append(self._model_volume(mount["name"], spec.get("modelSourceConfig") or {}))
        account, region = self.twin.aws.account_id, self.twin.region
        pod_spec: dict[str, Any] = {
            "containers": [
                vllm,
                {"name": "reverse-proxy", "image": REVERSE_PROXY_IMAGE.format(account=account, region=region,
                                                                             version=self.version),
                 "ports": [{"name": "proxy", "containerPort": 8443, "protocol": "TCP"}],
                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}},
                {"name": "otel-collector", "image": OTEL_IMAGE,
                 "ports": [{"name": "otlp", "containerPort": 4317, "protocol": "TCP"}],
                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}},
            ],
            "volumes": volumes,
        }
        types = spec.get("instanceTypes") or ([spec["instanceType"]] if spec.get("instanceType") else [])
        if types:
            pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(types)}]}]}}}
        return {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                         "annotations": {VERSION_ANNOTATION: self.version}, "ownerReferences": [owner_ref(iec)]},
            "spec": {"replicas": int(spec.get("replicas", 1)), "selector": {"matchLabels": {"app": name}},
                     "strategy": {"type": "RollingUpdate",
                                  "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                     "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
                     "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec}},
        }

    @staticmethod
    def _model_volume(name: str, source: dict[str, Any]) -> dict[str, Any]:
        kind = source.get("modelSourceType")
        if kind == "s3":
            bucket = ((source.get("s3Storage") or {}).get("bucketName")) or "model-bucket"
            return {"name": name, "csi": {"driver": "s3.csi.aws.com", "volumeAttributes": {"bucketName": bucket}}}
        if kind == "fsx":
            fs = (source.get("fsxStorage") or {}).get("fileSystemId") or "fs-sandbox"
            return {"name": name, "csi": {"driver": "fsx.csi.aws.com", "volumeAttributes": {"fileSystemId": fs}}}
        return {"name": name, "emptyDir": {}}

    def _render_into_store(self, iec: dict[str, Any], dep: dict[str, Any] | None) -> dict[str, Any]:
        """Create, or replace the Deployment's labels and whole spec (through admission, like the real
        operator's client writes); a stale resourceVersion is retried."""
        desired = self.render(iec)
        meta = desired["metadata"]
        for _ in range(5):
            if dep is None:
                try:
                    return self.store.create("apps", "deployments", desired)
                except ApiError as err:
                    if err.reason != "AlreadyExists":
                        raise
                    dep = self.store.get("apps", "deployments", meta["name"], meta["namespace"])
                    continue
            obj = copy.deepcopy(dep)
            obj["metadata"]["labels"] = meta["labels"]
            obj["metadata"].setdefault("annotations", {}).update(meta["annotations"])
            obj["metadata"]["ownerReferences"] = meta["ownerReferences"]
            obj["spec"] = desired["spec"]
            try:
                return self.store.update("apps", "deployments", obj)
            except ApiError as err:
                if err.reason != "Conflict":
                    raise
                dep = self.store.get("apps", "deployments", meta["name"], meta["namespace"])
        raise ApiError(409, "Conflict", f"Deployment {meta['namespace']}/{meta['name']} kept changing")

    def _ensure_service(self, iec: dict[str, Any]) -> None:
        meta = iec["metadata"]
        if self.store.get("", "services", meta["name"], meta["namespace"]) is not None:
            return
        port = ((iec.get("spec") or {}).get("worker") or {}).get("modelInvocationPort") or {}
        create_quietly(self.store, "", "services", {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "labels": {**(meta.get("labels") or {}), "app": meta["name"]},
                         "ownerReferences": [owner_ref(iec)]},
            "spec": {"type": "ClusterIP", "selector": {"app": meta["name"]},
                     "ports": [{"name": "http", "port": SERVICE_PORT, "protocol": "TCP",
                                "targetPort": int(port.get("containerPort", SERVICE_PORT))}]}})

    # --- status -------------------------------------------------------------------------------------------

    def _write_status(self, iec: dict[str, Any], dep: dict[str, Any] | None, error: str | None) -> None:
        meta = iec["metadata"]
        name = meta["name"]
        dstatus = (dep or {}).get("status") or {}
        progressing: dict[str, Any] = next((c for c in dstatus.get("conditions") or []
                                            if c.get("type") == "Progressing"), {})
        if error:
            state, reason, message = "DeploymentFailed", "RenderFailed", error
        elif progressing.get("reason") == "ProgressDeadlineExceeded":
            state, reason, message = "DeploymentFailed", "ProgressDeadlineExceeded", progressing.get("message", "")
        elif dep is not None and self._fully_available(iec, dep):
            state, reason, message = "DeploymentComplete", "NewReplicaSetAvailable", "Deployment is available"
        else:
            ready = int(dstatus.get("readyReplicas", 0))
            want = int((iec.get("spec") or {}).get("replicas", 1))
            state, reason, message = ("DeploymentInProgress", progressing.get("reason", "DeploymentCreated"),
                                      f"{ready}/{want} replicas ready")
        old = copy.deepcopy(iec.get("status") or {})
        status = dict(old)
        status.update({
            "state": state, "replicas": int(dstatus.get("replicas", 0)), "selector": f"app={name}",
            "deploymentStatus": {
                "name": name, "deploymentObjectOverallState": state, "reason": reason, "message": message,
                "status": {k: int(dstatus.get(k, 0)) for k in
                           ("availableReplicas", "readyReplicas", "replicas", "updatedReplicas")},
                "lastUpdated": (old.get("deploymentStatus") or {}).get("lastUpdated")}})
        if error is None:
            status["observedGeneration"] = meta.get("generation", 1)
        if status == old:
            return
        status["deploymentStatus"]["lastUpdated"] = stamp(self.clock)

        def write(obj: dict[str, Any]) -> dict[str, Any] | None:
            if obj["metadata"].get("uid") != meta.get("uid"):
                return None
            if error is None and obj["metadata"].get("generation") != meta.get("generation"):
                return None  # the spec moved on since this render; the next reconcile handles it
            obj["status"] = status
            return obj
        self.store.mutate(IEC_GROUP, IEC_PLURAL, name, meta["namespace"], write)


def attach(twin: ClusterTwin) -> InferenceOperator:
    return InferenceOperator(twin)


__all__ = ["WEBHOOK_MESSAGE", "InferenceOperator", "attach", "l2_index", "load_crd"]
