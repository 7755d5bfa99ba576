"""The format-flag bypass class: no override key, override value, values file or rendered object
may carry a Curvine format flag past kvfleet. Pure checks only; the twin tests are in
tests/integration/curvine_ops/test_format_flag_class.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from kvfleet.clients import helm as helm_client
from kvfleet.errors import GateRefused
from kvfleet.fleet import curvine_values as cv
from kvfleet.fleet.curvine_gates import normalize_overrides, refuse_flag_overrides
from kvfleet.settings import load_settings
from kvfleet.stages import curvine_upgrade as up
from kvfleet.stages import executor

# ---- override keys and values ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [
    {"cluster.formatMaster": True},
    {"cluster.formatMaster": "false"},  # even false: kvfleet sets the flags itself
    {"CLUSTER.FORMATWORKER": "true"},
    {"Cluster.FormatJournal": 1},
    {"cluster": {"formatMaster": True}},
    {"cluster": {"FormatWorker": "yes"}},
    {"a": {"b": {"cluster": {"formatMaster": True}}}},  # any depth
    {"configOverrides.master.format_master": True},  # the TOML key itself, through the free-form overrides
    {"configOverrides": {"worker": {"format_worker": True}}},
    {"config.log.level,cluster.formatMaster": "true"},  # a comma in the key
    {"cluster\\.formatMaster": True},  # an escaped dot
])
def test_override_keys_touching_a_format_flag_are_refused_naming_the_key(overrides) -> None:  # type: ignore[no-untyped-def]
    problems = cv.format_override_problems(overrides)
    assert problems and "format" in problems[0].lower() and "key" in problems[0]
    with pytest.raises(GateRefused, match="(?i)format.*Approval does not change this"):
        refuse_flag_overrides("c1", overrides)


@pytest.mark.parametrize("value", [
    "INFO,cluster.formatMaster=true",  # the comma case: --set used to read two keys
    "INFO\\,cluster.formatMaster=true",  # an escaped comma
    "INFO,cluster.formatWorker=1",
    "INFO, CLUSTER.FORMATMASTER = TRUE",
    "INFO,cluster.form\\atMaster=true",  # a backslash inside the word
    "CURVINE_FORMAT_WORKER",  # an env var name
])
def test_override_values_naming_a_format_flag_are_refused(value: str) -> None:
    problems = cv.format_override_problems({"config.log.level": value})
    assert len(problems) == 1 and "config.log.level" in problems[0] and "format flag" in problems[0]


def test_nested_list_values_are_walked_too() -> None:
    env = {"worker": {"extraEnv": [{"name": "CURVINE_FORMAT_WORKER", "value": "true"}]}}
    assert any("extraEnv[0]" in p for p in cv.format_override_problems(env))


@pytest.mark.parametrize("key", ["config.log.level=x", "config.log level", "config..level", 'config."log"'])
def test_keys_helm_could_read_as_more_than_one_key_are_refused(key: str) -> None:
    (problem,) = cv.format_override_problems({key: "DEBUG"})
    assert key in problem and "refused" in problem


@pytest.mark.parametrize("overrides", [
    {},
    {"config.log.level": "DEBUG"},
    {"worker.storage.dataDirs[0].size": "200Gi", "worker.resources.limits.cpu": "8"},
    {"master.nodeSelector.sagemaker\\.amazonaws\\.com/compute-type": "hyperpod"},
    {"worker": {"nodeSelector": {"sagemaker.amazonaws.com/compute-type": "hyperpod"}}},
    {"config.log.level": "INFO,WARN"},  # a comma alone is harmless in a values file
])
def test_ordinary_overrides_pass(overrides) -> None:  # type: ignore[no-untyped-def]
    assert cv.format_override_problems(overrides) == []
    refuse_flag_overrides("c1", overrides)


def test_nested_overrides_keep_literal_dots_in_their_keys() -> None:
    flat = normalize_overrides({"worker": {"nodeSelector": {"sagemaker.amazonaws.com/compute-type": "x"}}})
    assert flat == {"worker.nodeSelector.sagemaker\\.amazonaws\\.com/compute-type": "x"}
    assert cv.nested(flat) == {"worker": {"nodeSelector": {"sagemaker.amazonaws.com/compute-type": "x"}}}


# ---- values files, never --set -------------------------------------------------------------------------------------


class _Access:
    def write_kubeconfig(self, home: Path) -> Path:  # pragma: no cover - no helm call is run here
        raise AssertionError("no helm call expected")


def test_overrides_reach_helm_as_a_yaml_values_file_with_the_comma_kept_inside_one_string() -> None:
    h = helm_client.Helm(_Access())
    try:
        args = h.upgrade_args("curvine", "curvine", "curvine", repo="http://r", version="1",
                              values={"config.log.level": "INFO,cluster.formatMaster=true", "worker.replicas": 3})
        assert "--set" not in args and "--set-string" not in args and "--set-json" not in args
        path = args[args.index("-f") + 1]
        loaded = yaml.safe_load(Path(path).read_text())
        assert loaded == {"config": {"log": {"level": "INFO,cluster.formatMaster=true"}}, "worker": {"replicas": 3}}
        assert cv.flags_of(loaded) == {"formatMaster": None, "formatWorker": None, "formatJournal": None}
        assert oct(Path(path).stat().st_mode & 0o777) == "0o600"
        shown = helm_client.render(h.argv(*args))
        assert "-f upgrade-" in shown and str(Path(path).parent) not in shown
        install = h.install_args("curvine", "curvine", "curvine", repo="http://r", version="1", values={"a.b": 1})
        assert "--set" not in install and "-f" in install
    finally:
        h.close()


def test_the_upgrade_command_ends_with_the_flags_false_file() -> None:
    h = helm_client.Helm(_Access())
    spec = SimpleNamespace(chart="curvine", namespace="curvine", repo_url="http://r")
    ctx = SimpleNamespace(helm=h, cluster=SimpleNamespace(curvine=spec), settings=load_settings({}))
    try:
        action = up.upgrade_action(ctx, "0.3.3-alpha", {"config.log.level": "DEBUG"}, 1,  # type: ignore[arg-type]
                                   "curvine-0.3.2-alpha")
        args = executor.helm_args(ctx, action)  # type: ignore[arg-type]
        files = [args[i + 1] for i, a in enumerate(args) if a == "-f"]
        assert len(files) == 2 and "--reset-then-reuse-values" in args and "--set" not in args
        last = yaml.safe_load(Path(files[-1]).read_text())
        # the flags false, and the charts' RBAC left to the bootstrap bundle, whatever the release's values say
        assert last == {"cluster": {"formatMaster": False, "formatWorker": False, "formatJournal": False},
                        "rbac": {"create": False}}
    finally:
        h.close()


# ---- what helm would deploy ----------------------------------------------------------------------------------------


def _configmap(toml: str) -> dict:  # type: ignore[type-arg]
    return {"kind": "ConfigMap", "metadata": {"name": "curvine-config"}, "data": {"curvine-cluster.toml": toml}}


def _sts(env: list | None = None, args: list | None = None) -> dict:  # type: ignore[type-arg]
    return {"kind": "StatefulSet", "metadata": {"name": "curvine-worker"},
            "spec": {"template": {"spec": {"containers": [{"name": "worker", "env": env or [], "args": args or []}]}}}}


REAL_TOML = 'cluster_id = "curvine"\nformat_master = false\nformat_worker = false\n\n[master]\nrpc_port = 8995\n'


def test_rendered_flags_false_in_toml_env_and_args_pass() -> None:
    docs = [_configmap(REAL_TOML), _sts(env=[{"name": "CURVINE_FORMAT_MASTER", "value": "false"}],
                                        args=["worker", "start", "--conf", "/x.toml"])]
    assert cv.rendered_format_findings(docs) == []


@pytest.mark.parametrize("toml", [
    REAL_TOML.replace("format_master = false", "format_master = true"),
    REAL_TOML.replace("format_worker = false", "format_worker = 1"),
    REAL_TOML.replace("format_worker = false", "format_worker = "),
    REAL_TOML.replace("format_master = false", "format_master = <no value>"),
    REAL_TOML + '\n[master]\nformat_master = true\n',  # through configOverrides.master
    REAL_TOML.replace("format_master = false", "FORMAT_MASTER = \"true\""),
])
def test_a_rendered_toml_flag_that_is_not_false_is_found(toml: str) -> None:
    (finding,) = cv.rendered_format_findings([_configmap(toml)])
    assert finding.startswith("ConfigMap/curvine-config curvine-cluster.toml:") and "format" in finding.lower()


@pytest.mark.parametrize("env,args", [
    ([{"name": "CURVINE_FORMAT_WORKER", "value": "true"}], None),
    ([{"name": "curvine_format_master", "value": "TRUE"}], None),
    ([{"name": "CURVINE_FORMAT_WORKER", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}], None),
    (None, ["worker", "start", "--format-worker"]),
    (None, ["master", "start", "--format_master=true"]),
])
def test_a_rendered_env_or_arg_flag_is_found(env, args) -> None:  # type: ignore[no-untyped-def]
    (finding,) = cv.rendered_format_findings([_sts(env=env, args=args)])
    assert finding.startswith("StatefulSet/curvine-worker container worker")


def test_placement_problems_name_what_is_missing() -> None:
    bare = _sts()
    assert len(cv.placement_problems([bare])) == 2
    pinned = _sts()
    pod = pinned["spec"]["template"]["spec"]
    pod["nodeSelector"] = {"sagemaker.amazonaws.com/compute-type": "hyperpod"}
    pod["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}
    (problem,) = cv.placement_problems([pinned])
    assert "required pod anti-affinity" in problem
    pod["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}}]}}
    assert cv.placement_problems([pinned]) == []
    assert cv.placement_problems([_configmap(REAL_TOML)]) == ["no worker StatefulSet rendered"]


def test_install_values_pin_workers_and_the_flip_turns_every_flag_false(tmp_path: Path) -> None:
    from kvfleet.fleet.inventory import load_inventory

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("clusters:\n  - name: c1\n    region: us-east-1\n"
                     "    gpu_nodes: {count: 2, instance_type: ml.g5.4xlarge}\n")
    values = cv.nested(cv.install_values(load_inventory(fleet).cluster("c1")))
    assert values["worker"]["nodeSelector"] == {"sagemaker.amazonaws.com/compute-type": "hyperpod"}
    assert values["worker"]["antiAffinity"] == {"enabled": True, "type": "required"}
    assert values["master"]["nodeSelector"] == {"sagemaker.amazonaws.com/compute-type": "hyperpod"}
    assert sorted(cv.flags_set(values)) == ["formatJournal", "formatMaster", "formatWorker"]
    assert cv.flags_set(cv.merged_values(values, cv.safe_flags())) == []
