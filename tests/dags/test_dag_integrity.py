"""Every DAG file imports cleanly, leanly, and without I/O at the top level (no file reads beyond code,
no sockets, no subprocesses, none of the heavy client libraries nor kvfleet's stages): the scheduler parses these
files all day. Every Param the trigger form shows has a description and, where numeric, a range."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = sorted((Path(__file__).resolve().parents[2] / "dags").glob("*.py"))

PROBE = r"""
import json, runpy, sys
# Import what DAG files legitimately import first, so their own one-time reads are not blamed on the DAG.
import airflow.sdk, kvfleet.airflow.params  # noqa
events = []
CODE = (".py", ".pyc", ".so", ".pth", ".typed", ".json", "__pycache__")
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and not args[0].endswith(CODE) and "site-packages" not in args[0]:
        events.append(("open", args[0]))
    elif event == "subprocess.Popen" and list(args[1])[:2] == ["file", "-b"]:
        pass  # platform.architecture() probing the interpreter, inside Airflow's lazy imports
    elif event in ("socket.connect", "subprocess.Popen", "os.system"):
        events.append((event, str(args[:2])))
sys.addaudithook(hook)
runpy.run_path(sys.argv[1])
print("EVENTS=" + json.dumps(events))
"""


@pytest.mark.parametrize("path", DAGS, ids=[p.stem for p in DAGS])
def test_dag_file_imports_without_top_level_io(path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("EVENTS=")][-1]
    events = [e for e in json.loads(line[len("EVENTS="):]) if not e[1].startswith(("/dev/", "/proc/"))]
    assert events == [], f"{path.name} does I/O at import time: {events}"


def test_every_dag_file_is_in_the_dagbag(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert {p.stem for p in DAGS} <= set(dagbag.dag_ids)
    for dag_id in dagbag.dag_ids:
        assert dagbag.get_dag(dag_id).tags == ["kvfleet"] or "kvfleet" in dagbag.get_dag(dag_id).tags


# Parsing a DAG file must not import these: the task bodies import them when they run.
HEAVY_ROOTS = ("kubernetes", "botocore", "boto3", "sqlalchemy", "psycopg", "psycopg2")
HEAVY_KVFLEET = ("kvfleet.stages", "kvfleet.clients", "kvfleet.history")

LEAN_PROBE = r"""
import json, runpy, sys
import airflow.sdk  # noqa: F401  (the baseline the DAG file is measured over)
before = set(sys.modules)
runpy.run_path(sys.argv[1])
print("MODULES=" + json.dumps({"before": sorted(before), "after": sorted(sys.modules)}))
"""


def _under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


@pytest.mark.parametrize("path", DAGS, ids=[p.stem for p in DAGS])
def test_parsing_a_dag_file_imports_no_heavy_module(path: Path) -> None:
    """A fresh interpreter: ``import airflow.sdk``, then run the DAG file; compare sys.modules. kubernetes,
    botocore and kvfleet.stages must be absent altogether; sqlalchemy (which this Airflow's ``airflow.sdk``
    already loads through airflow.models) must gain no module from the DAG file, nor may kvfleet's history."""
    proc = subprocess.run([sys.executable, "-c", LEAN_PROBE, str(path)], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("MODULES=")][-1]
    modules = json.loads(line[len("MODULES="):])
    after, new = set(modules["after"]), set(modules["after"]) - set(modules["before"])
    heavy_new = sorted(m for m in new if _under(m, HEAVY_ROOTS + HEAVY_KVFLEET))
    assert heavy_new == [], f"{path.name} imports at parse time: {heavy_new[:20]}"
    absent = sorted(m for m in after if _under(m, ("kubernetes", "botocore", "boto3", "kvfleet.stages")))
    assert absent == [], f"{path.name}: loaded while parsing: {absent[:20]}"
    assert {m for m in new if m.startswith("kvfleet.")} <= {
        "kvfleet.airflow", "kvfleet.airflow.params", "kvfleet.airflow.callbacks", "kvfleet.airflow.operators",
        # the drift watch's trigger (the inventory, the per-cluster watch and its clients load in run(), in the
        # triggerer)
        "kvfleet.airflow.triggers", "kvfleet.airflow.triggers.events", "kvfleet.airflow.triggers.fleet_watch",
        "kvfleet.fleet", "kvfleet.fleet.gates",
        # the Params' defaults are settings, read when the DAG file makes them (pydantic-settings, no I/O)
        "kvfleet.settings", "kvfleet.errors", "kvfleet.fleet.shared_rules"}, sorted(m for m in new if m.startswith("kvfleet."))
    # The gates' notifier (callbacks.GateWaitingNotifier) imports kvfleet.airflow.notify (and the gate texts,
    # kvfleet.airflow.gates) when a gate starts waiting, never at parse time.
    lazy = sorted(m for m in after if _under(m, ("kvfleet.airflow.notify", "kvfleet.airflow.gates")))
    assert lazy == [], f"{path.name}: loaded while parsing: {lazy}"


