"""Fixtures for the swap tests: a store in a temporary directory and real executables."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from cuzkd.swap.releases import ReleaseStore

MakeBinary = Callable[[str], Path]


@pytest.fixture
def store(tmp_path: Path) -> ReleaseStore:
    return ReleaseStore(tmp_path / "state")


@pytest.fixture
def make_script(tmp_path: Path) -> MakeBinary:
    """A runnable ``#!/bin/sh`` script printing ``tag``: distinct content per tag."""

    def make(tag: str) -> Path:
        path = tmp_path / "build" / tag / "cuzk"
        path.parent.mkdir(parents=True)
        path.write_text(f"#!/bin/sh\necho {tag}\n")
        path.chmod(0o755)
        return path

    return make


@pytest.fixture
def make_elf(tmp_path: Path) -> MakeBinary:
    """A copy of ``cat`` with ``tag`` appended (ELF loaders ignore trailing bytes).

    Unlike a script, a process running it has this very file as ``/proc/PID/exe``.
    """
    cat = shutil.which("cat")
    assert cat is not None

    def make(tag: str) -> Path:
        path = tmp_path / "build" / tag / "cuzk"
        path.parent.mkdir(parents=True)
        path.write_bytes(Path(cat).read_bytes() + tag.encode())
        path.chmod(0o755)
        return path

    return make

