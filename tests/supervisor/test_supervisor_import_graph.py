"""The import graph around the composition root: only the CLI imports ``daemon``.

The control API, the read-only listener and the swap are typed against small protocols
(``cuzkd.supervisor.interfaces``, ``cuzkd.swap.rolling.SwapTarget``); a module importing the
daemon, even under ``TYPE_CHECKING``, would bring back the type-level cycle between the daemon and
its faces. Read from the source (``ast``), so imports under ``if TYPE_CHECKING:`` and inside
functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import cuzkd

PACKAGE = Path(cuzkd.__file__).parent
DAEMON = "cuzkd.supervisor.daemon"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute names (``from a import b`` gives a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def module_name(path: Path) -> str:
    return ".".join(("cuzkd", *path.relative_to(PACKAGE).with_suffix("").parts))


def test_only_the_cli_imports_the_daemon() -> None:
    importers = {module_name(p) for p in PACKAGE.rglob("*.py")
                 if DAEMON in imported_modules(p)}
    assert importers == {"cuzkd.supervisor.cli"}


def test_the_reading_sees_type_checking_and_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from cuzkd.supervisor.daemon import Supervisor\n"
                      "def f():\n    from cuzkd.supervisor import daemon\n")
    assert DAEMON in imported_modules(source)
    source.write_text("def f():\n    from cuzkd.supervisor import daemon\n")
    assert DAEMON in imported_modules(source)
