"""A child the supervisor did not spawn in this program: one it was handed by ``cuzkd upgrade``.

The old code spawned it (:class:`~cuzkd.supervisor.proc.spawn.EngineProcess`) and the exec kept
it: it is still this process's child (same PID), in its own process group, its
``PR_SET_PDEATHSIG`` armed for this process's main thread, which the exec keeps too. What the
new code needs of it is what :class:`~cuzkd.supervisor.proc.children.ChildProcess` is: its pid,
its output pipes (the descriptors the hand-over names) and its process group.
"""

from __future__ import annotations

import os
from typing import IO

from cuzkd.supervisor.proc.spawn import signal_group


class AdoptedProcess:
    """A running child taken over from the old code; ``pid`` is also its process group id."""

    def __init__(self, pid: int, stdout: int, stderr: int) -> None:
        """``stdout``/``stderr``: the read ends of its output pipes, owned from now on (made
        close-on-exec again, so no child spawned from here inherits them)."""
        self.pid = pid
        for fd in (stdout, stderr):
            os.set_inheritable(fd, False)
        self.stdout: IO[bytes] = os.fdopen(stdout, "rb")
        self.stderr: IO[bytes] = os.fdopen(stderr, "rb")
        self.returncode: int | None = None

    def reaped(self, wait_status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(wait_status)

    def signal_group(self, signum: int) -> bool:
        """Signal the whole process group; False if nothing in it is left."""
        return signal_group(self.pid, signum)
