"""Re-logging a child's output through a real pipe: lines over MAX_LINE_BYTES cut (their head
logged, the rest discarded at bounded cost), an output budget that logs a burst and counts the
rest, a flat-out writer paced by its pipe, a stderr tail that keeps every line, and hostile
lines that never end the reader."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import time
from typing import Any

import pytest
import structlog
from support.waiting import until

from cuzkd.log.configure import configure_logging
from cuzkd.log.controls import strip_controls
from cuzkd.supervisor.core.outputbudget import OutputBudget, OutputLimits
from cuzkd.supervisor.core.outputpacing import MAX_PAUSE
from cuzkd.supervisor.core.stderrlines import StderrLines
from cuzkd.supervisor.proc.output import MAX_LINE_BYTES, OutputLog, log_lines

#: A child that writes what it reads on stdin to the pipe named by argv[1] (1: stdout).
ECHO = "import os, sys; os.write(int(sys.argv[1]), sys.stdin.buffer.read())"


class RecordingLogger:
    """The logger seam: (level, event, fields) of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.calls.append((level, event, fields))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [fields for _, event, fields in self.calls if event == name]


def _relog(payload: bytes, out: OutputLog, tail: StderrLines | None = None) -> None:
    """Write ``payload`` through a real pipe from a child and log it all, to EOF."""
    child = subprocess.Popen([sys.executable, "-c", ECHO, "1"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)

    async def main() -> None:
        assert child.stdin is not None and child.stdout is not None
        stdin = child.stdin
        reading = asyncio.ensure_future(log_lines(child.stdout, out, "stdout", child.pid,
                                                  tail=tail))
        await asyncio.to_thread(lambda: (stdin.write(payload), stdin.close()))
        await asyncio.wait_for(reading, 30)

    try:
        asyncio.run(main())
    finally:
        child.wait(10)


def test_an_endless_line_is_cut_its_head_logged_and_the_rest_discarded() -> None:
    endless = b"x" * (16 << 20)  # 16 MiB, read in many pieces, no newline in any
    just_over = b"z" * (MAX_LINE_BYTES + 10)  # its newline arrives with it
    payload = b"first\n" + endless + b"\nafter\n" + just_over + b"\nlast, no newline"
    logger = RecordingLogger()
    budget = OutputBudget(OutputLimits(1e6, 1e9, 10**6, 1 << 30), 0.0)
    tail = StderrLines(10)
    out = OutputLog(logger, logger, budget)
    _relog(payload, out, tail)
    logged = logger.events("engine_output")
    assert [f["line"] for f in logged] == [
        "first", "x" * MAX_LINE_BYTES, "after", "z" * MAX_LINE_BYTES, "last, no newline"]
    assert [bool(f.get("truncated")) for f in logged] == [False, True, False, True, False]
    assert budget.dropped_bytes_total == len(endless) + len(just_over) - 2 * MAX_LINE_BYTES
    assert budget.dropped_lines_total == 0
    assert out.pacing.pauses >= 1  # an endless line is a flood too: the reader paused
    assert [line[:5] for line in tail] == ["first", "xxxxx", "after", "zzzzz", "last,"]


def test_a_flood_logs_the_burst_and_counts_the_rest_in_order() -> None:
    """20,000 lines written flat out against a burst of 100 (and next to no refill): the first
    100 are logged, in order, and every other one is counted and reported, none lost."""
    lines = [f"line {i}".encode() for i in range(20_000)]
    logger, notes = RecordingLogger(), RecordingLogger()
    budget = OutputBudget(OutputLimits(1e-6, 1e-6, 100, 1 << 20), 0.0)
    _relog(b"\n".join(lines) + b"\n", OutputLog(logger, notes, budget))
    assert [f["line"] for f in logger.events("engine_output")] == [
        f"line {i}" for i in range(100)]
    refused = lines[100:]
    assert budget.dropped_lines_total == len(refused)
    assert budget.dropped_bytes_total == sum(map(len, refused))
    reports = notes.events("engine_output_suppressed")
    assert 1 <= len(reports) <= 3  # at once, at the end, and one per 10 s between at most
    assert sum(r["lines"] for r in reports) == len(refused)
    assert sum(r["bytes"] for r in reports) == sum(map(len, refused))


#: What a Rust panic writes to stderr with ``RUST_BACKTRACE=1``, exit 101.
PANIC = [b"thread 'main' panicked at src/main.rs:12:5:",
         b"called `Result::unwrap()` on an `Err` value: Os { code: 2 }",
         b"stack backtrace:", *(b"  %d: cuzk_core::frame" % i for i in range(40))]


def test_the_stderr_tail_keeps_every_line_even_those_the_budget_kept_from_the_log() -> None:
    """A flood then a panic with its backtrace, all refused by the budget in bulk: the tail
    has the panic's head and the backtrace's end, escape codes removed."""
    flood = [b"\x1b[31mnoise\x1b[0m %d" % i for i in range(5_000)]
    logger = RecordingLogger()
    budget = OutputBudget(OutputLimits(1e-6, 1e-6, 10, 1 << 20), 0.0)
    tail = StderrLines(20)
    _relog(b"\n".join([*flood, *PANIC]) + b"\n", OutputLog(logger, logger, budget), tail)
    assert len(logger.events("engine_output")) == 10  # the panic itself was suppressed
    assert list(tail) == [line.decode() for line in [*PANIC[:2], *PANIC[-18:]]]
    quiet = StderrLines(20)  # and without a panic: the last lines
    _relog(b"\n".join(flood) + b"\n", OutputLog(logger, logger, budget), quiet)
    assert list(quiet) == [f"noise {i}" for i in range(4_980, 5_000)]


#: Writes argv[1] blocks of 39-byte lines to stderr flat out, each in one os.write, then the
#: lines hex-encoded in argv[2] (a panic); then prints its longest write and its seconds.
FLAT_OUT = """\
import json, os, sys, time
block = b"flood line of thirty-nine bytes, x1234\\n" * 1680
longest, start = 0.0, time.monotonic()
for _ in range(int(sys.argv[1])):
    before = time.monotonic()
    view = memoryview(block)
    while view:
        view = view[os.write(2, view):]
    longest = max(longest, time.monotonic() - before)
seconds = time.monotonic() - start
os.write(2, bytes.fromhex(sys.argv[2]))
print(json.dumps({"longest": longest, "seconds": seconds}))
"""
#: FLAT_OUT's lines: 1680 a block of 65,520 bytes.
BLOCK_LINES, BLOCK_BYTES = 1680, 1680 * 39


def test_a_flat_out_writer_is_paced_by_its_pipe_its_lines_counted_its_panic_kept() -> None:
    """32 MiB of lines flat out on stderr, then a panic, against an engine's default budget:
    the reader pauses (each pause at most MAX_PAUSE), every line is logged or counted, the
    panic is whole in the tail, and the writer was held neither long nor below 1 MiB/s."""
    blocks = 512
    child = subprocess.Popen([sys.executable, "-c", FLAT_OUT, str(blocks),
                              (b"\n".join(PANIC) + b"\n").hex()],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    logger = RecordingLogger()
    budget = OutputBudget(OutputLimits(200, 256 << 10, 2000, 1 << 20), time.monotonic())
    out, tail = OutputLog(logger, logger, budget), StderrLines(20)
    try:
        assert child.stderr is not None and child.stdout is not None
        asyncio.run(asyncio.wait_for(log_lines(child.stderr, out, "stderr", child.pid,
                                               tail=tail), 120))
        written = json.loads(child.stdout.read())
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(10)
    assert out.pacing.pauses >= 1 and out.pacing.longest_pause <= MAX_PAUSE
    logged = [f["line"].encode() for f in logger.events("engine_output")]
    lines = blocks * BLOCK_LINES + len(PANIC)
    assert len(logged) + budget.dropped_lines_total == lines
    assert sum(map(len, logged)) + budget.dropped_bytes_total == (  # without the newlines
        blocks * (BLOCK_BYTES - BLOCK_LINES) + sum(map(len, PANIC)))
    reports = logger.events("engine_output_suppressed")
    assert sum(r["lines"] for r in reports) == budget.dropped_lines_total
    assert list(tail) == [line.decode() for line in [*PANIC[:2], *PANIC[-18:]]]
    # Pauses of at most 100 ms, and a pipe's worth (1 MiB) read after each: the writer's
    # longest write is a pause and a loaded machine's scheduling, and it got at least 1 MiB/s
    # (docs/benchmarks.md: on stderr 11-16 MB/s, its longest write 100-140 ms).
    assert written["longest"] < MAX_PAUSE + 0.4
    assert blocks * BLOCK_BYTES / written["seconds"] >= 1 << 20


def test_a_paced_reader_cancelled_mid_flood_ends_at_once() -> None:
    """A child flooding for good: its reader, paused more often than not, still ends as soon
    as it is cancelled (an engine's close), and nothing is left to fire."""
    child = subprocess.Popen([sys.executable, "-c",
                              "import os\nwhile True: os.write(1, b'x\\n' * 32768)"],
                             stdout=subprocess.PIPE)
    logger = RecordingLogger()
    out = OutputLog(logger, logger, OutputBudget(OutputLimits(1e-6, 1e-6, 10, 1 << 20), 0.0))
    errors: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(
            context))
        assert child.stdout is not None
        reading = asyncio.ensure_future(log_lines(child.stdout, out, "stdout", child.pid))
        await until(lambda: out.pacing.pauses >= 3, "the reader paused three times")
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(reading, 5)

    try:
        asyncio.run(main())
    finally:
        child.kill()
        child.wait(10)
    assert not errors
    assert out.budget is not None and out.budget.dropped_lines_total > 3 * 32768


#: Lines an engine might print: nested past every recursion limit, numbers no JSON log can
#: carry, a lone surrogate, invalid UTF-8, NUL bytes, ANSI escapes, a 50,000-character key,
#: an ``exception`` the console renderer cannot print (it concatenates it as text).
HOSTILE: list[bytes] = [
    b'{"a": ' + b"[" * 999 + b"]" * 999 + b"}",
    b'{"a": ' + b"[" * 989 + b"]" * 989 + b"}",
    b'{"a": ' + b"[" * 99_999 + b"]" * 99_999 + b"}",
    b'{"level": ' + b"[" * 40 + b"]" * 40 + b', "event": "deep_level"}',
    b'{"x": 1e400}', b'{"x": NaN}', b'{"x": ' + b"9" * 5000 + b"}",
    b'{"event": "lone", "x": "\\ud800"}', b"\xff\xfe not utf-8 \xc3",
    b"nul \x00 byte", b'{"event": "nul", "k\\u0000": "v\\u0000"}',
    b"\x1b[31mred\x1b[0m", b'{"' + b"k" * 50_000 + b'": 1}',
    b'{"event": "odd_exception", "exception": [1, 2]}',
]
#: Prints HOSTILE (from stdin's first line, hex), "ready", then once stdin closes "last": a
#: reader that died on one of them closed the pipe, and that write kills it with SIGPIPE.
HOSTILE_ENGINE = """\
import signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
for line in sys.stdin.readline().split():
    sys.stdout.buffer.write(bytes.fromhex(line) + b"\\n")
sys.stdout.buffer.write(b"ready\\n")
sys.stdout.flush()
sys.stdin.read()
print("last", flush=True)
"""


class MarkedOutput(io.StringIO):
    """The log's stream; ``seen`` is set once a line with ``marker`` was written."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker
        self.seen = asyncio.Event()

    def write(self, text: str) -> int:
        if self.marker in text:
            self.seen.set()
        return super().write(text)


def _relog_hostile(logger: Any, ready: asyncio.Event) -> int:
    """Run the hostile engine under the output reader; its exit status. ``ready`` is set
    once its "ready" line went through the logger."""
    child = subprocess.Popen([sys.executable, "-c", HOSTILE_ENGINE], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)

    async def main() -> None:
        assert child.stdin is not None and child.stdout is not None
        stdin = child.stdin
        reading = asyncio.ensure_future(log_lines(child.stdout, OutputLog(logger, logger),
                                                  "stdout", child.pid))
        printed = asyncio.ensure_future(ready.wait())
        await asyncio.to_thread(lambda: (stdin.write(b" ".join(h.hex().encode()
                                                              for h in HOSTILE) + b"\n"),
                                         stdin.flush()))
        # Once it printed everything (or the reader ended), it writes once more.
        await asyncio.wait({reading, printed}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        printed.cancel()
        await asyncio.to_thread(stdin.close)
        await asyncio.wait_for(reading, 30)

    try:
        asyncio.run(main())
    finally:
        if child.poll() is None and child.stdin is not None and not child.stdin.closed:
            child.stdin.close()
    return child.wait(10)


def _strict_json(line: str) -> dict[str, Any]:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in the log")

    record = json.loads(line, parse_constant=refuse)
    assert isinstance(record, dict)
    return record


def test_lines_no_parser_or_renderer_takes_are_logged_plain_and_the_reader_goes_on() -> None:
    out = MarkedOutput('"line": "ready"')
    configure_logging(log_format="json", stream=out)
    assert _relog_hostile(structlog.get_logger("cuzkd.engine"), out.seen) == 0  # no SIGPIPE
    events = [_strict_json(line) for line in out.getvalue().splitlines()]  # all valid JSON
    assert len(events) == len(HOSTILE) + 2  # one each, then "ready" and "last"
    plain = [e["line"] for e in events if e["event"] == "engine_output" and "line" in e]
    raw = [strip_controls(h[:MAX_LINE_BYTES].decode(errors="replace")) for h in HOSTILE]
    assert plain == [*raw[:7], raw[8], raw[9], raw[11], "ready", "last"]
    assert [e["event"] for e in events if "line" not in e] == [
        "lone", "nul", "engine_output", "odd_exception"]


def test_the_console_renderer_failing_on_a_line_logs_it_plain() -> None:
    out = MarkedOutput("ready")
    configure_logging(log_format="console", stream=out)
    assert _relog_hostile(structlog.get_logger("cuzkd.engine"), out.seen) == 0
    lines = out.getvalue().splitlines()
    (odd,) = [line for line in lines if "odd_exception" in line]
    assert "engine_output" in odd and "render_error=TypeError" in odd
    assert " engine_output " in lines[-1] and " line=last " in lines[-1]


class BrokenLogger(RecordingLogger):
    """A logger that raises for every ``engine_output`` (a bug in the logging path); ``ready``
    is set when it was asked to log the "ready" line."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = asyncio.Event()

    def __getattr__(self, level: str) -> Any:
        def log(event: str, **fields: Any) -> None:
            if event == "engine_output":
                if fields["line"] == "ready":
                    self.ready.set()
                raise RuntimeError("cannot log engine_output")
            self.calls.append((level, event, fields))
        return log


def test_a_logging_bug_never_ends_the_reader() -> None:
    logger = BrokenLogger()
    assert _relog_hostile(logger, logger.ready) == 0
    # Lines that are their own events are logged; of the plain ones, which all failed, one
    # note stands for all (rate-limited per stream), with the reason.
    assert [event for _, event, _ in logger.calls] == [
        "engine_output_unloggable", "lone", "nul", "odd_exception"]
    (level, _, note) = logger.calls[0]
    assert level == "error" and note["stream"] == "stdout"
    assert note["error"] == "RuntimeError: cannot log engine_output"
