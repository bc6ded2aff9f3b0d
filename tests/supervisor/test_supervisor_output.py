"""Re-logging a child's output through a real pipe: lines longer than MAX_LINE_BYTES are
dropped whole (one note each), never logged in pieces nor kept in the stderr tail."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import deque
from typing import Any

from cuzkd.supervisor.output import MAX_LINE_BYTES, log_lines


class RecordingLogger:
    """The logger seam: (level, event, fields) of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.calls.append((level, event, fields))


def test_over_long_lines_are_dropped_whole_and_the_rest_logged() -> None:
    long_line = b"x" * (3 * MAX_LINE_BYTES + 5)  # several reads past the limit, no newline
    just_over = b"z" * (MAX_LINE_BYTES + 10)  # its newline arrives with it
    payload = b"first\n" + long_line + b"\nafter\n" + just_over + b"\nlast, no newline"
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    logger = RecordingLogger()
    tail: deque[str] = deque(maxlen=10)

    async def main() -> None:
        assert child.stdin is not None and child.stdout is not None
        stdin = child.stdin
        reading = asyncio.ensure_future(
            log_lines(child.stdout, logger, "stdout", child.pid, tail=tail))
        await asyncio.to_thread(lambda: (stdin.write(payload), stdin.close()))
        await asyncio.wait_for(reading, 30)

    try:
        asyncio.run(main())
    finally:
        child.wait(10)
    lines = [f["line"] for _, event, f in logger.calls if event == "engine_output"]
    assert lines == ["first", "after", "last, no newline"]
    assert [event for _, event, _ in logger.calls].count("engine_output_dropped") == 2
    assert list(tail) == lines
