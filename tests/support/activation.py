"""Socket activation as systemd does it, for a real ``cuzkd run``: the socket at fd 3, and
``LISTEN_PID`` the pid of the process that gets it (known only after the fork: a wrapper sets
it, then execs cuzkd in its own place, as systemd's executor does)."""

from __future__ import annotations

import sys

_WRAPPER = ("import os, sys; fd = int(sys.argv[1]); fd == 3 or (os.dup2(fd, 3), os.close(fd)); "
            "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1', "
            "LISTEN_FDNAMES=sys.argv[2]); os.execv(sys.argv[3], sys.argv[3:])")


def activated(fd: int, name: str = "door") -> list[str]:
    """The ``prefix`` for :func:`support.supervisor_harness.start_supervisor` (with
    ``pass_fds=(fd,)``) that hands it ``fd`` as systemd's first passed socket."""
    return [sys.executable, "-c", _WRAPPER, str(fd), name]
