"""How much of an engine's output reaches the log: two token buckets (lines and bytes) fed ``now``.

An engine writing short lines flat out once made the supervisor spend a whole core turning
each 39-byte line into a 230-byte event, and write 25 MB/s of log. Only lines this budget
admits are logged; the rest are counted and reported as suppressed (and once it refuses, the
reader paces the flood by its pipe: :mod:`~cuzkd.supervisor.core.outputpacing`).

The budget refills at ``lines_per_second`` and ``bytes_per_second`` up to ``burst_lines`` and
``burst_bytes``; a line is admitted when both buckets hold enough for it, and takes its share
of both. A line longer than the whole byte burst is admitted by a full byte bucket (and
empties it), so no line is refused for its length alone. Suppressed lines are reported once
per :data:`REPORT_INTERVAL` at most (:meth:`OutputBudget.report`), always with what was
suppressed since the last report, and at the end of the output (``final``).

One budget serves both of an engine's pipes and outlives its restarts: the counts are the
engine's (``cuzkd_engine_output_dropped_*_total``). Pure: the caller passes ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Shortest time between two reports of suppressed lines for one engine.
REPORT_INTERVAL = 10.0


@dataclass(frozen=True)
class OutputLimits:
    """An engine's output limits (its ``output_*`` config keys)."""

    lines_per_second: float
    bytes_per_second: float
    burst_lines: int
    burst_bytes: int


@dataclass(frozen=True)
class Suppressed:
    """Lines (and their bytes) refused over ``seconds``: one ``engine_output_suppressed`` event."""

    lines: int
    bytes: int
    seconds: float


class OutputBudget:
    """One engine's output budget; both buckets start full."""

    def __init__(self, limits: OutputLimits, now: float) -> None:
        self.limits = limits
        self._lines = float(limits.burst_lines)
        self._bytes = float(limits.burst_bytes)
        self._refilled = now
        #: lines and bytes refused since the start
        self.dropped_lines_total = 0
        self.dropped_bytes_total = 0
        #: refused since the last report, and when the first of them was
        self._unreported_lines = 0
        self._unreported_bytes = 0
        self._unreported_since = now
        self._last_report: float | None = None

    def admit(self, size: int, now: float) -> bool:
        """Whether one line of ``size`` bytes is logged; a refused one is counted."""
        self._refill(now)
        if self._lines >= 1 and self._bytes >= min(size, self.limits.burst_bytes):
            self._lines -= 1
            self._bytes = max(0.0, self._bytes - size)
            return True
        self.refuse(1, size, now)
        return False

    def refuse(self, lines: int, size: int, now: float) -> None:
        """Count ``lines`` lines of ``size`` bytes in all as suppressed (the rest of a read
        the budget refused, counted in bulk rather than line by line)."""
        if not self._unreported_lines:
            self._unreported_since = now
        self._unreported_lines += lines
        self._unreported_bytes += size
        self.dropped_lines_total += lines
        self.dropped_bytes_total += size

    def cut(self, size: int) -> None:
        """Count ``size`` bytes of an over-long line's rest, discarded (not a line refused)."""
        self.dropped_bytes_total += size

    def report(self, now: float, *, final: bool = False) -> Suppressed | None:
        """What to report as suppressed now: None when nothing was, or when the last report
        is less than :data:`REPORT_INTERVAL` old (unless ``final``: the output ended)."""
        if not self._unreported_lines:
            return None
        if (not final and self._last_report is not None
                and now - self._last_report < REPORT_INTERVAL):
            return None
        report = Suppressed(self._unreported_lines, self._unreported_bytes,
                            now - self._unreported_since)
        self._unreported_lines = self._unreported_bytes = 0
        self._last_report = now
        return report

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._refilled)
        self._refilled = max(self._refilled, now)
        self._lines = min(float(self.limits.burst_lines),
                          self._lines + elapsed * self.limits.lines_per_second)
        self._bytes = min(float(self.limits.burst_bytes),
                          self._bytes + elapsed * self.limits.bytes_per_second)
