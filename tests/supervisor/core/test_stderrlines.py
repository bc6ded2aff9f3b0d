"""The stderr tail's lines: the last ones, with a panic's head kept whatever follows it."""

from __future__ import annotations

from cuzkd.supervisor.core.stderrlines import PANIC_HEAD_LINES, StderrLines

HEAD = ["thread 'main' panicked at cuzk-daemon/src/main.rs:212:14:",
        "called `Result::unwrap()` on an `Err` value: Os { code: 2 }"]
BACKTRACE = ["note: run with `RUST_BACKTRACE=full` for a verbose backtrace.",
             "stack backtrace:",
             *(f"  {i}: cuzk_core::frame_{i}\n at src/x.rs:{i}" for i in range(60))]


def test_the_last_lines_without_a_panic() -> None:
    lines = StderrLines(5)
    for i in range(12):
        lines.append(f"line {i}")
    assert list(lines) == [f"line {i}" for i in range(7, 12)] and not lines.has_panic


def test_a_backtrace_never_pushes_out_the_panic_head() -> None:
    lines = StderrLines(20)
    for line in ["before 1", "before 2", *HEAD, *BACKTRACE]:
        lines.append(line)
    assert list(lines) == [*HEAD, *BACKTRACE[-18:]] and lines.has_panic


def test_short_output_keeps_everything_in_order_and_later_panics_are_plain_lines() -> None:
    lines = StderrLines(20)
    later = "thread 'worker-3' panicked at src/gpu.rs:9:1:"
    for line in ["before", *HEAD, "note: run with `RUST_BACKTRACE=1`", later]:
        lines.append(line)
    assert list(lines) == ["before", *HEAD, "note: run with `RUST_BACKTRACE=1`", later]
    for i in range(30):
        lines.append(f"after {i}")
    assert list(lines) == [*HEAD, *(f"after {i}" for i in range(12, 30))]


def test_a_panic_message_of_many_lines_is_kept_up_to_its_limit() -> None:
    lines = StderrLines(20)
    message = [f"message line {i}" for i in range(30)]
    for line in [HEAD[0], *message]:
        lines.append(line)
    kept = list(lines)
    assert kept[:PANIC_HEAD_LINES] == [HEAD[0], *message[:PANIC_HEAD_LINES - 1]]
    assert kept[PANIC_HEAD_LINES:] == message[-(20 - PANIC_HEAD_LINES):]
