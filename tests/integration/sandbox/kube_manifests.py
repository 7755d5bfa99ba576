"""Manifests, paths and the token shared by the Kubernetes emulator tests."""

from pathlib import Path

from kvfleet_sandbox.kube.auth import Authenticator, UserInfo
from kvfleet_sandbox.kube.tls import make_tls

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / ".tools" / "bin"
CHARTS = Path(__file__).resolve().parent / "charts"
IEC_CRD = REPO / "sandbox" / "kvfleet_sandbox" / "data" / \
    "inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml"
# The emulator's admin (system:masters) in these tests: a static bearer token, like the sandbox's own admin.
# EKS-shaped tokens and RBAC are tested in test_kube_rbac.py and tests/conformance/test_kube_rbac.py.
TOKEN = "sandbox-admin.tests"

DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
  labels: {app: web}
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: main
        image: nginx:1
        env:
        - {name: A, value: "1"}
        - {name: B, value: "2"}
        volumeMounts:
        - {name: data, mountPath: /data}
      - name: side
        image: busybox
      volumes:
      - name: data
        emptyDir: {}
"""


def iec(name: str, instance_type: str) -> str:
    """An InferenceEndpointConfig with the fields the real CRD requires."""
    return f"""apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: InferenceEndpointConfig
metadata:
  name: {name}
  namespace: default
spec:
  modelName: llama
  instanceType: {instance_type}
  replicas: 2
  modelSourceConfig: {{modelSourceType: s3}}
  worker:
    image: vllm/vllm-openai:latest
    resources: {{}}
    modelInvocationPort: {{containerPort: 8080}}
    modelVolumeMount: {{name: model, mountPath: /opt/ml/model}}
"""


TLS = make_tls()


def admin_authenticator() -> Authenticator:
    return Authenticator(static_tokens={TOKEN: UserInfo("kubernetes-admin", ("system:masters",))})
