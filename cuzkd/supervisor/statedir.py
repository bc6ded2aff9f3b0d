"""The state directory: created private (0700) and locked so one supervisor owns it.

A second ``cuzkd run`` on the same state_dir would fight the first over engine sockets and the
control socket, so it refuses to start. The lock is an ``flock`` on ``cuzkd.pid`` (which also
holds the owner's pid for the message): the kernel drops it when its owner dies, so a crashed
supervisor never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class StateDirBusy(Exception):
    pass


class StateDirLock:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / "cuzkd.pid"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        # O_NOFOLLOW: a symlink planted here would make us truncate whatever it points at.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateDirBusy(f"another cuzkd (pid {owner}) is running with state_dir "
                               f"{self.state_dir}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
