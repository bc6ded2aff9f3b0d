"""The arithmetic of the supervisor's own freezes (see :mod:`cuzkd.supervisor.engines.runclock`).

Pure: lateness of a timer in, seconds of freeze out, and the rule for when a failed wait says
nothing about the other side. :class:`~cuzkd.supervisor.engines.runclock.RunClock` is the loop
shell that feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A timer this many seconds late means the supervisor did not run (a busy loop is a few ms
#: late; anything under this is not subtracted, which errs on the engine's side by at most it).
FREEZE_THRESHOLD = 0.5
#: A failed wait frozen for at least this share of its timeout was no fair trial.
UNFAIR_SHARE = 0.5


def said_nothing(frozen_during: float, timeout: float) -> bool:
    """Whether a wait with ``timeout`` that failed, during which the supervisor was frozen for
    ``frozen_during`` seconds, says nothing about the other side: its time ran out mostly while
    nobody read the answer. A share, not "any freeze at all": a loop blocked again and again
    (a hostile document, a starved host) must still find an engine that never answers."""
    return frozen_during >= UNFAIR_SHARE * timeout


@dataclass
class FreezeLedger:
    """The freezes seen so far, as intervals of the raw monotonic clock.

    Several late timers can report one freeze, in any order; the time counted is the union of
    what they report, so one freeze is never counted twice.
    """

    #: seconds the supervisor did not run, in all
    frozen_total: float = 0.0
    #: freezes seen (one per interval that did not overlap the previous one)
    freezes: int = 0
    #: the latest freeze, [start, end] on the raw clock
    _start: float = 0.0
    _end: float = float("-inf")

    def late(self, due: float, now: float) -> float:
        """A timer due at ``due`` fired (or was found overdue) at ``now``: the seconds of
        freeze this adds to what was known (0 when it is not late enough, or known already)."""
        if now - due <= FREEZE_THRESHOLD:
            return 0.0
        if due <= self._end:  # the same freeze, seen again by another timer
            before = self._end - self._start
            self._start, self._end = min(self._start, due), max(self._end, now)
            added = (self._end - self._start) - before
        else:
            self._start, self._end = due, now
            self.freezes += 1
            added = now - due
        self.frozen_total += added
        return added

    @classmethod
    def carried(cls, frozen_total: float, freezes: int, handed_at: float,
                now: float) -> FreezeLedger:
        """The ledger of the program this one replaced (``cuzkd upgrade``), with its exec's
        gap -- from its last decision at ``handed_at`` to ``now`` -- as one more freeze,
        however short: nothing was watching the engines meanwhile."""
        gap = max(0.0, now - handed_at)
        return cls(frozen_total + gap, freezes + 1, handed_at, now)
