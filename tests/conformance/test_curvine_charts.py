"""The sandbox's stand-in Curvine charts create the same kinds of object as the real ones.

Real `helm template` of sandbox/kvfleet_sandbox/charts/{curvine,curvine-csi} is checked against the recorded facts
(tests/conformance/facts/curvine_charts.yaml): the runtime chart's ServiceAccount, Role and RoleBinding and its
pre-upgrade hook Job, the CSI chart's ServiceAccounts and ClusterRoles/ClusterRoleBindings with upstream's rules,
upstream's worker placement (no node selector, preferred anti-affinity unless `required`) and no format_journal.
When the real charts are present (a local copy of CurvineIO/curvine-helm, ``DEFAULT_UPSTREAM`` or
KVFLEET_UPSTREAM_CURVINE_HELM), they are rendered too and compared with the stand-ins directly; otherwise that part skips, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.clients.helm import helm_binary, split_manifest

ROOT = Path(__file__).resolve().parents[2]
FACTS = yaml.safe_load((Path(__file__).parent / "facts" / "curvine_charts.yaml").read_text())
STAND_INS = ROOT / "sandbox" / "kvfleet_sandbox" / "charts"
DEFAULT_UPSTREAM = ROOT.parent / "shared" / "reference" / "upstream" / "curvine-helm"
NAMESPACE = "curvine"


def _helm() -> str:
    try:
        return helm_binary()
    except Exception as exc:  # any reason helm is unavailable is a skip reason
        pytest.skip(f"helm is not available: {exc}")
        raise


def _upstream() -> Path:
    path = Path(os.environ.get("KVFLEET_UPSTREAM_CURVINE_HELM") or DEFAULT_UPSTREAM)
    if not (path / "curvine-runtime" / "Chart.yaml").is_file() or not (path / "curvine-csi" / "Chart.yaml").is_file():
        reason = (f"the real charts are not at {path} (a clean clone has no copy of the upstream charts); set "
                  "KVFLEET_UPSTREAM_CURVINE_HELM to a copy of CurvineIO/curvine-helm to compare them directly")
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return path


def _template(chart: Path, release: str, tmp_path: Path, *args: str, check: bool = True,
              values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    work = tmp_path / f"{chart.name}-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(chart, work)  # helm never writes into the read-only reference tree
    extra = []
    if values is not None:
        vals = work.parent / f"{work.name}-values.yaml"
        vals.write_text(yaml.safe_dump(values))
        extra = ["-f", str(vals)]
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp_path / "c"), "HELM_CONFIG_HOME": str(tmp_path / "cfg"),
           "HELM_DATA_HOME": str(tmp_path / "d")}
    proc = subprocess.run([_helm(), "template", release, str(work), "-n", NAMESPACE, "--skip-tests", *extra, *args],
                          capture_output=True, text=True, timeout=60, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def _objects(chart: Path, release: str, tmp_path: Path, *args: str,
             values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return split_manifest(_template(chart, release, tmp_path, *args, values=values).stdout)


def _kinds(objs: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objs}


def _rules(role: dict[str, Any]) -> dict[str, dict[str, set[str]]]:
    """group -> resource -> verbs, whatever way the rules are split."""
    out: dict[str, dict[str, set[str]]] = {}
    for rule in role.get("rules") or []:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                out.setdefault(group, {}).setdefault(resource, set()).update(rule.get("verbs") or [])
    return out


def _worker_pod_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    sts = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("-worker"))
    return sts["spec"]["template"]["spec"]


def _placement(spec: dict[str, Any]) -> tuple[dict[str, str], str | None, set[str]]:
    """(nodeSelector, required|preferred|None, topology keys) of a worker pod spec."""
    anti = (spec.get("affinity") or {}).get("podAntiAffinity") or {}
    required = anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    preferred = anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    mode = "required" if required else "preferred" if preferred else None
    keys = {t["topologyKey"] for t in required} | {p["podAffinityTerm"]["topologyKey"] for p in preferred}
    return dict(spec.get("nodeSelector") or {}), mode, keys


PINNED = {"worker": {"nodeSelector": {"sagemaker.amazonaws.com/compute-type": "hyperpod"},
                     "antiAffinity": {"enabled": True, "type": "required"}}}


# --- the stand-ins against the recorded facts ---------------------------------------------------------------


def test_stand_in_runtime_chart_creates_the_real_kinds(tmp_path: Path) -> None:
    facts = FACTS["runtime"]
    objs = _objects(STAND_INS / "curvine", facts["release"], tmp_path)
    assert _kinds(objs) == set(facts["install_kinds"])
    role = next(o for o in objs if o["kind"] == "Role")
    binding = next(o for o in objs if o["kind"] == "RoleBinding")
    sa = next(o for o in objs if o["kind"] == "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    assert _rules(role) == {"": {r: {"get", "list", "watch"} for r in ("pods", "configmaps", "services")},
                            "apps": {"statefulsets": {"get", "list", "watch"}}}
    for sts in (o for o in objs if o["kind"] == "StatefulSet"):
        assert sts["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert not {o["kind"] for o in _objects(STAND_INS / "curvine", "curvine", tmp_path,
                                            values={"rbac": {"create": False}, "serviceAccount": {"create": False}})
                } & {"Role", "RoleBinding", "ServiceAccount"}


def test_stand_in_upgrade_adds_the_pre_upgrade_hook_job(tmp_path: Path) -> None:
    facts = FACTS["runtime"]
    objs = _objects(STAND_INS / "curvine", facts["release"], tmp_path, "--is-upgrade")
    assert _kinds(objs) == set(facts["install_kinds"]) | set(facts["upgrade_hooks"])
    job = next(o for o in objs if o["kind"] == "Job")
    want = facts["upgrade_hooks"]["Job"]
    assert job["apiVersion"] == want["apiVersion"]
    assert job["metadata"]["annotations"] == want["annotations"]
    assert job["metadata"]["name"] == want["name"].replace("<fullname>", facts["release"])
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_stand_in_worker_placement_is_upstreams(tmp_path: Path) -> None:
    """No node selector and a preferred anti-affinity by default (what the real chart does); the keys pin."""
    place = FACTS["runtime"]["worker_placement"]
    default = _placement(_worker_pod_spec(_objects(STAND_INS / "curvine", "curvine", tmp_path)))
    assert default == (place["node_selector_default"], place["anti_affinity_default"]["type"],
                       {place["topology_key"]})
    pinned = _placement(_worker_pod_spec(_objects(STAND_INS / "curvine", "curvine", tmp_path, values=PINNED)))
    assert pinned == (PINNED["worker"]["nodeSelector"], "required", {place["topology_key"]})
    spec = _worker_pod_spec(_objects(STAND_INS / "curvine", "curvine", tmp_path,
                                     values={"worker": {"antiAffinity": {"enabled": False}}}))
    assert "affinity" not in spec and "nodeSelector" not in spec


def test_stand_in_renders_no_format_journal(tmp_path: Path) -> None:
    assert FACTS["runtime"]["format_journal_rendered"] is False
    text = _template(STAND_INS / "curvine", "curvine", tmp_path,
                     values={"cluster": {"formatJournal": True}}).stdout
    assert "format_journal" not in text and "FORMAT_JOURNAL" not in text
    assert "format_master" in text  # the flags that are rendered still are


def test_stand_in_csi_chart_creates_the_real_kinds_and_rules(tmp_path: Path) -> None:
    facts = FACTS["csi"]
    objs = _objects(STAND_INS / "curvine-csi", facts["release"], tmp_path)
    assert _kinds(objs) == set(facts["install_kinds"])
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert sorted(o["metadata"]["name"] for o in objs if o["kind"] == kind) == \
            sorted(facts["install_kinds"][kind]["names"])
    roles = {o["metadata"]["name"]: _rules(o) for o in objs if o["kind"] == "ClusterRole"}
    assert roles == {name: {g: {r: set(v) for r, v in res.items()} for g, res in groups.items()}
                     for name, groups in facts["cluster_roles"].items()}
    for crb in (o for o in objs if o["kind"] == "ClusterRoleBinding"):
        name = crb["metadata"]["name"]
        assert crb["roleRef"]["name"] == name
        assert crb["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    accounts = {o["spec"]["template"]["spec"].get("serviceAccountName")
                for o in objs if o["kind"] in ("Deployment", "DaemonSet")}
    assert accounts == {"curvine-csi-controller", "curvine-csi-node"}


# --- the stand-ins against the real charts, when the copy is present ------------------------------------------


def test_real_runtime_chart_kinds_equal_the_stand_ins(tmp_path: Path) -> None:
    real = _upstream() / "curvine-runtime"
    facts = FACTS["runtime"]
    real_objs = _objects(real, facts["release"], tmp_path)
    assert _kinds(real_objs) == set(facts["install_kinds"])
    assert _kinds(real_objs) == _kinds(_objects(STAND_INS / "curvine", facts["release"], tmp_path))
    # The hook: its template declares a batch/v1 Job with the pre-upgrade hook annotation, under IsUpgrade.
    hook = (real / facts["upgrade_hooks"]["Job"]["source"]).read_text()
    assert ".Release.IsUpgrade" in hook and "kind: Job" in hook and "apiVersion: batch/v1" in hook
    assert '"helm.sh/hook": pre-upgrade' in hook
    # `helm template --is-upgrade` of the real chart cannot render (its lookup needs a live release).
    failed = _template(real, facts["release"], tmp_path, "--is-upgrade", check=False)
    assert (failed.returncode != 0) is facts["template_is_upgrade_fails"], failed.stderr
    real_role = next(o for o in real_objs if o["kind"] == "Role")
    stand_in_role = next(o for o in _objects(STAND_INS / "curvine", "curvine", tmp_path) if o["kind"] == "Role")
    assert _rules(real_role) == _rules(stand_in_role)


def test_real_runtime_chart_places_workers_like_the_stand_in(tmp_path: Path) -> None:
    real = _upstream() / "curvine-runtime"
    for values in (None, PINNED):
        got = _placement(_worker_pod_spec(_objects(real, "curvine", tmp_path, values=values)))
        want = _placement(_worker_pod_spec(_objects(STAND_INS / "curvine", "curvine", tmp_path, values=values)))
        assert got == want, values
    text = _template(real, "curvine", tmp_path, values={"cluster": {"formatJournal": True}}).stdout
    assert "format_journal" not in text


def test_real_csi_chart_kinds_and_rules_equal_the_stand_ins(tmp_path: Path) -> None:
    real_objs = _objects(_upstream() / "curvine-csi", FACTS["csi"]["release"], tmp_path)
    stand_in = _objects(STAND_INS / "curvine-csi", FACTS["csi"]["release"], tmp_path)
    assert _kinds(real_objs) == _kinds(stand_in) == set(FACTS["csi"]["install_kinds"])

    def named(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
        return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}

    assert {n: _rules(o) for n, o in named(real_objs, "ClusterRole").items()} == \
        {n: _rules(o) for n, o in named(stand_in, "ClusterRole").items()}
    for kind in ("ServiceAccount", "ClusterRoleBinding"):
        assert set(named(real_objs, kind)) == set(named(stand_in, kind))
    for name, crb in named(real_objs, "ClusterRoleBinding").items():
        assert named(stand_in, "ClusterRoleBinding")[name]["subjects"] == crb["subjects"]


# --- the kvfleet-bootstrap bundle holds what the charts no longer create ---------------------------------------

RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def _without_rbac(release: str, chart: Path, tmp_path: Path) -> list[dict[str, Any]]:
    from kvfleet.fleet.curvine_values import NO_CHART_RBAC, nested

    return _objects(chart, release, tmp_path, values=nested(NO_CHART_RBAC))


def _by_kind_and_name(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs if o["kind"] in RBAC_KINDS}


def _same_rbac(bundle: dict[str, Any], chart: dict[str, Any]) -> None:
    assert bundle["metadata"].get("namespace", NAMESPACE) == chart["metadata"].get("namespace", NAMESPACE)
    if bundle["kind"] in ("Role", "ClusterRole"):
        assert _rules(bundle) == _rules(chart), bundle["metadata"]["name"]
    if bundle["kind"].endswith("Binding"):
        assert bundle["roleRef"] == chart["roleRef"]
        assert bundle["subjects"] == chart["subjects"]


def _check_bundle_replaces(charts: Path, runtime: str, csi: str, tmp_path: Path) -> None:
    from kvfleet.fleet.bootstrap_bundle import curvine_rbac

    bundle = _by_kind_and_name(curvine_rbac(NAMESPACE))
    chart_rbac = {**_by_kind_and_name(_objects(charts / runtime, FACTS["runtime"]["release"], tmp_path)),
                  **_by_kind_and_name(_objects(charts / csi, FACTS["csi"]["release"], tmp_path))}
    left = {**_by_kind_and_name(_without_rbac(FACTS["runtime"]["release"], charts / runtime, tmp_path)),
            **_by_kind_and_name(_without_rbac(FACTS["csi"]["release"], charts / csi, tmp_path))}
    # rbac.create=false leaves exactly the runtime chart's ServiceAccount; the bundle holds every other object
    assert set(left) == {("ServiceAccount", "curvine")}
    assert set(bundle) == set(chart_rbac) - set(left)
    for key, obj in bundle.items():
        _same_rbac(obj, chart_rbac[key])


def test_the_bootstrap_bundle_holds_exactly_the_rbac_the_stand_in_charts_leave_out(tmp_path: Path) -> None:
    _check_bundle_replaces(STAND_INS, "curvine", "curvine-csi", tmp_path)


def test_the_bootstrap_bundle_holds_exactly_the_rbac_the_real_charts_leave_out(tmp_path: Path) -> None:
    _check_bundle_replaces(_upstream(), "curvine-runtime", "curvine-csi", tmp_path)


def test_the_bundles_csi_roles_are_the_recorded_facts() -> None:
    from kvfleet.fleet.bootstrap_bundle import curvine_rbac

    roles = {o["metadata"]["name"]: _rules(o) for o in curvine_rbac("anywhere") if o["kind"] == "ClusterRole"}
    assert roles == {name: {g: {r: set(v) for r, v in res.items()} for g, res in groups.items()}
                     for name, groups in FACTS["csi"]["cluster_roles"].items()}
    subjects = {o["metadata"]["name"]: o["subjects"] for o in curvine_rbac("elsewhere")
                if o["kind"] == "ClusterRoleBinding"}
    assert subjects == {n: [{"kind": "ServiceAccount", "name": n, "namespace": "elsewhere"}] for n in roles}
