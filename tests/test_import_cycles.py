"""No import cycle anywhere in ``cuzkd/``, ``TYPE_CHECKING`` imports and function-level imports
included: a cycle means neither module can be read, tested or moved without the other.

The graph is built from the source with :mod:`ast`, not by importing, so every import counts
wherever it sits. ``from pkg import name`` is an import of ``pkg.name`` when that is a module,
else of ``pkg`` (its ``__init__``). A planted cycle in a copy of the package shows the check
can fail.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "cuzkd"

Graph = dict[str, set[str]]


def module_names(root: Path) -> dict[str, Path]:
    """Every module under ``root/cuzkd`` by dotted name (a package by its ``__init__``'s)."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``module`` (source at ``path``) imports, relative
    imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            names.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return (names & modules) - {module}


def import_graph(root: Path) -> Graph:
    """Module -> the modules of ``cuzkd`` it imports."""
    modules = module_names(root)
    return {module: imports_of(module, path, set(modules)) for module, path in modules.items()}


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_cuzkd() -> None:
    found = cycles(import_graph(REPO))
    assert not found, "modules importing each other, directly or around a loop: " + "; ".join(
        " <-> ".join(component) for component in found)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(REPO / PACKAGE, tmp_path / PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tmp_path


def plant(tree: Path, module: str, statement: str) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{statement}  # planted by the test\n")


def test_a_planted_cycle_under_type_checking_is_named(tree: Path) -> None:
    plant(tree, "cuzkd/config/schema.py",
          "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
          "    from cuzkd.config.doors import DoorPlan")
    [component] = cycles(import_graph(tree))
    assert {"cuzkd.config.doors", "cuzkd.config.schema"} <= set(component)


def test_a_function_level_relative_import_closes_a_cycle(tree: Path) -> None:
    plant(tree, "cuzkd/units.py", "def late() -> None:\n    from .config import schema")
    [component] = cycles(import_graph(tree))
    assert {"cuzkd.units", "cuzkd.config.schema"} <= set(component)


def test_from_a_package_import_a_submodule_imports_the_submodule_not_the_package(
        tree: Path) -> None:
    plant(tree, "cuzkd/config/checks.py", "from cuzkd.config import schema")
    plant(tree, "cuzkd/config/loading.py", "from cuzkd.config import Config")
    graph = import_graph(tree)
    assert "cuzkd.config" not in graph["cuzkd.config.checks"]
    assert "cuzkd.config" in graph["cuzkd.config.loading"]
    assert cycles(graph) == [["cuzkd.config", "cuzkd.config.loading"]]