HITL_DAGS = [p for p in DAGS if p.name in ("kvfleet_rollout.py", "kvfleet_curvine_upgrade.py")]


@pytest.mark.parametrize("path", HITL_DAGS, ids=[p.stem for p in HITL_DAGS])
def test_the_dag_processor_path_parses_the_hitl_files_without_heavy_modules(path: Path) -> None:
    """Airflow's own DAG-processor path, as bench/parse_time.py runs it (a manager interpreter pre-imports the file's
    airflow.* modules with ``_pre_import_airflow_modules``, forks, and the child runs ``_parse_file``), for the two
    files that rely on the pre-import: the file yields its DAG with no import error, the manager pre-imported the
    HITL module, and the child loads no heavy module and not the notifications module. (The fresh-interpreter
    test above covers every file.)"""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import parse_time
    finally:
        sys.path.pop(0)
    out = parse_time.processor_sample(path)  # raises on a failed child or an import error
    assert out["dag_ids"] == [path.stem]
    assert out["heavy"] == [], out["heavy"]
    assert "airflow.providers.standard.operators.hitl" in out["pre_imported"] and out["pre_import_enabled"]
    assert "airflow.sdk.definitions.decorators" in out["pre_imported"], out["pre_imported"]
    assert not {"kvfleet.airflow.notify", "kvfleet.airflow.gates"} & set(out["kvfleet_loaded"]), out["kvfleet_loaded"]


def test_the_hitl_dag_files_name_the_hitl_module_for_the_dag_processor_to_pre_import() -> None:
    """The DAG processor's manager imports the ``airflow.*`` modules a DAG file names before forking the child that
    parses it (airflow/dag_processing/processor.py ``_pre_import_airflow_modules``, Airflow 3.3.2). The files with
    HITL gates name the HITL operator module, so the child inherits it instead of importing it on every parse."""
    from airflow.providers.standard.operators.hitl import HITLOperator
    from airflow.utils.file import iter_airflow_imports

    from kvfleet.airflow.operators import CurvineApprovalOperator, WaveGateOperator

    assert issubclass(WaveGateOperator, HITLOperator) and issubclass(CurvineApprovalOperator, HITLOperator)
    assert len(HITL_DAGS) == 2
    for path in HITL_DAGS:
        assert "airflow.providers.standard.operators.hitl" in set(iter_airflow_imports(str(path))), path.name


def test_every_dag_file_names_the_task_decorators_module_for_the_dag_processor_to_pre_import() -> None:
    """``airflow.sdk`` resolves ``task`` lazily, on first use, from the module that defines the decorators; a DAG
    file that names only ``airflow.sdk`` makes every forked parsing child import it (and the standard provider's
    python operators and ``packaging`` under it). Every kvfleet DAG file names that module, taken from Airflow
    itself so that a move fails here, and the DAG processor's own scan (``iter_airflow_imports``) finds it."""
    import airflow.sdk
    from airflow.utils.file import iter_airflow_imports

    module = type(airflow.sdk.task).__module__
    assert module.startswith("airflow.sdk."), module
    for path in DAGS:
        assert module in set(iter_airflow_imports(str(path))), f"{path.name} does not name {module}"


