"""An engine's last stderr lines: the current process's, and the last exited one's.

What ``cuzkd status NAME`` shows under "stderr of the last exited process" and what the
``engine_exit_unexpected`` line carries. The lines of a process that just died may still be in
its pipe when the exit is reaped (a leftover descendant may even hold the pipe open), so an
exit takes the tail at once -- an immediate restart starts a new one -- and
:meth:`StderrTail.settle` reads it again once its reader is done, within
:data:`STDERR_DRAIN_TIMEOUT`. A panic's head stays whole in it, whatever follows
(:class:`~cuzkd.supervisor.core.stderrlines.StderrLines`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from cuzkd.supervisor.core.stderrlines import StderrLines

#: Lines of an engine's stderr kept for the exit log and ``cuzkd status NAME``.
STDERR_TAIL_LINES = 20
#: How long an exit report waits for the rest of a dead engine's stderr to be read.
STDERR_DRAIN_TIMEOUT = 1.0


@dataclass(frozen=True)
class ExitedTail:
    """One exit's tail, as :meth:`StderrTail.exited` took it."""

    lines: StderrLines
    reader: asyncio.Task[None] | None
    #: which exit of the engine it was (a later one owns ``last_exit``)
    number: int


class StderrTail:
    def __init__(self) -> None:
        self._lines = StderrLines(STDERR_TAIL_LINES)
        self._reader: asyncio.Task[None] | None = None
        self._exits = 0
        #: the last stderr lines of the process that exited last
        self.last_exit: list[str] = []

    def spawned(self) -> StderrLines:
        """A new process: the empty tail its stderr reader fills (see :meth:`read_by`)."""
        self._lines = StderrLines(STDERR_TAIL_LINES)
        return self._lines

    def read_by(self, reader: asyncio.Task[None]) -> None:
        """The task reading the current process's stderr into the tail."""
        self._reader = reader

    def exited(self) -> ExitedTail:
        """The current process exited: its lines so far are the last exit's."""
        self._exits += 1
        self.last_exit = list(self._lines)
        return ExitedTail(self._lines, self._reader, self._exits)

    def is_last(self, exited: ExitedTail) -> bool:
        """``exited`` is the engine's last exit (it did not exit again since)."""
        return self._exits == exited.number

    async def settle(self, exited: ExitedTail) -> list[str]:
        """``exited``'s whole tail, once its reader read the rest (bounded wait); it replaces
        ``last_exit`` unless the engine exited again since."""
        if exited.reader is not None:
            await asyncio.wait([exited.reader], timeout=STDERR_DRAIN_TIMEOUT)
        lines = list(exited.lines)
        if self.is_last(exited):  # no later exit since: these are still the last
            self.last_exit = lines
        return lines
