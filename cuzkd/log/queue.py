"""Which log lines are kept, in order, while a slow reader holds the writer up: the pure core
of :class:`~cuzkd.log.sink.LogSink`.

The supervisor's log reader (journald, a Docker log driver, a terminal) can stall. Lines wait
in a queue bounded by bytes; when the next line does not fit, it and every later one are
dropped until the writer has caught up -- written everything queued -- so the log has one gap
rather than a line here and there, and the gap is reported once, right where it is
(:class:`DropReport`: how many lines, over how long). Lines the writer could not write (the
reader closed the pipe, the disk is full) are counted as dropped too and reported the same
way once a write succeeds again.

No threads and no clock here: the caller holds the lock and passes ``now``.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

#: Bytes of rendered lines queued (or being written) at most: 4 MiB, over a second of an
#: engine logging as fast as it can (~8,000 lines/s), and more than a long line (engine lines
#: are cut at 64 KiB; escaped in JSON, one grows a few times, see :meth:`offer`).
MAX_QUEUED_BYTES = 4 << 20


class DropReason(enum.StrEnum):
    """Why a line never reached the log: the ``reason`` label of
    ``cuzkd_log_lines_dropped_total``."""

    #: its reader did not keep up
    QUEUE_FULL = "queue_full"
    #: writing it failed
    WRITE_ERROR = "write_error"
    #: still queued when ``cuzkd upgrade`` re-executed the supervisor (its flush's bound over;
    #: counted by the new code, from the hand-over)
    UPGRADE = "upgrade"


@dataclass(frozen=True)
class DropReport:
    """Lines dropped for one reason since ``since`` (the first of them), reported ``seconds``
    later."""

    reason: DropReason
    lines: int
    since: float
    seconds: float


class LineQueue:
    """Lines waiting for the writer; bounded by bytes, dropping whole lines when full."""

    def __init__(self, max_bytes: int = MAX_QUEUED_BYTES) -> None:
        self._max_bytes = max_bytes
        self._lines: deque[bytes] = deque()
        #: bytes of the queued lines plus those of the batch being written
        self._bytes = 0
        #: dropping every line until the writer has caught up
        self._dropping = False
        #: reason -> (lines dropped, time of the first) not reported yet
        self._unreported: dict[DropReason, tuple[int, float]] = {}
        #: reason -> lines dropped since the start (``cuzkd_log_lines_dropped_total``)
        self.dropped_total = {reason.value: 0 for reason in DropReason}

    @property
    def has_lines(self) -> bool:
        """Whether there is a batch for the writer."""
        return bool(self._lines)

    def offer(self, line: bytes, now: float) -> bool:
        """Queue ``line`` (True) or drop it (False). A line larger than the whole bound is
        taken only by an idle writer, so one long line is never lost to the bound alone."""
        if self._dropping or (self._bytes and self._bytes + len(line) > self._max_bytes):
            self._dropping = True
            self._drop(DropReason.QUEUE_FULL, 1, now)
            return False
        self._lines.append(line)
        self._bytes += len(line)
        return True

    @property
    def queued_lines(self) -> int:
        return len(self._lines)

    def take(self) -> list[bytes]:
        """Every queued line, in order: the writer's next batch (its bytes count until
        :meth:`written`)."""
        batch = list(self._lines)
        self._lines.clear()
        return batch

    def written(self, batch: Sequence[bytes], failed: int, now: float) -> list[DropReport]:
        """The writer is done with ``batch``: all of it written but its last ``failed`` lines.

        Returns the drops to report now: those not yet reported, once the writer has caught
        up (nothing queued). They leave this queue; :meth:`unreported` takes back any whose
        report could not be written.
        """
        self._bytes -= sum(len(line) for line in batch)
        if failed:
            self._drop(DropReason.WRITE_ERROR, failed, now)
        if self._lines:
            return []
        self._dropping = False
        reports = [DropReport(reason, lines, since, now - since)
                   for reason, (lines, since) in self._unreported.items()]
        self._unreported.clear()
        return reports

    def unreported(self, reports: Sequence[DropReport]) -> None:
        """The lines ``reports`` speak of are to be reported again (their report was not
        written), together with any dropped since."""
        for report in reports:
            lines, since = self._unreported.get(report.reason, (0, report.since))
            self._unreported[report.reason] = (lines + report.lines, min(since, report.since))

    def _drop(self, reason: DropReason, lines: int, now: float) -> None:
        self.dropped_total[reason] += lines
        count, since = self._unreported.get(reason, (0, now))
        self._unreported[reason] = (count + lines, since)
