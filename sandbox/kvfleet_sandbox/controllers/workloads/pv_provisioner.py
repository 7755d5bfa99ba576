"""The PersistentVolume provisioner and binder of a sandbox cluster: a claim in a ``curvine`` StorageClass binds
only while the Curvine master runs (``twin.curvine_master_running()``) and its PV points at
``<fs-path>/pvc-<uid>`` (docs/reference/curvine.md#pv-path); EBS classes bind at once, or, with ``volumeBindingMode:
WaitForFirstConsumer`` (what EKS's gp3 class and the sandbox's ``ebs-sc`` use), as soon as a pod uses the claim,
like the real provisioner; any other provisioner leaves the claim Pending with the external-provisioner event.

Run by ``kvfleet_sandbox.controllers.workloads.WorkloadController`` in every pass.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvfleet_sandbox.controllers._objects import create_quietly, is_terminal, uid_of
from kvfleet_sandbox.controllers.workloads._cache import Snapshot, claims_of
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter

DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
EBS_PROVISIONERS = ("ebs.csi.aws.com", "kubernetes.io/aws-ebs")
CURVINE_PROVISIONER = "curvine"


class PvProvisioner:
    """See the module docstring; one per cluster twin."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer

    def run(self, snap: Snapshot) -> None:
        consumers = {(p["metadata"]["namespace"], c) for p in snap.pods if not is_terminal(p) for c in claims_of(p)}
        default = next((c for c in snap.classes.values()
                        if (c["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"), None)
        for pvc in snap.pvcs:
            if (pvc.get("status") or {}).get("phase") == "Bound":
                continue
            meta = pvc["metadata"]
            class_name = (pvc.get("spec") or {}).get("storageClassName")
            if class_name is None and default is not None:
                class_name = default["metadata"]["name"]
            sc = snap.classes.get(class_name or "")
            if sc is None:
                message = (f'storageclass.storage.k8s.io "{class_name}" not found' if class_name else
                           "no persistent volumes available for this claim and no storage class is set")
                self._pending(pvc, "ProvisioningFailed", message)
                continue
            if sc.get("volumeBindingMode") == "WaitForFirstConsumer" and \
                    (meta["namespace"], meta["name"]) not in consumers:
                self._pending(pvc, "WaitForFirstConsumer",
                              "waiting for first consumer to be created before binding", warning=False)
                continue
            self._provision(pvc, sc)

    def _pending(self, pvc: dict[str, Any], reason: str, message: str, *, warning: bool = True) -> None:
        if (pvc.get("status") or {}).get("phase") != "Pending":
            self.w.set_status("", "persistentvolumeclaims", pvc, {"phase": "Pending"})
        self.w.events.record(pvc, reason, message, warning=warning)

    def _curvine_source(self, pvc: dict[str, Any], sc: dict[str, Any], pv_name: str) -> dict[str, Any] | None:
        """The CSI source of a Curvine volume, or None (the claim is left Pending with the driver's error)."""
        params = dict(sc.get("parameters") or {})
        sc_name = sc["metadata"]["name"]
        for required in ("master-addrs", "fs-path"):
            if not params.get(required):
                self._pending(pvc, "ProvisioningFailed",
                              f'failed to provision volume with StorageClass "{sc_name}": rpc error: '
                              f"code = InvalidArgument desc = Parameter '{required}' is required")
                return None
        if not self.w.twin.curvine_master_running():
            self._pending(pvc, "ProvisioningFailed",
                          f'failed to provision volume with StorageClass "{sc_name}": rpc error: code = '
                          f"Unavailable desc = curvine master {params['master-addrs']} is not reachable")
            return None
        path = f"{params['fs-path'].rstrip('/')}/{pv_name}"
        return {"driver": CURVINE_PROVISIONER,
                "volumeHandle": f"{params.get('cluster-id', 'curvine')}@{params['fs-path']}@{pv_name}",
                "volumeAttributes": {**params, "curvine-path": path, "path": path}}

    def _source(self, pvc: dict[str, Any], sc: dict[str, Any], pv_name: str) -> dict[str, Any] | None:
        provisioner = sc.get("provisioner", "")
        if provisioner == CURVINE_PROVISIONER:
            return self._curvine_source(pvc, sc, pv_name)
        if provisioner in EBS_PROVISIONERS:
            params = dict(sc.get("parameters") or {})
            volume_id = "vol-" + hashlib.sha256(pv_name.encode()).hexdigest()[:17]
            return {"driver": "ebs.csi.aws.com", "volumeHandle": volume_id, "fsType": params.get("fsType", "ext4"),
                    "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "ebs.csi.aws.com"}}
        self._pending(pvc, "ExternalProvisioning",
                      f"Waiting for a volume to be created either by the external provisioner "
                      f"'{provisioner}' or manually by the system administrator. If volume creation "
                      "is delayed, please verify that the provisioner is running and correctly "
                      "registered.", warning=False)
        return None

    def _provision(self, pvc: dict[str, Any], sc: dict[str, Any]) -> None:
        provisioner = sc.get("provisioner", "")
        sc_name = sc["metadata"]["name"]
        pv_name = f"pvc-{uid_of(pvc)}"
        csi = self._source(pvc, sc, pv_name)
        if csi is None:
            return
        spec = pvc.get("spec") or {}
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        modes = spec.get("accessModes") or ["ReadWriteOnce"]
        meta = pvc["metadata"]
        create_quietly(self.w.store, "", "persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv_name, "annotations": {"pv.kubernetes.io/provisioned-by": provisioner}},
            "spec": {"capacity": {"storage": storage}, "accessModes": modes, "csi": csi,
                     "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy", "Delete"),
                     "storageClassName": sc_name, "volumeMode": spec.get("volumeMode", "Filesystem"),
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": meta["name"],
                                  "namespace": meta["namespace"], "uid": uid_of(pvc)}},
            "status": {"phase": "Bound"},
        })

        def bind(obj: dict[str, Any]) -> dict[str, Any]:
            obj["metadata"].setdefault("annotations", {}).update({
                "pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes",
                "volume.kubernetes.io/storage-provisioner": provisioner,
                "volume.beta.kubernetes.io/storage-provisioner": provisioner})
            obj.setdefault("spec", {}).update(volumeName=pv_name, storageClassName=sc_name)
            obj["status"] = {"phase": "Bound", "accessModes": modes, "capacity": {"storage": storage}}
            return obj
        self.w.store.mutate("", "persistentvolumeclaims", meta["name"], meta["namespace"], bind)
        self.w.events.record(pvc, "ProvisioningSucceeded", f"Successfully provisioned volume {pv_name}",
                             warning=False)
