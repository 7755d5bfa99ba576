"""Import contracts (docs/architecture.md, "Direction of imports"), checked on every import statement,
including the ones inside functions, which import-linter's static graph also sees.

- ``fleet`` imports no other kvfleet layer (only ``kvfleet.errors``, the shared error model);
- ``clients`` import no ``stages``, ``airflow`` or ``history`` (only ``fleet``, ``errors``, ``paths`` and
  ``settings``);
- ``kvfleet.settings`` (every ``KVFLEET_*`` variable) imports only ``kvfleet.errors`` and the chart-URL rule
  ``kvfleet.fleet.shared_rules``; ``kvfleet.paths`` (where the checkout, the SQL files and the state directory are)
  imports only ``kvfleet.settings``;
- product code never imports ``sandbox``; ``sandbox`` imports only ``kvfleet.fleet.constants``, the inventory model
  (the package ``kvfleet.fleet.inventory``, through which the twin reads a fleet file) and ``kvfleet.paths`` of the
  product, and the inventory model itself reaches nothing of the product outside ``kvfleet.fleet``;
- ``kvfleet_local`` (the demo and the local Airflow environment, in the twin's distribution) may use the product but
  reaches the twin as a process only; neither the product nor the twin imports it;
- there is no import cycle between kvfleet modules;
- no module name shadows the standard library.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "plugins" / "kvfleet"
SANDBOX = ROOT / "sandbox" / "kvfleet_sandbox"
LOCAL = ROOT / "sandbox" / "kvfleet_local"


def _module_name(path: Path) -> str:
    rel = path.relative_to(SANDBOX.parent if path.is_relative_to(SANDBOX.parent) else PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    roots = [PKG, *(p for p in [SANDBOX, LOCAL] if p.exists())]
    return {_module_name(p): p for root in roots for p in root.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:  # `if TYPE_CHECKING:` imports are annotations, not run-time dependencies
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in out if m.split(".")[0] in ("kvfleet", "kvfleet_sandbox", "kvfleet_local")}


MODULES = _modules()
GRAPH = {name: {m for m in _imports(name, path) if m in MODULES} for name, path in MODULES.items()}
RAW = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "kvfleet_sandbox":
        return "sandbox"
    if parts[0] == "kvfleet_local":
        return "local"
    return parts[1] if len(parts) > 1 else ""


def _violations(source_layer: str, allowed: tuple[str, ...]) -> list[str]:
    bad = []
    for name, deps in RAW.items():
        if _layer(name) != source_layer:
            continue
        for dep in deps:
            if not any(dep == a or dep.startswith(a + ".") for a in allowed):
                bad.append(f"{name} imports {dep}")
    return sorted(bad)


def test_fleet_imports_no_other_layer() -> None:
    assert _violations("fleet", ("kvfleet.fleet", "kvfleet.errors")) == []


def test_clients_import_no_stages_airflow_or_history() -> None:
    assert _violations("clients", ("kvfleet.clients", "kvfleet.fleet", "kvfleet.errors", "kvfleet.paths",
                                   "kvfleet.settings")) == []


def test_paths_and_settings_are_near_leaves() -> None:
    """``kvfleet.paths`` and ``kvfleet.settings`` are shared by every layer and the sandbox, so they import only
    each other's foundations: the settings, the error model and the pure chart-URL rule."""
    assert sorted(RAW["kvfleet.paths"]) == ["kvfleet.settings", "kvfleet.settings.load_settings"]
    assert GRAPH["kvfleet.settings"] == {"kvfleet.errors", "kvfleet.fleet.shared_rules"}
    assert RAW["kvfleet.fleet.shared_rules"] == set()


def test_product_code_never_imports_the_sandbox() -> None:
    bad = [f"{n} imports {d}" for n, deps in RAW.items() if _layer(n) != "sandbox"
           for d in deps if d.startswith("kvfleet_sandbox")]
    assert sorted(bad) == []


SANDBOX_MAY_IMPORT = ("kvfleet_sandbox", "kvfleet.fleet.constants", "kvfleet.fleet.inventory", "kvfleet.paths")


def test_sandbox_imports_only_fleet_constants_and_the_inventory_package_of_the_product() -> None:
    assert _violations("sandbox", SANDBOX_MAY_IMPORT) == []


def test_what_the_sandbox_imports_reaches_only_kvfleet_fleet() -> None:
    """The modules the sandbox may import pull in, transitively, nothing of the product but ``kvfleet.fleet``."""
    allowed = [m for m in GRAPH if any(m == a or m.startswith(a + ".") for a in SANDBOX_MAY_IMPORT[1:])]
    reached = set().union(*(_reachable(m) for m in allowed))
    assert "kvfleet.fleet.yaml_safe" in reached  # the model reads through the bounded loader
    # kvfleet.paths reads its one setting (the state directory) through kvfleet.settings
    assert sorted(m for m in reached if not (m.startswith("kvfleet.fleet")
                                             or m in ("kvfleet.paths", "kvfleet.settings", "kvfleet.errors"))) == []


def test_local_reaches_the_twin_as_a_process_and_nothing_imports_it() -> None:
    assert "kvfleet_local.env" in RAW and "kvfleet_local.demo" in RAW
    assert [f"{n} imports {d}" for n, deps in RAW.items() if _layer(n) == "local"
            for d in deps if d.startswith("kvfleet_sandbox")] == []
    assert [f"{n} imports {d}" for n, deps in RAW.items() if _layer(n) != "local"
            for d in deps if d.startswith("kvfleet_local")] == []


def _edges(v: str) -> set[str]:
    # a package's __init__ importing its own submodule, or a module importing its parent package, is Python's
    # package mechanics, not a cycle between modules
    return {w for w in GRAPH[v] if not (w == v or v.startswith(w + ".") or w.startswith(v + "."))}


def _reachable(v: str) -> set[str]:
    seen: set[str] = set()
    todo = [v]
    while todo:
        for w in _edges(todo.pop()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _cycles() -> list[list[str]]:
    """The import cycles: each group of modules that reach one another (a strongly connected component)."""
    reach = {v: _reachable(v) for v in GRAPH}
    groups = {tuple(sorted({v} | {w for w in reach[v] if v in reach[w]})) for v in GRAPH if v in reach[v]}
    return sorted(list(g) for g in groups if len(g) > 1)


def test_no_import_cycles_even_inside_functions() -> None:
    assert _cycles() == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_shadows_the_standard_library(name: str) -> None:
    leaf = name.rsplit(".", 1)[-1]
    assert leaf not in sys.stdlib_module_names or leaf in ("__init__",), (
        f"{name}: a module named {leaf!r} shadows the standard library when plugins/ is on sys.path")
