"""The supervisor's log output: lines are queued by whoever logs and written by one thread.

``cuzkd run`` serves ``/metrics``, the control socket and the sd_notify watchdog from one event
loop. A log line written there with a blocking ``write(2)`` stops all of it for as long as the
reader of stderr (journald, a Docker log driver, a ``| less`` left open) does not read: with a
chatty engine and a reader stalled for 20 s, ``/metrics`` and ``cuzkd status`` did not answer
once in those 20 s, and a stall longer than ``WatchdogSec`` would have got the supervisor and
its engines killed. Here :meth:`LogSink.write` only encodes the rendered line and queues it (a
lock held for a few list operations, never across I/O); the writer thread does the blocking
writes. What is kept, dropped and reported is :class:`~cuzkd.log.queue.LineQueue`'s decision.

A write that fails -- ``EPIPE`` when the reader closed the pipe, ``EIO``, ``ENOSPC`` -- drops
the lines it carried (counted, ``write_error``) and the writer goes on; ``EAGAIN`` on a
non-blocking descriptor waits until it is writable. (Raised in the code that logged, the
``BrokenPipeError`` of ``cuzkd run | head -3`` once ended the supervisor, and its engines.)

Only the supervisor uses it; the CLI commands and ``cuzkd engine`` write their log lines
synchronously (nothing of theirs suffers from waiting on stderr).
"""

from __future__ import annotations

import os
import select
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate

from cuzkd.log.queue import MAX_QUEUED_BYTES, DropReport, LineQueue

#: Seconds :meth:`LogSink.close` waits for the writer to write what is queued (at exit: the
#: supervisor's last lines); a reader stalled longer loses them rather than the exit hanging.
FLUSH_TIMEOUT = 2.0


class LogSink:
    """Writes lines to ``fd`` from a thread of its own; ``render_report`` turns a
    :class:`DropReport` into the line that tells of a gap (None: not logged at this level)."""

    def __init__(self, fd: int, render_report: Callable[[DropReport], str | None], *,
                 max_bytes: int = MAX_QUEUED_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fd = fd
        self._render_report = render_report
        self._clock = clock
        self._queue = LineQueue(max_bytes)
        lock = threading.Lock()
        #: the writer waits on it for lines; a flush waits on ``_idle`` for the writer
        self._wakeup = threading.Condition(lock)
        self._idle = threading.Condition(lock)
        self._closing = False
        #: lines of the batch the writer has taken and not yet written
        self._writing = 0
        self._thread = threading.Thread(target=self._run, name="cuzkd-log-writer", daemon=True)
        self._thread.start()

    def write(self, line: str) -> None:
        """Queue one line (without its newline), or drop it when the queue is full. Never
        blocks on I/O, never raises for a line."""
        data = _encoded(line)
        with self._wakeup:
            if self._queue.offer(data, self._clock()):
                self._wakeup.notify()

    def dropped(self) -> dict[str, int]:
        """Lines dropped since the start, by reason (``cuzkd_log_lines_dropped_total``)."""
        with self._wakeup:
            return dict(self._queue.dropped_total)

    def close(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Let the writer write what is queued and end, waiting ``timeout`` seconds at most;
        True when it did. Lines written after this are not written."""
        with self._wakeup:
            self._closing = True
            self._wakeup.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for what is queued to be written (``cuzkd upgrade``
        execs next, and an exec drops what this process holds); the lines not written then.
        The writer goes on: if the exec does not happen, they are written after all."""
        deadline = self._clock() + timeout
        with self._wakeup:
            while self._queue.has_lines or self._writing:
                left = deadline - self._clock()
                if left <= 0:
                    return self._queue.queued_lines + self._writing
                self._idle.wait(left)
        return 0

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue.has_lines and not self._closing:
                    self._wakeup.wait()
                batch = self._queue.take()
                self._writing = len(batch)
            if not batch:  # closing, and everything written
                return
            failed = self._write_all(batch)
            with self._wakeup:
                reports = self._queue.written(batch, failed, self._clock())
                self._writing = 0
                self._idle.notify_all()
            if reports:
                self._report(reports)

    def _report(self, reports: Sequence[DropReport]) -> None:
        rendered = [self._render_report(report) for report in reports]
        lines = [_encoded(text) for text in rendered if text is not None]
        if lines and self._write_all(lines):
            with self._wakeup:
                self._queue.unreported(reports)

    def _write_all(self, lines: Sequence[bytes]) -> int:
        """Write ``lines`` in as few ``write(2)`` calls as the descriptor takes; how many of
        them (the last ones) were not written whole because a write failed."""
        data = memoryview(b"".join(lines))
        done = 0
        try:
            while done < len(data):
                try:
                    done += os.write(self._fd, data[done:])
                except BlockingIOError:  # a non-blocking descriptor: wait until it drains
                    poller = select.poll()
                    poller.register(self._fd, select.POLLOUT)
                    poller.poll()
        except OSError:
            return len(lines) - bisect_right(list(accumulate(map(len, lines))), done)
        return 0


def _encoded(line: str) -> bytes:
    """``line`` and its newline as UTF-8; a lone surrogate (an engine's ``"\\ud800"`` in a
    console line) is written backslash-escaped rather than failing the write."""
    return (line + "\n").encode("utf-8", "backslashreplace")
