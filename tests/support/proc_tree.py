"""A ``/proc`` written by a test, for the readers' ``proc_root`` (:mod:`cuzkd.procfs`).

The live ``/proc`` cannot be made to show what the parsers must survive: a command name with
spaces and parentheses, a stat line that does not parse, an executable replaced under its
process. A :class:`ProcTree` writes just the files a reader opens, in the kernel's formats.
"""

from __future__ import annotations

from pathlib import Path

#: Pids above the kernel's largest (``pid_max`` is at most 2**22): never this test's own.
FIRST_FAKE_PID = 10_000_000


class ProcTree:
    """A fixture ``/proc`` under ``root``; each ``process`` adds one ``/proc/PID``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def process(self, pid: int, *, comm: str = "engine", state: str = "S", ppid: int = 1,
                pgrp: int | None = None, start: int = 1000,
                environ: dict[str, str] | None = None,
                children: dict[int, list[int]] | None = None) -> Path:
        """``/proc/PID`` with its ``stat`` line and, if given, its ``environ`` and the
        ``task/TID/children`` files (thread id -> its children; the main thread's is pid)."""
        directory = self.root / str(pid)
        directory.mkdir()
        self.write_stat(pid, f"{pid} ({comm}) {state} {ppid} {pgrp if pgrp is not None else pid}"
                             f" {pid} 0 -1 4194304 {' '.join(['0'] * 12)} {start} 12345 67")
        if environ is not None:
            (directory / "environ").write_bytes(
                b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
        for tid, kids in (children or {}).items():
            task = directory / "task" / str(tid)
            task.mkdir(parents=True)
            (task / "children").write_text("".join(f"{k} " for k in kids))
        return directory

    def write_stat(self, pid: int, line: str) -> None:
        """Replace ``/proc/PID/stat`` with ``line`` as given (to break it on purpose)."""
        (self.root / str(pid) / "stat").write_text(line + "\n")

    def boot_id(self, text: str) -> None:
        path = self.root / "sys" / "kernel" / "random" / "boot_id"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
