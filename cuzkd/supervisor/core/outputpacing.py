"""When to stop reading a flooding child's pipe, and for how long: the pipe paces the writer.

Reading keeps pace with any writer, and counting and dropping a flood flat out cost the
supervisor 50-100 % of a core. So once the reader discards, :class:`OutputPacer` pauses it after
each pipe's worth read, and the kernel's back-pressure holds the writer at no cost. A pause is
sized from the reading thread's CPU time, fed in like a clock, so that reading a flood takes
about :data:`SHARE` of a core, bounded by :data:`MAX_PAUSE` and :data:`FLOOR_BYTES_PER_SECOND`;
real cuzk logs synchronously, hence short pauses rather than few. A pause is never cut short: a
paused reader sees its child's exit one pause later at most. Pure: the caller passes the CPU
clock and acts on the pauses. See docs/supervisor.md, *Engine output limits*.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The share of a core reading a flooding pipe may take, by the reading thread's CPU time over
#: a window and its pause. A flooding engine should cost at most ~10 % of a core, and it has
#: two pipes. What a window's cost misses (the wake-ups, the log's writer thread) is small: a
#: flood costs the supervisor's whole process 4-6 % of a core (docs/benchmarks.md).
SHARE = 0.05
#: The longest pause: the longest a pause stalls a writer blocked on its full pipe.
MAX_PAUSE = 0.1
#: The shortest pause: at most 1/MIN_PAUSE wake-ups a second per pipe, each a timer outside any
#: window's cost.
MIN_PAUSE = 0.005
#: The slowest a paced writer is held to: a pause never exceeds a pipe's worth at this rate.
FLOOR_BYTES_PER_SECOND = float(1 << 20)


@dataclass
class PacingTotals:
    """Pauses since the start, for all the readers that share it (an engine's two pipes,
    every process of it)."""

    pauses: int = 0
    paused_seconds: float = 0.0
    longest_pause: float = 0.0

    def paused(self, seconds: float) -> None:
        self.pauses += 1
        self.paused_seconds += seconds
        self.longest_pause = max(self.longest_pause, seconds)


def longest_pause(pipe_bytes: int) -> float:
    """The longest pause for a pipe of ``pipe_bytes``: :data:`MAX_PAUSE`, or less, so that a
    pipe's worth a pause is no less than :data:`FLOOR_BYTES_PER_SECOND`."""
    return min(MAX_PAUSE, pipe_bytes / FLOOR_BYTES_PER_SECOND)


def pause_for(cost: float, pipe_bytes: int) -> float:
    """The pause after a window that cost ``cost`` CPU seconds: that cost is :data:`SHARE` of
    the window and its pause, within :data:`MIN_PAUSE` and :func:`longest_pause`."""
    wanted = max(0.0, cost) * (1 - SHARE) / SHARE
    return max(MIN_PAUSE, min(wanted, longest_pause(pipe_bytes)))


class OutputPacer:
    """One pipe's pacing: :meth:`read` after each read, :meth:`resumed` when reading again."""

    def __init__(self, pipe_bytes: int, cpu: float, totals: PacingTotals | None = None) -> None:
        #: a window's bytes: the pipe's size, what a writer blocked on it is freed for
        self.pipe_bytes = max(1, pipe_bytes)
        self.totals = PacingTotals() if totals is None else totals
        self._window_bytes = 0
        self._window_cpu = cpu
        self._discarded = False

    def read(self, size: int, *, discarded: bool, cpu: float) -> float | None:
        """After a read of ``size`` bytes (``discarded``: it discarded some; ``cpu``: the
        reading thread's CPU clock now): how long to stop reading, or None to read on."""
        self._window_bytes += size
        self._discarded = self._discarded or discarded
        if self._window_bytes < self.pipe_bytes:
            return None
        cost, discarding = cpu - self._window_cpu, self._discarded
        self._window(cpu)
        if not discarding:  # a pipe's worth read without a discard: no flood (any more)
            return None
        pause = pause_for(cost, self.pipe_bytes)
        self.totals.paused(pause)
        return pause

    def resumed(self, cpu: float) -> None:
        """Reading again after a pause: a new window starts (its cost is counted from here)."""
        self._window(cpu)

    def _window(self, cpu: float) -> None:
        self._window_bytes = 0
        self._window_cpu = cpu
        self._discarded = False
