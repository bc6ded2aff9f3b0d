"""The design diagram's import contracts (``[tool.importlinter]`` in pyproject.toml) can fail.

``scripts/test.sh`` runs ``lint-imports`` on the tree as it is. Here each contract is broken on
purpose, in a copy of the package, by the one import a careless change would add, and
``lint-imports`` must refuse that copy naming the offending import; the unchanged copy passes, so
a refusal is the planted import's doing, not the copy's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(tree: Path, contract: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [str(LINT_IMPORTS), str(tree / "pyproject.toml"), "--no-cache"]
    if contract is not None:
        argv += ["--contract", contract]
    # The copy first on the path: the editable install's finder comes after sys.path.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "cuzkd", tmp_path / "cuzkd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_unchanged_copy_keeps_every_contract(tree: Path) -> None:
    result = lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.replace("0 broken", "")


# (contract id, module that gains the import, the import, what lint-imports must name)
BREAKS = [
    ("layers", "cuzkd/status/document.py", "import cuzkd.supervisor.tasks",
     "cuzkd.status is not allowed to import cuzkd.supervisor"),
    ("layers", "cuzkd/bundled/ntt.py", "import cuzkd.supervisor.core.backoff",
     "cuzkd.bundled is not allowed to import cuzkd.supervisor"),
    ("layers", "cuzkd/metrics/tally.py", "import cuzkd.cli.control_client",
     "cuzkd.metrics is not allowed to import cuzkd.cli"),
    ("supervisor-layers", "cuzkd/supervisor/core/backoff.py",
     "import cuzkd.supervisor.proc.pids",
     "cuzkd.supervisor.core is not allowed to import cuzkd.supervisor.proc"),
    ("supervisor-layers", "cuzkd/supervisor/engines/runner.py",
     "import cuzkd.supervisor.web.servers",
     "cuzkd.supervisor.engines is not allowed to import cuzkd.supervisor.web"),
    ("supervisor-layers", "cuzkd/supervisor/engines/runner.py",
     "import cuzkd.supervisor.door.relay",
     "cuzkd.supervisor.engines is not allowed to import cuzkd.supervisor.door"),
    ("supervisor-layers", "cuzkd/supervisor/door/relay.py",
     "import cuzkd.supervisor.web.servers",
     "cuzkd.supervisor.door is not allowed to import cuzkd.supervisor.web"),
    ("pure-core", "cuzkd/supervisor/core/lifecycle.py", "import asyncio",
     "cuzkd.supervisor.core is not allowed to import asyncio"),
    ("pure-core", "cuzkd/supervisor/core/stall.py", "import os",
     "cuzkd.supervisor.core is not allowed to import os"),
    ("one-reaper", "cuzkd/supervisor/door/process.py", "import subprocess",
     "cuzkd.supervisor.door.process -> subprocess"),
    ("one-reaper", "cuzkd/bundled/pipeline.py", "import multiprocessing",
     "cuzkd.bundled.pipeline -> multiprocessing"),
    ("composition-root", "cuzkd/cli/swap_commands.py", "import cuzkd.supervisor.daemon.root",
     "cuzkd.cli.swap_commands"),
]


@pytest.mark.parametrize(("contract", "module", "statement", "named"), BREAKS,
                         ids=[f"{c}:{m.removeprefix('cuzkd/')}" for c, m, _, _ in BREAKS])
def test_a_planted_import_breaks_its_contract(tree: Path, contract: str, module: str,
                                              statement: str, named: str) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{statement}  # planted by the test\n")
    result = lint(tree, contract)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert named in " ".join(result.stdout.split()), result.stdout


def test_a_new_top_level_module_must_be_placed_in_a_layer(tree: Path) -> None:
    (tree / "cuzkd" / "helpers.py").write_text('"""Somewhere the diagram does not say."""\n')
    result = lint(tree, "layers")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cuzkd.helpers" in result.stdout
