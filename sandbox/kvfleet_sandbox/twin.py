"""The shared shape of one sandbox cluster: what every simulated controller is attached to.

Created by the sandbox runtime (``kvfleet_sandbox.runtime``) for each cluster of the inventory, then handed to
``attach(twin)`` of every controller module in ``kvfleet_sandbox.controllers`` (workloads, operator, kyverno,
curvine, vllm). Controllers talk to each other only through what is here: the Kubernetes store, the AWS
emulator, the clock, the L2 namespace and the ``services`` registry.

Time: control-plane delays (pod start-up, add-on transitions, reconcile periods) are *model* seconds scaled by
``Clock.scale`` so tests run fast; data-plane latency (TTFT, L2 reads) is real time, so what kvfleet measures
through the pod proxy is comparable with the published figures.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvfleet_sandbox.aws import AwsEmulator
from kvfleet_sandbox.kube.store import KubeStore


class Clock:
    """Model time. ``scale`` is real seconds per model second (0.02 makes a 30 s start-up take 0.6 s)."""

    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError(f"time scale must be > 0, got {scale}")
        self.scale = scale
        self._real0 = time.time()
        self._stopped = threading.Event()

    def now(self) -> float:
        """Model epoch seconds (starts at the real time of creation, then runs 1/scale times faster)."""
        return self._real0 + (time.time() - self._real0) / self.scale

    def sleep(self, model_seconds: float) -> None:
        if model_seconds > 0:
            self._stopped.wait(model_seconds * self.scale)

    def real(self, model_seconds: float) -> float:
        return model_seconds * self.scale

    def stop(self) -> None:
        """Wake every sleeper (shutdown)."""
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()


@dataclass
class SandboxSettings:
    time_scale: float = 0.02  # real seconds per model second
    seed: int = 7
    lmcache_version: str = "0.3.9"  # "0.3.9" or "0.5.6": which LMCache log format the vLLM pods write
    pod_startup_s: float = 30.0  # model seconds from scheduled to Ready (vLLM loads weights)
    operator_resync_s: float = 60.0  # the operator's periodic reconcile (model seconds)
    addon_delay_s: float = 20.0  # CREATING/UPDATING -> ACTIVE (model seconds)
    cluster_update_delay_s: float = 60.0  # UpdateCluster Updating -> InService (model seconds)
    ttft_noise: float = 0.02  # relative noise on TTFT (seeded)
    # Kyverno on kyverno-mode clusters: "preinstalled" (a platform team's install is there at start-up) or
    # "chart" (absent until its chart is installed, as kvfleet's stage 2 does; controllers/kyverno.py).
    kyverno: str = "preinstalled"
    # AWS prerequisites the start-up does NOT create (aws_prereqs.ITEMS, e.g. ("execution_role", "tls_bucket")), so
    # a sandbox starts with exactly those missing for `kvfleet preflight` to find.
    omit_prerequisites: tuple[str, ...] = ()
    # IAM on the twin's AWS (kvfleet_sandbox.aws_iam_enforce): the policy files attached to kvfleet's principal in each
    # account (None: k8s/iam/kvfleet-policy.json, what k8s/iam/README.md documents), and whether the emulator then
    # enforces them. False: every call is allowed, as before enforcement existed.
    iam_policies: tuple[str, ...] | None = None
    iam_enforced: bool = True
    # The tags every HyperPod cluster of the fleet carries at start-up (ListTags; aws:ResourceTag in IAM conditions):
    # the tag a platform team puts on the clusters kvfleet manages.
    hyperpod_tags: tuple[tuple[str, str], ...] = (("kvfleet:managed", "true"),)


class Controller(Protocol):
    def stop(self) -> None: ...


@dataclass
class L2Entry:
    size: int
    meta: dict[str, Any] = field(default_factory=dict)
    written_at: float = field(default_factory=time.time)


class L2Namespace:
    """The Curvine filesystem of one cluster, reduced to what L2 needs: files by absolute Curvine path.

    The Curvine simulation owns its life cycle (a master started with formatMaster wipes it; a worker started
    with formatWorker drops the blocks it held). The vLLM simulation reads and writes it through the pod's
    mount: PVC -> PV -> ``<fs-path>/pvc-<uid>`` + the rest of the path.
    """

    def __init__(self) -> None:
        self._files: dict[str, L2Entry] = {}
        self._lock = threading.RLock()
        self.available = True  # False while the master is down: reads and writes fail
        self.version = 0  # bumped by every change to the set of files (lets pollers skip a tick with no news)

    def write(self, path: str, size: int, meta: dict[str, Any] | None = None) -> None:
        with self._lock:
            if not self.available:
                raise OSError(f"curvine: master unavailable, cannot write {path}")
            self._files[path] = L2Entry(size=size, meta=dict(meta or {}))
            self.version += 1

    def read(self, path: str) -> L2Entry | None:
        with self._lock:
            if not self.available:
                raise OSError(f"curvine: master unavailable, cannot read {path}")
            return self._files.get(path)

    def exists(self, path: str) -> bool:
        with self._lock:
            return path in self._files

    def list(self, prefix: str = "/") -> list[str]:
        with self._lock:
            return sorted(p for p in self._files if p.startswith(prefix))

    def delete_prefix(self, prefix: str = "/") -> int:
        with self._lock:
            doomed = [p for p in self._files if p.startswith(prefix)]
            for p in doomed:
                del self._files[p]
            self.version += bool(doomed)
            return len(doomed)

    def drop_where(self, predicate: Callable[[str, L2Entry], bool]) -> int:
        with self._lock:
            doomed = [p for p, e in self._files.items() if predicate(p, e)]
            for p in doomed:
                del self._files[p]
            self.version += bool(doomed)
            return len(doomed)

    def total_bytes(self) -> int:
        with self._lock:
            return sum(e.size for e in self._files.values())

    def file_count(self) -> int:
        with self._lock:
            return len(self._files)

    def dirs(self) -> set[str]:
        with self._lock:
            return {p.rsplit("/", 1)[0] for p in self._files}


@dataclass
class ClusterTwin:
    """One HyperPod cluster and its EKS cluster, as the controllers see it."""

    name: str  # HyperPod cluster name (the inventory's cluster name)
    eks_name: str
    region: str
    store: KubeStore
    aws: AwsEmulator
    clock: Clock
    settings: SandboxSettings
    gpu_instance_type: str
    gpu_nodes: list[str] = field(default_factory=list)  # Kubernetes node names of the GPU nodes
    l2: L2Namespace = field(default_factory=L2Namespace)
    # Node-local "L2" of the operator's sagemaker-hyperpod:// URL (ai-toolkit daemon), per node name.
    node_local_l2: dict[str, L2Namespace] = field(default_factory=dict)
    # Cross-controller lookups, e.g. services["curvine"].master_running() for PVC binding.
    services: dict[str, Any] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    controllers: list[Controller] = field(default_factory=list)
    # The AWS account the cluster is in (its 12-digit id); None: the emulator's base account (the hub). Controllers
    # ask the AWS emulator about their cluster in this account: two accounts may each have a cluster of one name.
    account: str | None = None
    key: str = ""  # the inventory cluster's key, account/region/name (the name alone when built without one)

    def curvine_master_running(self) -> bool:
        curvine = self.services.get("curvine")
        return bool(curvine and curvine.master_running())

    def node_l2(self, node: str) -> L2Namespace:
        return self.node_local_l2.setdefault(node, L2Namespace())

    def stop(self) -> None:
        for c in reversed(self.controllers):
            c.stop()
        self.controllers.clear()


def gpus_per_instance(instance_type: str) -> int:
    """NVIDIA GPUs of the SageMaker instance types the sandbox knows (AWS instance type docs).

    The twin's own table (the sandbox imports nothing of the product but ``fleet.constants``); it duplicates
    ``kvfleet/fleet/hardware.py`` on purpose and rests on the same sources, cited there per family: the EC2
    pages https://aws.amazon.com/ec2/instance-types/g5/, /g6/, /g6e/, /p4/, /p5/, the AWS Batch "GPU jobs" table
    and https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html ("GPUs" per size). An ``ml.`` type has the
    hardware of the EC2 type of the same name."""
    known = {
        "ml.g5.xlarge": 1, "ml.g5.2xlarge": 1, "ml.g5.4xlarge": 1, "ml.g5.8xlarge": 1, "ml.g5.12xlarge": 4,
        "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8, "ml.g6.16xlarge": 1, "ml.g6e.xlarge": 1, "ml.g6e.2xlarge": 1,
        "ml.g6e.4xlarge": 1, "ml.g6e.8xlarge": 1, "ml.g6e.12xlarge": 4, "ml.g6e.24xlarge": 4,
        "ml.g6e.48xlarge": 8, "ml.p4d.24xlarge": 8, "ml.p5.48xlarge": 8,
    }
    return known.get(instance_type, 1)
