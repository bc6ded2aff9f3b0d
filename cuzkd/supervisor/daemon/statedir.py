"""Single-owner locks: the state directory and the control socket each belong to one supervisor.

A second ``cuzkd run`` on the same state_dir would fight the first over engine sockets; one on
the same control_socket (with another state_dir) would unlink the first's socket and take its
control plane over. Both refuse to start instead. Each lock is an ``flock`` on a pid file
(``cuzkd.pid`` in the state dir, ``<control_socket>.lock`` beside the socket) holding the
owner's pid for the message: the kernel drops it when its owner dies, so a crashed supervisor
never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from cuzkd.errors import CuzkdError


class StateDirBusy(CuzkdError):
    """Another live supervisor holds the lock; the message names it and what it holds."""


class PidFileLock:
    """An ``flock`` on ``path`` for ``what`` (``"state_dir /x"``), its file holding our pid."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        # O_NOFOLLOW: a symlink planted here would make us truncate whatever it points at.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateDirBusy(f"another cuzkd (pid {owner}) is running with "
                               f"{self.what}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class StateDirLock(PidFileLock):
    """The state dir, created private (0700), locked through its ``cuzkd.pid``."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir / "cuzkd.pid", f"state_dir {state_dir}")
        self.state_dir = state_dir

    def acquire(self) -> None:
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        super().acquire()


class ControlSocketLock(PidFileLock):
    """``<control_socket>.lock``: whoever holds it owns the socket (and may replace a stale
    one)."""

    def __init__(self, control_socket: Path) -> None:
        super().__init__(control_socket.with_name(control_socket.name + ".lock"),
                         f"control_socket {control_socket}")
        self.control_socket = control_socket

    def acquire(self) -> None:
        self.control_socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        super().acquire()
