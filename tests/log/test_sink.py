"""The supervisor's log sink on real pipes: a reader that stops reading never stalls the event
loop (lines are dropped, counted, and the gap reported where it is once the reader drains); a
reader that closes the pipe costs lines, never the process; the last lines reach a healthy
reader at exit, and a stalled one does not hold the exit up."""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from support.supervisor_harness import read_until

from cuzkd.log.queue import DropReport
from cuzkd.log.sink import LogSink

PAD = "x" * 100


def _gap(report: DropReport) -> str:
    return f"GAP {report.reason} {report.lines}"


@contextmanager
def _pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    try:
        yield r, w
    finally:
        for fd in (r, w):
            with suppress(OSError):  # closed by the test
                os.close(fd)


def _gaps(lines: list[str]) -> int:
    return sum(int(line.split()[-1]) for line in lines if line.startswith("GAP"))


async def test_a_reader_that_stops_reading_never_stalls_the_loop() -> None:
    with _pipe() as (r, w):
        sink = LogSink(w, _gap, max_bytes=1 << 16)
        slowest = 0.0
        written = 0
        # Nobody reads: the pipe fills (64 KiB), then the queue (64 KiB), then lines drop.
        while sink.dropped()["queue_full"] < 100:
            started = time.monotonic()
            sink.write(f"{written:08d} {PAD}")
            slowest = max(slowest, time.monotonic() - started)
            written += 1
            if written % 100 == 0:
                await asyncio.sleep(0)  # the loop turns between lines, as it does serving
        assert slowest < 0.25, f"a write took {slowest:.3f}s with the reader stalled"
        dropped = sink.dropped()["queue_full"]
        # The reader drains: the kept lines and, where lines are missing, how many.
        data = b""
        while _gaps(data[:data.rfind(b"\n") + 1].decode().splitlines()) < dropped:
            data += await asyncio.to_thread(read_until, r, b"\n")
        sink.write("after")  # the writer has caught up: kept again
        data += await asyncio.to_thread(read_until, r, b"after\n")
        assert sink.close()
    lines = data.decode().splitlines()
    assert lines[-1] == "after" and _gaps(lines) == dropped
    expected = 0  # each kept line is the next one written, or the one after a reported gap
    for line in lines[:-1]:
        if line.startswith("GAP"):
            expected += int(line.split()[-1])
        else:
            assert line == f"{expected:08d} {PAD}"
            expected += 1
    assert expected == written
    assert sink.dropped() == {"queue_full": dropped, "write_error": 0, "upgrade": 0}


def test_a_closed_reader_costs_lines_never_the_process() -> None:
    with _pipe() as (r, w):
        os.close(r)
        sink = LogSink(w, _gap)
        for i in range(3):
            sink.write(f"line {i}")  # EPIPE in the writer: counted, never raised
        assert sink.close()
        assert sink.dropped() == {"queue_full": 0, "write_error": 3, "upgrade": 0}


def test_a_non_blocking_descriptor_waits_rather_than_drops() -> None:
    with _pipe() as (r, w):
        fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
        sink = LogSink(w, _gap)
        lines = [f"{i:08d} {PAD}" for i in range(2000)]  # 3 pipes' worth: EAGAIN, then more
        for line in lines:
            sink.write(line)
        sink.write("end")
        data = read_until(r, b"end\n")
        assert sink.close()
    assert data.decode().splitlines() == [*lines, "end"]
    assert sink.dropped() == {"queue_full": 0, "write_error": 0, "upgrade": 0}


def test_close_writes_the_last_lines_and_does_not_wait_for_a_stalled_reader() -> None:
    with _pipe() as (r, w):
        sink = LogSink(w, _gap)
        for i in range(1000):
            sink.write(f"{i} {PAD}")  # more than the pipe holds: the writer waits on it
        started = time.monotonic()
        assert not sink.close(timeout=0.2)  # the reader does not read: the exit goes on
        assert time.monotonic() - started < 5
        # A reader that reads gets every line queued before close, and the writer ends.
        data = read_until(r, f"999 {PAD}\n".encode())
        assert sink.close(timeout=10)
    assert data.decode().splitlines() == [f"{i} {PAD}" for i in range(1000)]


def test_a_line_that_is_not_valid_text_is_written_escaped() -> None:
    with _pipe() as (r, w):
        sink = LogSink(w, _gap)
        sink.write("lone \ud800 surrogate")  # a console line may carry one from an engine
        assert read_until(r, b"surrogate\n") == b"lone \\ud800 surrogate\n"
        assert sink.close()


def test_a_flush_waits_for_the_writer_and_says_what_is_still_queued() -> None:
    """``cuzkd upgrade`` flushes before its exec: what the reader took is written; what a
    stalled reader left queued when the bound ran out is counted, and still written later."""
    read_end, write_end = os.pipe()
    sink = LogSink(write_end, lambda report: None)
    try:
        sink.write("one")
        assert sink.flush(5.0) == 0
        assert os.read(read_end, 100) == b"one\n"
        os.set_blocking(write_end, False)
        filler = b"x" * 65536
        with suppress(BlockingIOError):
            while True:
                os.write(write_end, filler)  # the pipe is full: the writer blocks
        sink.write("stuck")
        sink.write("two")
        assert sink.flush(0.2) >= 1
        os.set_blocking(read_end, False)
        read = b""
        deadline = time.monotonic() + 10
        while not read.endswith(b"two\n") and time.monotonic() < deadline:
            with suppress(BlockingIOError):
                read += os.read(read_end, 1 << 20)
            sink.flush(0.05)  # the reader drains: the writer goes on
        assert read.endswith(b"stuck\ntwo\n")
        assert sink.flush(5.0) == 0
    finally:
        sink.close(1.0)
        os.close(read_end)
        os.close(write_end)
