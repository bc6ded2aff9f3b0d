"""Reaping: double-forked grandchildren are adopted (subreaper / PID 1) and reaped."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from support.supervisor_harness import (
    scripted_engine,
    start_supervisor,
    write_config,
    zombie_children,
)
from support.waiting import wait_until

GRANDCHILDREN = 100


def _zombies_reaped(sup: object) -> int:
    return int(sup.about()["zombies_reaped_total"])  # type: ignore[attr-defined]


def _config(tmp_path: Path) -> Path:
    eng = scripted_engine(tmp_path, "forker", args=["--grandchildren", str(GRANDCHILDREN)])
    return write_config(tmp_path, [eng])


def test_double_forked_grandchildren_are_reaped(tmp_path: Path) -> None:
    sup = start_supervisor(_config(tmp_path))
    try:
        wait_until(lambda: _zombies_reaped(sup) >= GRANDCHILDREN, 30, "orphans reaped")
        assert zombie_children(sup.proc.pid) == []
        assert sup.engine("forker")["state"] == "running"
    finally:
        assert sup.stop() == 0


def _unshare_works() -> str | None:
    try:
        proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if proc.returncode == 0 else proc.stderr.strip() or "unshare failed"


def test_as_pid_1_in_a_pid_namespace(tmp_path: Path) -> None:
    refused = _unshare_works()
    if refused:
        pytest.skip(f"cannot create a PID namespace here: {refused}")
    sup = start_supervisor(_config(tmp_path),
                           prefix=["unshare", "--pid", "--fork", "--mount-proc"])
    try:
        assert sup.about()["pid"] == 1
        wait_until(lambda: _zombies_reaped(sup) >= GRANDCHILDREN, 30, "orphans reaped")
        children = Path(f"/proc/{sup.proc.pid}/task/{sup.proc.pid}/children").read_text().split()
        [pid1] = [int(c) for c in children]  # the supervisor, seen from outside
        assert zombie_children(pid1) == []
        os.kill(pid1, signal.SIGTERM)  # as PID 1 it only gets signals it handles
        assert sup.proc.wait(20) == 0
    finally:
        sup.close()
    assert sup.events("supervisor_stopped")
