"""The state-dir lock: one owner, and no symlink in the state dir can redirect its writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuzkd.supervisor.statedir import StateDirBusy, StateDirLock


def test_second_owner_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path / "state")
    first.acquire()
    try:
        with pytest.raises(StateDirBusy, match=f"pid {os.getpid()}"):
            StateDirLock(tmp_path / "state").acquire()
    finally:
        first.release()
    StateDirLock(tmp_path / "state").acquire()  # free again once released


def test_a_planted_pid_file_symlink_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "cuzkd.pid").symlink_to(victim)
    with pytest.raises(OSError):
        StateDirLock(state).acquire()
    assert victim.read_text() == "precious\n"  # not truncated, not overwritten with our pid
