"""The clock the supervisor holds its engines to: monotonic time less the time it did not run.

Every deadline kept against an engine -- ``unhealthy_after``, ``status_timeout``,
``start_timeout``, ``stall_after``, the stop sequence's ``drain_timeout`` and ``stop_timeout`` --
is measured on a monotonic clock. When the supervisor itself stops running (``kill -STOP``, a VM
paused, a host deep in swap, a log write blocked on a stalled journald), that clock moves on, and
at the first wake-up every deadline has passed at once although the engines answered all along:
their replies are waiting in the sockets. Blaming them for it would kill every engine, skipping
the drain, for a fault of the supervisor's own.

From inside a process the only sign of a freeze is a timer firing late. :class:`RunClock` keeps one
timer of its own, a heartbeat every :data:`HEARTBEAT` seconds, and whenever it is read it compares
the monotonic clock with the heartbeat's due time: lateness beyond
:data:`~cuzkd.supervisor.core.freezes.FREEZE_THRESHOLD` is a freeze, seen by the first reading after
the resume -- whichever callback reads first, so no decision is ever taken on a clock that still
counts the freeze. :meth:`RunClock.now` is the monotonic clock less every freeze, so a deadline read
from it
excludes them; :attr:`RunClock.frozen_seconds_total` read before and after a wait tells how
much of it the supervisor spent frozen, so a status poll whose timeout ran out mostly while
nothing read the reply says nothing about the engine
(:func:`~cuzkd.supervisor.core.freezes.said_nothing`), and fresh evidence gathered after the
supervisor runs again decides. The arithmetic is
:class:`~cuzkd.supervisor.core.freezes.FreezeLedger`'s, pure and fed plain numbers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from cuzkd.supervisor.core.freezes import FreezeLedger

log = structlog.get_logger("cuzkd.supervisor")

#: Seconds between two beats of the heartbeat timer.
HEARTBEAT = 0.25

class RunClock:
    """The supervisor's clock for its engines' deadlines (see the module doc).

    ``clock`` is the raw monotonic clock (tests on virtual time pass ``loop.time``). Until
    :meth:`start` the heartbeat does not run and no freeze is ever seen: the plain monotonic
    clock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ledger = FreezeLedger()
        self._due: float | None = None
        self._beat: asyncio.TimerHandle | None = None

    @property
    def freezes(self) -> int:
        """How many freezes have been seen."""
        self._check()
        return self._ledger.freezes

    @property
    def frozen_seconds_total(self) -> float:
        self._check()
        return self._ledger.frozen_total

    def now(self) -> float:
        """Monotonic seconds during which the supervisor ran."""
        raw = self._clock()
        self._check(raw)
        return raw - self._ledger.frozen_total

    def start(self) -> None:
        """Start the heartbeat on the running loop."""
        if self._beat is None:
            self._schedule(asyncio.get_running_loop())

    def close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = self._due = None

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = self._clock() + HEARTBEAT
        self._beat = loop.call_at(self._due, self._on_beat, loop)

    def _on_beat(self, loop: asyncio.AbstractEventLoop) -> None:
        self._check()
        self._schedule(loop)

    def _check(self, raw: float | None = None) -> None:
        """Count the heartbeat's lateness, if any, as a freeze (once: the ledger merges)."""
        if self._due is None:
            return
        raw = self._clock() if raw is None else raw
        before = self._ledger.freezes
        added = self._ledger.late(self._due, raw)
        if added > 0 and self._ledger.freezes != before:
            log.warning("supervisor_resumed", frozen_seconds=round(raw - self._due, 3),
                        detail="the supervisor did not run (stopped, paused or blocked); that "
                               "time is not counted against any engine")
