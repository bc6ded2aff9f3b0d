"""The clock the supervisor holds its engines to: monotonic time less the time it did not run.

When the supervisor itself stops running, say under ``kill -STOP``, in a paused VM or behind a
log write blocked on a stalled journald, the monotonic clock moves on and every deadline kept
against an engine would pass at once although the engines answered all along. From inside a
process the only sign of a freeze is a timer firing late, so :class:`RunClock` keeps a heartbeat
every :data:`HEARTBEAT` seconds and, whenever it is read, counts its lateness beyond
:data:`~cuzkd.supervisor.core.freezes.FREEZE_THRESHOLD` as a freeze. :meth:`RunClock.now` is the
monotonic clock less every freeze, and :attr:`RunClock.frozen_seconds_total` read around a wait
tells whether a failed poll says anything (:func:`~cuzkd.supervisor.core.freezes.said_nothing`).
The arithmetic is :class:`~cuzkd.supervisor.core.freezes.FreezeLedger`'s, pure. See
docs/supervisor.md, *Lifecycle rules*.
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
    """The supervisor's clock for its engines' deadlines: monotonic time less every freeze.

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

    def raw(self) -> float:
        """The raw monotonic clock (the hand-over's ``handed_at``: it is the host's, so the
        program that replaces this one reads the same clock)."""
        return self._clock()

    def adopt(self, frozen_seconds: float, freezes: int, handed_at: float) -> float:
        """Continue the old code's clock (``cuzkd upgrade``): its freezes, and the exec's gap
        since ``handed_at`` as one more; the gap in seconds."""
        now = self._clock()
        self._ledger = FreezeLedger.carried(frozen_seconds, freezes, handed_at, now)
        return now - handed_at

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
