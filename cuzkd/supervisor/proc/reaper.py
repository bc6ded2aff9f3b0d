"""The one reaper: on SIGCHLD, collect every exited child with ``waitpid(-1, WNOHANG)``.

Engines and orphans re-parented to us (we are a child subreaper, or PID 1 in a container) are
collected by the same loop, so no zombie ever accumulates and nothing else in the process may
wait for children: asyncio's child watchers are never used (no ``create_subprocess_*``).
Every collected exit goes to ``on_exit``; the
:class:`~cuzkd.supervisor.proc.children.ChildTable` decides whose it was.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

from cuzkd.supervisor.core.exitcause import ProcessEnd


class Reaper:
    def __init__(self, on_exit: Callable[[int, int], object]) -> None:
        """``on_exit(pid, wait_status)`` is called for every child collected."""
        self._on_exit = on_exit
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()  # children that exited before the handler was in place

    def uninstall(self) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGCHLD)
            self._loop = None

    def reap(self) -> None:
        """Collect every child that has exited (SIGCHLDs coalesce, so loop until none)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._on_exit(pid, status)


def ended(wait_status: int) -> ProcessEnd:
    """Decode a raw ``waitpid`` status (the pure exit-cause rules take decoded values)."""
    if os.WIFSIGNALED(wait_status):
        return ProcessEnd(signal=os.WTERMSIG(wait_status), exit_code=None,
                          core_dumped=os.WCOREDUMP(wait_status))
    return ProcessEnd(signal=None, exit_code=os.waitstatus_to_exitcode(wait_status))
