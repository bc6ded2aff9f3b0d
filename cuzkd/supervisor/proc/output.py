"""Re-logging a child's output: each line it writes becomes one event in the supervisor's log.

Engines and one-shot commands write to pipes the supervisor reads until EOF. Turning a line into
an event is what costs, so only the lines an engine's
:class:`~cuzkd.supervisor.core.outputbudget.OutputBudget` admits get that far and the rest of a
refused read is counted in bulk; a flood is paced by its own pipe
(:class:`~cuzkd.supervisor.core.outputpacing.OutputPacer`), and a line is cut at
:data:`MAX_LINE_BYTES`. :func:`relog_line` logs one line and never raises, and a stderr ``tail``
gets every line, logged or suppressed, so a dying engine's multi-line panic is all there. The
rules and figures are docs/supervisor.md, *Engine output limits* and *Engine lines as events*.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, cast

from cuzkd.errortext import error_text
from cuzkd.log.controls import strip_controls
from cuzkd.log.engineline import EngineRecord, engine_line
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.supervisor.core.outputbudget import OutputBudget
from cuzkd.supervisor.core.outputpacing import OutputPacer, PacingTotals
from cuzkd.supervisor.core.stderrlines import PANIC_MARK, StderrLines

#: Longest engine output line logged whole; a longer one is cut here (its head logged).
MAX_LINE_BYTES = 64 << 10
#: The pipe's buffer (Linux's default limit for an unprivileged process; the default is 64
#: KiB): the engine writes on while the supervisor is busy for a moment (a scrape, a GC pass),
#: a flood is read in fewer, larger reads, and a paced one gets a pipe's worth each pause.
PIPE_BYTES = 1 << 20
#: A pipe's size where it cannot be read (not a pipe): Linux's default.
DEFAULT_PIPE_BYTES = 64 << 10
#: Longest stderr line kept in the tail (characters; the log has the whole line).
STDERR_TAIL_LINE_CHARS = 500
#: Lines nothing could log: one note per stream per 10 s, for all children.
_UNLOGGABLE = LimitedLog()


@dataclass(frozen=True)
class OutputLog:
    """Where a child's output goes: ``lines`` logs the child's own lines (the ``cuzkd.engine``
    logger, bound to the engine or one-shot), ``notes`` the supervisor's notes about them;
    ``budget`` (None: no limit) decides which lines are logged, read with ``clock``; a flood
    is paced by the reading thread's CPU time, ``cpu_clock``, and its pauses added up in
    ``pacing``."""

    lines: Any
    notes: Any
    budget: OutputBudget | None = None
    clock: Callable[[], float] = time.monotonic
    cpu_clock: Callable[[], float] = time.thread_time
    pacing: PacingTotals = field(default_factory=PacingTotals)
    #: what a line is: an engine's (:func:`~cuzkd.log.engineline.engine_line`) or, for the
    #: door process, cuzkd's own (:func:`~cuzkd.log.engineline.own_line`)
    record: Callable[[str], EngineRecord | str] = engine_line


async def log_lines(pipe: IO[bytes], out: OutputLog, stream: str, pid: int, *,
                    tail: StderrLines | None = None) -> None:
    """Log each line a child writes to ``pipe``, until EOF (:func:`relog_line`). ``tail``
    keeps the last lines, each cut to STDERR_TAIL_LINE_CHARS. A flood is paced (the module's
    docstring)."""
    reader = _LineReader(out, stream, pid, tail, _pipe_size(pipe))
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(lambda: reader, pipe)
    try:
        await reader.done
    finally:
        transport.close()


def _pipe_size(pipe: IO[bytes]) -> int:
    """Make ``pipe`` hold PIPE_BYTES if the user's pipe quota allows (else it keeps the 64 KiB
    default); what it holds now."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    try:
        return fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ)
    except OSError:
        return DEFAULT_PIPE_BYTES


