"""Preflight's GPU-node count against a twin with a single GPU node."""

from __future__ import annotations

import warnings

import pytest

from kvfleet.fleet.inventory import load_inventory
from kvfleet.stages import preflight
from kvfleet.stages.base import StageContext
from kvfleet_sandbox.aws_prereqs import seed_prerequisites

pytestmark = pytest.mark.integration


FLEET = """
lobs:
  - name: retail
clusters:
  - name: ml-stage-usw2
    region: us-west-2
    gpu_nodes: {count: 1, instance_type: ml.g5.4xlarge}
    addons:
      amazon-sagemaker-hyperpod-inference:
        configuration:
          executionRoleArn: arn:aws:iam::123456789012:role/hyperpod-inference-exec
          tlsCertificateS3Bucket: hyperpod-tls-one-node
endpoints:
  - {name: retail-assistant, namespace: retail, lob: retail, cluster: ml-stage-usw2, model: qwen2-7b-instruct,
     instance_type: ml.g5.4xlarge, replicas: 1, routing: prefixaware}
"""


def test_one_gpu_node_is_a_problem(sandbox_factory, tmp_path, monkeypatch) -> None:
    text = FLEET
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inv = load_inventory(path)
        sandbox = sandbox_factory(path, controllers=())
    for key, value in sandbox.exports().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
    seed_prerequisites(sandbox.aws, inv.clusters)
    ctx = StageContext(inventory=inv, cluster=inv.cluster("ml-stage-usw2"), aws_conn_id=None)
    try:
        problems = preflight.check(ctx)
    finally:
        ctx.close()
    assert [(p.check, p.what.split(";")[0]) for p in problems] == [("gpu_nodes", "1 GPU node(s) in the cluster")]
    assert "InstanceCount=2" in problems[0].fix
