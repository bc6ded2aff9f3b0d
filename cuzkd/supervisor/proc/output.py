"""Re-logging a child's output: each line it writes becomes one event in the supervisor's log.

Engines and one-shot commands write to pipes the supervisor reads until EOF. A line is never
held whole beyond :data:`MAX_LINE_BYTES` (a child writing an endless line must not grow the
supervisor without bound), and invalid UTF-8 is replaced, never fatal. Nothing a line holds
ends the reader while the child lives (:func:`relog_line`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import IO, Any

from cuzkd.errortext import error_text
from cuzkd.log.configure import engine_line_fields
from cuzkd.log.ratelimit import LimitedLog

#: Longest engine output line kept whole; longer ones are dropped with a note.
MAX_LINE_BYTES = 1 << 20
#: Longest stderr line kept in the tail (characters; the log has the whole line).
STDERR_TAIL_LINE_CHARS = 500
#: Lines nothing could log: one note per stream per 10 s, for all children.
_UNLOGGABLE = LimitedLog()


async def log_lines(pipe: IO[bytes], logger: Any, stream: str, pid: int, *,
                    tail: deque[str] | None = None) -> None:
    """Log each line a child writes to ``pipe``, until EOF: a JSON object as its own event and
    fields (:func:`~cuzkd.log.configure.engine_line_fields`), any other line as an ``engine_output``
    event with ``line``. ``tail`` (a bounded deque) keeps the last lines, each cut to
    STDERR_TAIL_LINE_CHARS."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe)
    dropping = False  # inside a line longer than the limit: discard up to its newline
    try:
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:  # EOF: the last line has no newline
                line = exc.partial
            except asyncio.LimitOverrunError as exc:
                # Drop what is buffered of it (up to its newline, if that came with it); the
                # rest of the line ends at the next newline and is dropped there.
                await reader.readexactly(exc.consumed)
                if not dropping:
                    logger.warning("engine_output_dropped", stream=stream, pid=pid,
                                   reason=f"line longer than {MAX_LINE_BYTES} bytes")
                dropping = True
                continue
            if not line:
                return
            if dropping:
                dropping = False
                continue
            text = line.decode(errors="replace").rstrip("\n")
            if tail is not None:
                tail.append(text[:STDERR_TAIL_LINE_CHARS])
            relog_line(logger, text, stream, pid)
    finally:
        transport.close()


def relog_line(logger: Any, text: str, stream: str, pid: int) -> None:
    """Log one line of a child's; never raises.

    If this raised, the reader task would end, the pipe close, and the child's next write get
    ``SIGPIPE`` (a 1000-deep JSON line once restarted its engine 9 times in 15 s). A line that
    cannot be logged as its own event (the parser took it but a renderer failed) is logged as
    plain ``engine_output`` with the raw text and ``render_error``; if even that fails (a
    bug), a note rate-limited per stream (``repeated``: how many lines it stands for).
    """
    try:
        parsed = engine_line_fields(text)
        if parsed is None:
            logger.info("engine_output", stream=stream, pid=pid, line=text)
        else:
            level, event, fields = parsed
            getattr(logger, level)(event, stream=stream, pid=pid, **fields)
        return
    except Exception as exc:  # whatever the line did, the reader goes on
        error = type(exc).__name__
    try:
        logger.info("engine_output", stream=stream, pid=pid, line=text, render_error=error)
    except Exception as exc:
        with contextlib.suppress(Exception):  # the log itself is broken: nothing to tell
            _UNLOGGABLE.log(logger, "error", "engine_output_unloggable", key=stream,
                            stream=stream, pid=pid, error=error_text(exc))
