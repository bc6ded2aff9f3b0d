"""An engine's stderr tail: what the exit log and ``cuzkd status NAME`` show of a dead process."""

from __future__ import annotations

import asyncio

from cuzkd.supervisor.engines.stderrtail import STDERR_TAIL_LINES, StderrTail


def test_an_exit_keeps_the_lines_read_after_it_unless_the_engine_exited_again() -> None:
    async def main() -> None:
        tail = StderrTail()
        lines = tail.spawned()
        reader_done = asyncio.Event()

        async def reader() -> None:  # the rest of the pipe, read after the exit was reaped
            await reader_done.wait()
            lines.append("Killed")

        tail.read_by(asyncio.ensure_future(reader()))
        for i in range(STDERR_TAIL_LINES + 5):
            lines.append(f"line {i}")
        first = tail.exited()
        assert tail.last_exit == [f"line {i}" for i in range(5, STDERR_TAIL_LINES + 5)]
        reader_done.set()
        settled = await tail.settle(first)
        assert settled[-1] == "Killed" and tail.last_exit == settled

        again = tail.spawned()  # a restart, which dies too before the first report settles
        again.append("second")
        second = tail.exited()
        assert await tail.settle(first) == settled
        assert tail.last_exit == ["second"]  # the later exit's lines stay the last
        assert await tail.settle(second) == ["second"]

    asyncio.run(main())
