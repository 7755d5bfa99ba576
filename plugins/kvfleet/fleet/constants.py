"""Domain constants: every fixed name and default the sources give (docs/reference/).

Pure module: fleet/, clients/, stages/ and sandbox/ all import from here so that a name such as the
operator's controller Deployment exists exactly once. It imports nothing from kvfleet: it is the leaf the twin may
import (tests/contracts/test_import_contracts.py).
"""

from __future__ import annotations

from typing import Final

# --- LMCache / L2 -----------------------------------------------------------------------------------
# The L2 overlay's names and defaults (env, mount path, volume, claim): fleet.overlay builds the one desired value
# from them, the inventory's settings take their defaults from them and the twin reads them here.
ENV_REMOTE_URL: Final = "LMCACHE_REMOTE_URL"
ENV_REMOTE_SERDE: Final = "LMCACHE_REMOTE_SERDE"
ENV_HASHSEED: Final = "PYTHONHASHSEED"
# Not set by the overlay (the CR declares it: endpoint_spec.worker_env), but pods with different chunk sizes
# compute different keys, so stage 5 checks the pods agree on it too.
ENV_CHUNK_SIZE: Final = "LMCACHE_CHUNK_SIZE"
L2_MOUNT_PATH: Final = "/mnt/curvine"
L2_URL: Final = f"fs://localhost:0{L2_MOUNT_PATH}/l2cache/"  # host:port are placeholders fs:// ignores
L2_SERDE: Final = "naive"
PYTHONHASHSEED: Final = "0"
L2_VOLUME_NAME: Final = "curvine-l2"
CURVINE_PVC: Final = "curvine-l2-pvc"  # stage 3 creates it in every endpoint namespace
OPERATOR_L2_SCHEME: Final = "sagemaker-hyperpod://"  # the operator's node-local ai-toolkit daemon
CHUNK_SIZE: Final = 256  # LMCache stores a block only past a full 256-token chunk
OPERATOR_L2_URL: Final = f"{OPERATOR_L2_SCHEME}$(NODE_IP):9200"  # node-local ai-toolkit daemon
# Read by the twin's LMCache model only (the operator renders them; kvfleet never sets them).
ENV_LOCAL_CPU: Final = "LMCACHE_LOCAL_CPU"
ENV_MAX_LOCAL_CPU_SIZE: Final = "LMCACHE_MAX_LOCAL_CPU_SIZE"

# --- HyperPod tiered storage (stage 1) ---------------------------------------------------------------
MEMORY_PERCENT_DEFAULT: Final = 20
MEMORY_PERCENT_MIN: Final = 20  # AWS docs and the blog: 20-100 (botocore only enforces min 0)
MEMORY_PERCENT_MAX: Final = 100
TIERED_MODES: Final = frozenset({"Enable", "Disable"})
NODE_RECOVERY_VALUES: Final = frozenset({"Automatic", "None"})
NODE_RECOVERY_DEFAULT: Final = "Automatic"
AI_TOOLKIT_NAMESPACE: Final = "aws-hyperpod"
AI_TOOLKIT_DAEMONSET: Final = "ai-toolkit"

# --- Inference Operator (stage 2) -------------------------------------------------------------------
OPERATOR_NAMESPACE: Final = "hyperpod-inference-system"
OPERATOR_DEPLOYMENT: Final = "hyperpod-inference-controller-manager"  # EKS add-on install
# A Helm install (aws/sagemaker-hyperpod-cli helm_chart/.../inference-operator, config/manager/manager.yaml:
# "{{ .Values.namePrefix }}-controller-manager" with namePrefix "hyperpod-inference-operator").
OPERATOR_HELM_DEPLOYMENT: Final = "hyperpod-inference-operator-controller-manager"
OPERATOR_DEPLOYMENTS: Final = (OPERATOR_DEPLOYMENT, OPERATOR_HELM_DEPLOYMENT)
# The chart's Deployment labels: control-plane=<deployment name>, app.kubernetes.io/name=<namePrefix>.
OPERATOR_CONTROL_PLANE_LABEL: Final = "control-plane"
OPERATOR_NAME_LABEL: Final = "app.kubernetes.io/name"
OPERATOR_NAME_VALUE: Final = "hyperpod-inference-operator"
OPERATOR_ADDON: Final = "amazon-sagemaker-hyperpod-inference"
# Order matters: the operator add-on needs cert-manager (and the CSI drivers, metrics-server) first.
ADDON_ORDER: Final = (
    "aws-mountpoint-s3-csi-driver",
    "aws-fsx-csi-driver",
    "metrics-server",
    "cert-manager",
    OPERATOR_ADDON,
)
IEC_GROUP: Final = "inference.sagemaker.aws.amazon.com"
IEC_VERSION: Final = "v1"
IEC_PLURAL: Final = "inferenceendpointconfigs"
IEC_KIND: Final = "InferenceEndpointConfig"
IEC_CRD_NAME: Final = f"{IEC_PLURAL}.{IEC_GROUP}"
ROUTING_STRATEGIES: Final = ("prefixaware", "kvaware", "session", "roundrobin")
PAUSED_BY_ANNOTATION: Final = "kvfleet.io/paused-by"
PAUSED_AT_ANNOTATION: Final = "kvfleet.io/paused-at"
PAUSED_REPLICAS_ANNOTATION: Final = "kvfleet.io/paused-replicas"

# --- Curvine (stage 3) ------------------------------------------------------------------------------
CURVINE_NAMESPACE: Final = "curvine"
CURVINE_RELEASE: Final = "curvine"
CURVINE_CSI_RELEASE: Final = "curvine-csi"
CURVINE_CHART_VERSION: Final = "0.3.2-alpha"
CURVINE_STORAGE_CLASS: Final = "curvine-sc"
FORMAT_FLAGS: Final = ("formatMaster", "formatWorker", "formatJournal")  # under `cluster.`
CURVINE_MASTER_STS: Final = "curvine-master"
CURVINE_WORKER_STS: Final = "curvine-worker"
CURVINE_MASTER_WEB_PORT: Final = 9000

# --- labels kvfleet puts on what it manages ---------------------------------------------------------
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "kvfleet"
LOB_LABEL: Final = "kvfleet.io/lob"
L2_LABEL: Final = "tiered-kv/l2"
