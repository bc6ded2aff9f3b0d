"""Spawn errors are classified from real failing spawns: transient ones retry, others fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cuzkd.supervisor.proc.spawn import EngineProcess, spawn_error_is_transient


def _spawn_error(argv: list[str]) -> OSError:
    with pytest.raises(OSError) as caught:
        EngineProcess(argv, {})
    return caught.value


def test_missing_binary_is_permanent(tmp_path: Path) -> None:
    exc = _spawn_error([str(tmp_path / "no-such-cuzk")])
    assert isinstance(exc, FileNotFoundError)
    assert not spawn_error_is_transient(exc)


def test_not_executable_is_permanent(tmp_path: Path) -> None:
    binary = tmp_path / "cuzk"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o644)
    exc = _spawn_error([str(binary)])
    assert isinstance(exc, PermissionError)
    assert not spawn_error_is_transient(exc)


def test_exec_format_error_is_permanent(tmp_path: Path) -> None:
    binary = tmp_path / "cuzk"
    binary.write_bytes(b"\x7fELF garbage, not a program")
    binary.chmod(0o755)
    exc = _spawn_error([str(binary)])
    assert exc.strerror is not None and "format" in exc.strerror.lower()
    assert not spawn_error_is_transient(exc)


def test_nul_byte_is_permanent() -> None:
    with pytest.raises(ValueError) as caught:
        EngineProcess(["true", "a\0b"], {})
    assert not spawn_error_is_transient(caught.value)


# Run in a child so the descriptor limit of the test process is never touched: lower the soft
# limit to what is open now, so the spawn's pipes cannot be created.
_EMFILE = """
import os, resource
from cuzkd.supervisor.proc.spawn import EngineProcess, spawn_error_is_transient
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
try:
    EngineProcess(["true"], {})
except OSError as exc:
    print(exc.errno == __import__("errno").EMFILE, spawn_error_is_transient(exc))
else:
    print("spawned")
"""


def test_descriptor_exhaustion_is_transient() -> None:
    out = subprocess.run([sys.executable, "-c", _EMFILE], capture_output=True, text=True,
                         timeout=30, check=True).stdout.split()
    assert out == ["True", "True"]