class _LineReader(asyncio.Protocol):
    """Splits what the pipe delivers into lines and logs them, pacing a flood; see the
    module's docstring."""

    def __init__(self, out: OutputLog, stream: str, pid: int, tail: StderrLines | None,
                 pipe_bytes: int) -> None:
        self._out = out
        self._stream = stream
        self._pid = pid
        self._tail = tail
        #: the start of the current line (at most MAX_LINE_BYTES)
        self._head = bytearray()
        #: inside a line that was cut: discard up to its newline
        self._cutting = False
        #: the current read discarded something (a refused line, a cut line's rest)
        self._discarding = False
        self._pacer = OutputPacer(pipe_bytes, out.cpu_clock(), out.pacing)
        self._transport: asyncio.ReadTransport | None = None
        #: the end of the current pause, while reading is paused
        self._resuming: asyncio.TimerHandle | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            try:
                self._read(data, self._out.clock())
            finally:
                self._pace(len(data))  # a read a bug cut short is paced all the same
        except Exception as exc:  # a bug here must not close the pipe (the child's SIGPIPE)
            with contextlib.suppress(Exception):
                _UNLOGGABLE.log(self._out.notes, "error", "engine_output_unloggable",
                                key=self._stream, stream=self._stream, pid=self._pid,
                                error=error_text(exc))

    def _pace(self, size: int) -> None:
        """After a read: stop reading for the pause the pacer asks for, if any."""
        pause = self._pacer.read(size, discarded=self._discarding, cpu=self._out.cpu_clock())
        self._discarding = False
        if pause is None or self._transport is None or self._transport.is_closing():
            return
        self._transport.pause_reading()
        self._resuming = asyncio.get_running_loop().call_later(pause, self._resume)

    def _resume(self) -> None:
        self._resuming = None
        if self._transport is None or self._transport.is_closing():
            return
        self._pacer.resumed(self._out.cpu_clock())
        self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        del exc
        if self._resuming is not None:
            self._resuming.cancel()
            self._resuming = None
        now = self._out.clock()
        if self._head:  # EOF: the last line has no newline
            self._line(bytes(self._head), now)
            self._head.clear()
        self._report(now, final=True)
        if not self.done.done():
            self.done.set_result(None)

    def _read(self, data: bytes, now: float) -> None:
        start = 0
        if self._cutting:
            start = data.find(b"\n") + 1
            self._dropped_bytes(start - 1 if start else len(data))
            if not start:
                return
            self._cutting = False
        while (end := data.find(b"\n", start)) >= 0:
            if self._head:
                line = bytes(self._head + data[start:end])
                self._head.clear()
            else:
                line = data[start:end]
            start = end + 1
            if not self._line(line, now):
                start = self._refuse_rest(data, start, now)
                break
        self._hold(data, start, now)
        self._report(now)

    def _line(self, line: bytes, now: float, *, truncated: bool = False) -> bool:
        """One line (cut to MAX_LINE_BYTES): into the tail, and logged if the budget admits
        it; False when it refused it."""
        if len(line) > MAX_LINE_BYTES:
            self._dropped_bytes(len(line) - MAX_LINE_BYTES)
            line, truncated = line[:MAX_LINE_BYTES], True
        text = line.decode(errors="replace")
        self._to_tail(text)
        budget = self._out.budget
        if budget is not None and not budget.admit(len(line), now):
            self._discarding = True
            return False
        relog_line(self._out, text, self._stream, self._pid, truncated=truncated)
        return True

    def _refuse_rest(self, data: bytes, start: int, now: float) -> int:
        """Count the complete lines of ``data`` from ``start`` as suppressed (the budget
        refused one of this read); where the unfinished line after them starts."""
        last = data.rfind(b"\n", start)
        if last < start:
            return start
        lines = data.count(b"\n", start, last + 1)
        if self._out.budget is not None:
            self._out.budget.refuse(lines, last + 1 - start - lines, now)
        if self._tail is not None:
            self._tail_refused(self._tail, data[start:last], lines)
        return last + 1

    def _tail_refused(self, tail: StderrLines, refused: bytes, lines: int) -> None:
        """Refused lines (``lines`` of them, without the last newline) into the tail: the
        last that fit -- or all from a panic's first line on, if it is among them and the tail
        has none yet (once per process; found with a ``bytes.find``)."""
        panic = -1 if tail.has_panic else refused.find(PANIC_MARK)
        if panic >= 0:
            pieces = refused[refused.rfind(b"\n", 0, panic) + 1:].split(b"\n")
        else:
            keep = min(lines, tail.maxlen)
            pieces = refused.rsplit(b"\n", keep)[-keep:]
        for piece in pieces:
            self._to_tail(piece[:MAX_LINE_BYTES].decode(errors="replace"))

    def _hold(self, data: bytes, start: int, now: float) -> None:
        """Keep the unfinished line at the end of ``data``; cut it once it is too long."""
        room = MAX_LINE_BYTES - len(self._head)
        piece = data[start:start + room]
        self._head += piece
        if len(data) - start > room:
            self._cutting = True
            self._dropped_bytes(len(data) - start - len(piece))
            self._line(bytes(self._head), now, truncated=True)
            self._head.clear()

    def _dropped_bytes(self, size: int) -> None:
        if size:
            self._discarding = True
        if self._out.budget is not None:
            self._out.budget.cut(size)

    def _to_tail(self, text: str) -> None:
        if self._tail is not None:
            self._tail.append(strip_controls(text)[:STDERR_TAIL_LINE_CHARS])

    def _report(self, now: float, *, final: bool = False) -> None:
        budget = self._out.budget
        if budget is None or (suppressed := budget.report(now, final=final)) is None:
            return
        self._out.notes.warning("engine_output_suppressed", pid=self._pid,
                                lines=suppressed.lines, bytes=suppressed.bytes,
                                seconds=round(suppressed.seconds, 3))


def relog_line(out: OutputLog, text: str, stream: str, pid: int, *,
               truncated: bool = False) -> None:
    """Log one line of a child's on ``out.lines``; never raises. A record
    (``out.record``) as its own event, level and fields; any other
    line as ``engine_output`` with ``line``; ``truncated``: the head of a line that was cut.

    If this raised, the reader would end, the pipe close, and the child's next write get
    ``SIGPIPE`` (a 1000-deep JSON line once restarted its engine 9 times in 15 s). A line that
    cannot be logged as its own event (the parser took it but a renderer failed) is logged as
    plain ``engine_output`` with the raw text and ``render_error``; if even that fails (a
    bug), a note on ``out.notes`` rate-limited per stream (``repeated``: how many lines it
    stands for).
    """
    logger = out.lines
    cut = {"truncated": True} if truncated else {}
    text = strip_controls(text)
    try:
        parsed = out.record(text)
        if isinstance(parsed, EngineRecord):
            getattr(logger, parsed.level)(parsed.event, stream=stream, pid=pid, **cut,
                                          **parsed.fields)
        else:
            logger.info("engine_output", stream=stream, pid=pid, line=text, **cut)
        return
    except Exception as exc:  # whatever the line did, the reader goes on
        error = type(exc).__name__
    try:
        logger.info("engine_output", stream=stream, pid=pid, line=text, render_error=error,
                    **cut)
    except Exception as exc:
        with contextlib.suppress(Exception):  # the log itself is broken: nothing to tell
            _UNLOGGABLE.log(out.notes, "error", "engine_output_unloggable", key=stream,
                            stream=stream, pid=pid, error=error_text(exc))
