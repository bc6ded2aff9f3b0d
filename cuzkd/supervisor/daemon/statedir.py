"""Single-owner locks: the state directory and the control socket each belong to one supervisor.

A second ``cuzkd run`` on the same state_dir would fight the first over engine sockets; one on
the same control_socket (with another state_dir) would unlink the first's socket and take its
control plane over. Both refuse to start instead. Each lock is an ``flock`` on a pid file
(``cuzkd.pid`` in the state dir, ``<control_socket>.lock`` beside the socket) holding the
owner's pid for the message: the kernel drops it when its owner dies, so a crashed supervisor
never leaves a stale lock behind.

A directory cuzkd cannot write (a read-only mount, another user's directory) is a config
mistake, refused as every other one: :func:`unusable_dir` names the file, the key and what is
needed (exit 78) instead of a bare ``[Errno 30] Read-only file system``. The state dir is
probed at once (a file created and removed) rather than at the first engine socket or release.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from cuzkd.config import Config, addresses
from cuzkd.errors import ConfigError, StateDirBusy

#: Created and removed in the state dir at start: proof that cuzkd can write there.
WRITE_PROBE = ".write-probe"


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

    def adopt(self, fd: int) -> None:
        """Hold the lock the program this one replaced held (``cuzkd upgrade``): the same
        open file, so the ``flock`` never lapsed."""
        os.set_inheritable(fd, False)
        self._fd = fd

    def fileno(self) -> int:
        assert self._fd is not None
        return self._fd

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
        probe_writable(self.state_dir)
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


def probe_writable(directory: Path) -> None:
    """Create and remove a file in ``directory`` (OSError when it cannot be done). O_NOFOLLOW
    and O_EXCL: a symlink planted as the probe's name is removed, never written through."""
    probe = directory / WRITE_PROBE
    with contextlib.suppress(FileNotFoundError):
        probe.unlink()  # a crash's leftover (unlink does not follow a symlink)
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600))
    probe.unlink()


def unusable_dir(config: Config, exc: OSError, *, control_socket: bool = False) -> ConfigError:
    """The config error for a directory cuzkd could not create or write: the state dir, or
    (``control_socket``) the control socket's, which is the state dir's unless set."""
    where = config.path or "the built-in default config"
    state_dir = addresses.state_dir(config)
    if control_socket and config.supervisor.control_socket:
        key = "key `supervisor.control_socket`"
    elif config.supervisor.state_dir:
        key = "key `supervisor.state_dir`"
    else:
        key = f"key `supervisor.state_dir` (unset: the default state dir, {state_dir})"
    unwritable = addresses.control_socket(config).parent if control_socket else state_dir
    path = exc.filename or unwritable
    return ConfigError(
        f"{where}: {key}: cannot write {path}: {exc.strerror}; cuzkd needs a writable "
        f"directory owned by the user it runs as (uid {os.geteuid()}) -- under systemd, "
        f"StateDirectory= makes one")
