"""Binding a private (0600) listening Unix socket: the control socket, an engine's ``unix:`` status.

The socket file gets its mode before ``listen()``: until then a connect is refused, so there is
no moment a client could reach a socket with looser permissions -- and no process-wide umask is
changed (a umask held across an ``await``, or while a thread creates files, would leak into
everything else the process creates meanwhile). A stale socket left by a previous run is
replaced; anything else at the path is refused, never deleted.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

BACKLOG = 64


def remove_stale_socket(path: Path) -> None:
    """Remove a socket file left at ``path`` by a previous run; refuse to replace anything
    else (OSError saying so). ``path`` itself is not followed if it is a symlink."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, "exists and is not a socket; refusing to replace it",
                      str(path))
    path.unlink()


def bind_private_socket(path: Path, *, make_parent: bool = False) -> socket.socket:
    """A listening ``AF_UNIX`` socket at ``path``, mode 0600 before it accepts anything.

    ``make_parent``: create the directory 0700 when missing (the supervisor's control socket);
    otherwise a missing directory is the caller's error (an engine's ``--listen``).
    Synchronous on purpose: nothing else runs between the bind and the chmod.
    """
    if make_parent:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        path.chmod(0o600)  # bind created it (never follows a symlink): ours to chmod
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock
