"""``cuzkd.swap.inuse`` on a fixture ``/proc`` (``proc_root``): what each exe link reads as.

test_swap_running.py runs real processes; here the link texts the kernel writes only in odd
moments are written by the test: a `` (deleted)`` suffix, a link to nothing, a pid without one.
"""

from __future__ import annotations

import os
from pathlib import Path

from support.proc_tree import FIRST_FAKE_PID

from cuzkd.swap import inuse
from cuzkd.swap.inuse import Executable

A, B, C = (FIRST_FAKE_PID + n for n in range(1, 4))


def _exe(proc: Path, pid: int, target: str | None) -> None:
    (proc / str(pid)).mkdir(parents=True)
    if target is not None:
        (proc / str(pid) / "exe").symlink_to(target)


def test_a_deleted_executable_is_matched_by_inode_only(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    gone = tmp_path / "releases" / "v1" / "cuzk"
    _exe(proc, A, f"{gone} (deleted)")
    assert inuse.executable_of(A, proc_root=proc) == Executable(A, str(gone), True, None)


def test_a_live_executable_has_its_path_and_inode(tmp_path: Path) -> None:
    proc, binary = tmp_path / "proc", tmp_path / "cuzk"
    binary.write_bytes(b"\x7fELF")
    _exe(proc, A, str(binary))
    st = os.stat(binary)
    exe = inuse.executable_of(A, proc_root=proc)
    assert exe == Executable(A, str(binary), False, (st.st_dev, st.st_ino))
    file = inuse.identify(binary)
    assert file is not None and inuse.executes(exe, file)


def test_the_scan_lists_pids_only_and_skips_those_without_a_link(tmp_path: Path) -> None:
    proc, binary = tmp_path / "proc", tmp_path / "cuzk"
    binary.write_bytes(b"\x7fELF")
    _exe(proc, A, str(binary))
    _exe(proc, B, None)  # a kernel thread (or a process hidden from us): no readable link
    _exe(proc, C, str(tmp_path / "nothing"))  # a link to nothing: its text, no inode
    (proc / "self").symlink_to(str(A))  # not a pid
    (proc / "sys").mkdir()
    assert inuse.executable_of(B, proc_root=proc) is None
    assert inuse.executable_of(FIRST_FAKE_PID, proc_root=proc) is None  # no such pid
    found = sorted(inuse.running_executables(proc_root=proc), key=lambda e: e.pid)
    assert [(e.pid, e.path, e.key is None) for e in found] == [
        (A, str(binary), False), (C, str(tmp_path / "nothing"), True)]
