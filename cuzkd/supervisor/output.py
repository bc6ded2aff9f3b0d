"""Re-logging a child's output: each line it writes becomes one event in the supervisor's log.

Engines and one-shot commands write to pipes the supervisor reads until EOF. A line is never
held whole beyond :data:`MAX_LINE_BYTES` (a child writing an endless line must not grow the
supervisor without bound), and invalid UTF-8 is replaced, never fatal.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import IO, Any

from cuzkd.logs import engine_line_fields

#: Longest engine output line kept whole; longer ones are dropped with a note.
MAX_LINE_BYTES = 1 << 20
#: Longest stderr line kept in the tail (characters; the log has the whole line).
STDERR_TAIL_LINE_CHARS = 500


async def log_lines(pipe: IO[bytes], logger: Any, stream: str, pid: int, *,
                    tail: deque[str] | None = None) -> None:
    """Log each line a child writes to ``pipe``, until EOF: a JSON object as its own event and
    fields (:func:`~cuzkd.logs.engine_line_fields`), any other line as an ``engine_output``
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
            parsed = engine_line_fields(text)
            if parsed is None:
                logger.info("engine_output", stream=stream, pid=pid, line=text)
            else:
                level, event, fields = parsed
                getattr(logger, level)(event, stream=stream, pid=pid, **fields)
            if tail is not None:
                tail.append(text[:STDERR_TAIL_LINE_CHARS])
    finally:
        transport.close()
