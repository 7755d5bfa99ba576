"""HyperPod's ``ai-toolkit`` DaemonSet: Mode=Enable of HyperPod tiered storage (stage 1) makes it run in
``aws-hyperpod`` on every node; Mode=Disable removes it. Reacts to the AWS emulator's tiered-storage callback.

Attached with ``kvfleet_sandbox.controllers.workloads.WorkloadController``; its pods are the DaemonSet
controller's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvfleet.fleet.constants import AI_TOOLKIT_DAEMONSET, AI_TOOLKIT_NAMESPACE
from kvfleet_sandbox.controllers._objects import create_quietly, delete_quietly, ensure_namespace
from kvfleet_sandbox.twin import ClusterTwin

AI_TOOLKIT_IMAGE = "763104351884.dkr.ecr.{region}.amazonaws.com/hyperpod-ai-toolkit:1.0.0"
AI_TOOLKIT_PORT = 9200


class AiToolkit:
    """See the module docstring; one per cluster twin. ``wake`` runs after every change."""

    def __init__(self, twin: ClusterTwin, wake: Callable[[], None]) -> None:
        self.twin = twin
        self._wake = wake
        twin.aws.on_tiered_storage(self.on_tiered_storage, account=twin.account)

    def on_tiered_storage(self, hp_name: str, eks_name: str, cfg: dict[str, Any]) -> None:
        """HyperPod deploys (or removes) the ai-toolkit DaemonSet when tiered storage changes (stage 1)."""
        if hp_name != self.twin.name:
            return
        store = self.twin.store
        if cfg.get("Mode") == "Enable":
            ensure_namespace(store, AI_TOOLKIT_NAMESPACE)
            wanted = self.daemonset(cfg)
            if create_quietly(store, "apps", "daemonsets", wanted) is None:
                def refresh(ds: dict[str, Any]) -> dict[str, Any]:
                    ds["spec"] = wanted["spec"]
                    return ds
                store.mutate("apps", "daemonsets", AI_TOOLKIT_DAEMONSET, AI_TOOLKIT_NAMESPACE, refresh)
        elif cfg.get("Mode") == "Disable":
            delete_quietly(store, "apps", "daemonsets", AI_TOOLKIT_DAEMONSET, AI_TOOLKIT_NAMESPACE)
        self._wake()

    def daemonset(self, cfg: dict[str, Any]) -> dict[str, Any]:
        labels = {"app": AI_TOOLKIT_DAEMONSET, "app.kubernetes.io/name": AI_TOOLKIT_DAEMONSET}
        percent = str(cfg.get("InstanceMemoryAllocationPercentage", ""))
        return {
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": AI_TOOLKIT_DAEMONSET, "namespace": AI_TOOLKIT_NAMESPACE, "labels": dict(labels)},
            "spec": {
                "selector": {"matchLabels": {"app": AI_TOOLKIT_DAEMONSET}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {"metadata": {"labels": labels}, "spec": {
                    "hostNetwork": True, "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{
                        "name": AI_TOOLKIT_DAEMONSET, "image": AI_TOOLKIT_IMAGE.format(region=self.twin.region),
                        "ports": [{"name": "kv", "containerPort": AI_TOOLKIT_PORT, "hostPort": AI_TOOLKIT_PORT}],
                        "env": [{"name": "INSTANCE_MEMORY_ALLOCATION_PERCENTAGE", "value": percent}],
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    }]}},
            },
        }
