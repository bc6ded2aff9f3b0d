"""When a metrics connection is idle: no byte moved for ``idle`` seconds. Pure: fed ``now``.

A byte moved when one arrived, when the transport resumed writing, or when the bytes waiting
for the client changed since the last look (the transport's buffer, the kernel's send queue).
So a response still being read, however slowly, is never idle; the listener
(:mod:`cuzkd.supervisor.web.listener`) measures the queues, asks :meth:`IdleWatch.look` what
to do, and does it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Looks at a connection's queues per ``idle`` while bytes wait in them (a kernel's send queue
#: moves unseen): such a connection is closed within 1/4 more than ``idle``.
IDLE_CHECKS = 4

#: Bytes waiting for the client: (the transport's buffer, the kernel's send queue).
Queues = tuple[int, int]


@dataclass(frozen=True)
class Close:
    """No byte moved for ``idle`` seconds: close the connection."""


@dataclass(frozen=True)
class LookAgain:
    """Look at the connection again in ``after`` seconds."""

    after: float


class IdleWatch:
    """One connection's silence: when a byte last moved, and the queues at the last look."""

    def __init__(self, idle: float) -> None:
        self.idle = idle
        self._moved_at = 0.0
        self._queues: Queues = (0, 0)

    def moved(self, now: float) -> None:
        """A byte moved now (one arrived, or the transport resumed writing)."""
        self._moved_at = now

    def look(self, now: float, queues: Queues) -> Close | LookAgain:
        """Close after ``idle`` quiet seconds; else look again soon while bytes wait (they may
        move in the kernel only), at the idle time otherwise."""
        if queues != self._queues:
            self._queues = queues
            self.moved(now)
        quiet = now - self._moved_at
        if quiet >= self.idle:
            return Close()
        if any(queues):
            return LookAgain(self.idle / IDLE_CHECKS)
        return LookAgain(self.idle - quiet)
