"""An engine's line on a terminal: one line, led by the engine's name and its own event, its own
fields after it, bookkeeping left to the JSON log; cuzkd's own lines as structlog writes them."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from cuzkd.log.console import engine_console_line, render_console

TIME = "2026-12-04T16:54:46.702907Z"


def _engine_event(**fields: Any) -> dict[str, Any]:
    """An engine's record as the processors hand it to the renderer."""
    return {"engine": "bundled-0", "stream": "stderr", "pid": 1136,
            "engine_timestamp": "2026-12-04T16:54:46.702384Z", "engine_logger": "cuzkd.engine",
            "event": "job_started", "level": "info", "logger": "cuzkd.engine",
            "timestamp": TIME, **fields}


def test_an_engine_record_is_one_line_led_by_its_name_and_event() -> None:
    line = engine_console_line(_engine_event(job_id="j-1", partitions=16, verified=True))
    assert line == (f"{TIME} [info     ] bundled-0 | job_started job_id=j-1 partitions=16 "
                    "verified=True")


def test_a_plain_line_is_its_text() -> None:
    line = engine_console_line(_engine_event(event="engine_output", line="plain words",
                                             truncated=True))
    assert line == f"{TIME} [info     ] bundled-0 | plain words truncated=True"


@pytest.mark.parametrize("field", ["stream", "pid", "engine_timestamp", "engine_logger",
                                   "logger", "engine", "level", "timestamp", "event"])
def test_bookkeeping_is_left_to_the_json_log(field: str) -> None:
    line = engine_console_line(_engine_event(engine_pid=1136))
    assert line is not None and f"{field}=" not in line and "engine_pid" not in line


def test_the_engines_own_fields_that_say_something_stay() -> None:
    """A pid other than its own, the level it named above ours, a field named like ours."""
    line = engine_console_line(_engine_event(engine_pid=7, engine_level="critical",
                                             engine_engine="inner", target="cuzk_core"))
    assert line is not None and line.endswith(
        " | job_started engine_pid=7 engine_level=critical engine_engine=inner target=cuzk_core")


def test_a_one_shot_command_is_named_by_its_command() -> None:
    event = _engine_event()
    del event["engine"]
    line = engine_console_line({**event, "oneshot": "/usr/bin/check"})
    assert line is not None and " /usr/bin/check | job_started" in line


@pytest.mark.parametrize("odd", [
    "a\nb", "a\r\nb", "a\x1b[2J\x1b[Hb", "a\u2028b", "a\u2029b", "a\x85b", "a\x0bb\x0cc",
    "a\x1b]0;title\x07b", "a\x00b",
])
def test_no_line_break_or_escape_reaches_the_terminal(odd: str) -> None:
    """Whatever reached the record (a tracing field unescaped to a newline, say): one line, the
    engine's name first, no escape sequence left to obey."""
    line = engine_console_line(_engine_event(event=odd, **{odd: odd, "list": [odd]}))
    assert line is not None and len(line.splitlines()) == 1
    assert "\x1b" not in line and "\r" not in line and "\n" not in line
    assert line.startswith(f"{TIME} [info     ] bundled-0 | a")


def test_an_exception_field_stays_on_the_line() -> None:
    """structlog's renderer prints ``exception`` on lines of its own; an engine's is a field."""
    line = engine_console_line(_engine_event(exception="Traceback: boom\nValueError"))
    assert line is not None and len(line.splitlines()) == 1
    assert line.endswith(" exception='Traceback: boomValueError'")


@pytest.mark.parametrize("value", ["has space", "k=v", "quote'", "tab\there", ""])
def test_a_string_that_is_not_one_word_is_quoted(value: str) -> None:
    line = engine_console_line(_engine_event(x=value))
    assert line is not None and line.endswith(f" x={value!r}")


@pytest.mark.parametrize("event", [
    {"event": "supervisor_started", "logger": "cuzkd.supervisor", "engine": "bundled-0"},
    {"event": "job_started", "logger": "cuzkd.engine"},  # the engine process's own log
    {"event": "door_serving", "logger": "cuzkd.door", "engine": "bundled-0", "pid": 3},
])
def test_any_other_line_is_structlogs(event: dict[str, Any]) -> None:
    assert engine_console_line(event) is None
    event = {**event, "level": "info", "timestamp": TIME}
    assert render_console(None, "info", dict(event)) == structlog.dev.ConsoleRenderer(
        colors=False)(None, "info", dict(event))