def test_the_gates_notify_through_the_lazy_notifier(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.providers.standard.operators.hitl import HITLOperator

    from kvfleet.airflow.callbacks import GateWaitingNotifier

    gates = [(dag_id, t) for dag_id in ("kvfleet_rollout", "kvfleet_curvine_upgrade")
             for t in dagbag.get_dag(dag_id).tasks if isinstance(t, HITLOperator)]
    assert {d for d, _ in gates} == {"kvfleet_rollout", "kvfleet_curvine_upgrade"}
    for dag_id, gate in gates:
        assert [type(n) for n in gate.notifiers] == [GateWaitingNotifier], (dag_id, gate.task_id)


def test_the_rollout_teardown_runs_outside_the_cluster_pool_and_ahead_of_other_dags(dagbag) -> None:  # type: ignore[no-untyped-def]
    """``cluster.release`` frees the lease and restores the operator: it must not queue behind other runs'
    ``cluster.stages`` in kvfleet_cluster_changes. It runs in Airflow's default pool, and its weight (Airflow's
    default "downstream" rule: its own plus its downstream tasks') is above every task of the other kvfleet DAGs."""
    from kvfleet.airflow.operators import CLUSTER_POOL, ENDPOINT_POOL

    def weight(dag, task) -> int:  # type: ignore[no-untyped-def]
        return int(task.priority_weight + sum(dag.task_dict[t].priority_weight
                                              for t in task.get_flat_relative_ids(upstream=False)))

    rollout = dagbag.get_dag("kvfleet_rollout")
    release, stages = rollout.task_dict["cluster.release"], rollout.task_dict["cluster.stages"]
    assert release.pool == "default_pool" and release.is_teardown
    assert stages.pool == CLUSTER_POOL
    assert {rollout.task_dict[t].pool for t in rollout.task_dict if t.startswith("cluster.wave_")} == {ENDPOINT_POOL}
    assert release.priority_weight > 1
    others = max(weight(d, t) for dag_id in dagbag.dag_ids if dag_id != "kvfleet_rollout"
                 for d in [dagbag.get_dag(dag_id)] for t in d.tasks)
    assert weight(rollout, release) > others


def _as_list(callback: object) -> list[object]:
    return list(callback) if isinstance(callback, list | tuple) else [callback]


def test_callbacks_are_the_run_status_ones(dagbag) -> None:  # type: ignore[no-untyped-def]
    from kvfleet.airflow import callbacks

    for dag_id in (p.stem for p in DAGS):
        dag = dagbag.get_dag(dag_id)
        assert callbacks.on_dag_success in _as_list(dag.on_success_callback), dag_id
        assert callbacks.on_dag_failure in _as_list(dag.on_failure_callback), dag_id
        for task in dag.tasks:
            assert callbacks.on_task_failure in _as_list(task.on_failure_callback), (dag_id, task.task_id)


@pytest.mark.parametrize("path", DAGS, ids=[p.stem for p in DAGS])
def test_every_param_has_a_description_and_numbers_a_range(dagbag, path: Path) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.get_dag(path.stem)
    missing, unbounded = [], []
    for name in dag.params:
        if name.startswith("_"):
            continue
        param = dag.params.get_param(name)
        schema = param.schema
        if not (param.description and schema.get("title")):
            missing.append(name)
        types = schema.get("type")
        types = set(types) if isinstance(types, list) else {types}
        if types & {"integer", "number"} and not ("minimum" in schema and "maximum" in schema):
            unbounded.append(name)
    assert missing == [], f"{path.stem}: Params without a title and description: {missing}"
    assert unbounded == [], f"{path.stem}: numeric Params without minimum and maximum: {unbounded}"


def _fresh_dag(path: Path):  # type: ignore[no-untyped-def]
    """A DAG built afresh from its file (the session's DagBag is shared with tests that run DAGs, which change
    their tasks' Param values in this process)."""
    import runpy

    return runpy.run_path(str(path))[path.stem]()  # each file's @dag factory bears the DAG's id


@pytest.mark.parametrize("path", DAGS, ids=[p.stem for p in DAGS])
def test_a_deep_copy_of_a_dag_param_copies_its_value_and_shares_its_schema(path: Path) -> None:
    """Airflow deep-copies the DAG's Params at every operator ``__init__`` level (kvfleet.airflow.params
    ``_copied_cheaply``): kvfleet's Params copy their value and share their schema, so a parse does not walk the
    rollout's 15 schemas 52 times. The copy must be what Airflow's own deep copy gives in every attribute, and
    independent in value; each task's Params must be copies of the DAG's made that way (the schema the same
    object), which fails if Airflow stops deep-copying through ``__deepcopy__`` and the shortcut goes unused."""
    import copy

    from airflow.sdk import Param

    dag = _fresh_dag(path)
    assert dag.params, path.stem
    for name in dag.params:
        param = dag.params.get_param(name)
        twin = copy.deepcopy(param)
        assert type(twin) is Param and twin is not param, name  # the serializer accepts Airflow's class only
        own = {k: v for k, v in vars(param).items() if k != "__deepcopy__"}
        assert vars(twin) == own, name  # no attribute lost or added, the shortcut not carried on
        assert twin.schema is param.schema, name  # shared: Airflow's own deep copy would have walked it
        if isinstance(param.value, list | dict):
            assert twin.value is not param.value, name  # a task changing its value cannot change the DAG's
    checked = 0
    for task in dag.tasks:
        if task.params.keys() != dag.params.keys():
            continue  # HITL gates keep their own (task-level) Params only
        checked += 1
        for name in dag.params:
            mine, dags = task.params.get_param(name), dag.params.get_param(name)
            assert mine is not dags and mine.schema is dags.schema, (task.task_id, name)
            assert (mine.value, mine.description, mine.source) == (dags.value, dags.description, "dag"), (
                task.task_id, name)
    assert checked, path.stem


@pytest.mark.parametrize("path", DAGS, ids=[p.stem for p in DAGS])
def test_the_serialized_dag_is_the_same_with_the_shared_schema_copies(monkeypatch, path: Path) -> None:  # type: ignore[no-untyped-def]
    """The scheduler and the UI see the serialized DAG: it must not change because the Params copy themselves
    cheaply. Each file is parsed twice, with and without the shortcut, and serialized by Airflow."""
    from airflow.serialization.serialized_objects import DagSerialization

    from kvfleet.airflow import params

    cheap = DagSerialization.to_dict(_fresh_dag(path))
    monkeypatch.setattr(params, "_copied_cheaply", lambda p: p)
    plain = DagSerialization.to_dict(_fresh_dag(path))
    assert json.dumps(cheap, sort_keys=True, default=str) == json.dumps(plain, sort_keys=True, default=str)
