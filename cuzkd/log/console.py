"""How a log line reads on a terminal: cuzkd's own events as structlog writes them, an engine's
as one line led by the engine's name.

An engine's line reads as docker compose and journalctl show a service's: the time and level,
the engine's name, ``|``, the engine's own event (a plain line's text), then the engine's own
fields. Which pipe and pid it came from, the engine's clock and logger name
(:data:`BOOKKEEPING`) stay in the JSON log, which keeps every field. The name is the one cuzkd
bound (``engine``, or ``oneshot`` for a one-shot command); nothing in the line can set it
(:data:`cuzkd.log.engineline.RESERVED`), so an engine's line can never pass for cuzkd's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from cuzkd.log.controls import strip_controls

#: The logger an engine's lines are logged under (:mod:`cuzkd.log.engineline`).
ENGINE_LOGGER = "cuzkd.engine"
#: The fields cuzkd binds to say whose line it is, the first one present naming it.
SOURCE_FIELDS = ("engine", "oneshot")
#: Fields the terminal line leaves off: the ones its columns show (time, level, source,
#: event), and what only a machine reading the log wants (which pipe, which pid, the engine's
#: own clock and logger name).
BOOKKEEPING = frozenset({"event", "level", "timestamp", "logger", "pid", "stream",
                         "engine_timestamp", "engine_logger", *SOURCE_FIELDS})
#: A string value with one of these is quoted (structlog's rule), so each field reads as one.
_QUOTED = frozenset(" \t=\"'")

#: cuzkd's own lines; the columns before an engine's fields, its event not padded.
_OWN = structlog.dev.ConsoleRenderer(colors=False)
_HEAD = structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0)


def render_console(logger: Any, method: str, event: structlog.typing.EventDict) -> str:
    """structlog's last processor on a terminal: an engine's line as
    :func:`engine_console_line` writes it, any other as structlog's console renderer does."""
    line = engine_console_line(event)
    return _OWN(logger, method, event) if line is None else line


def engine_console_line(event: Mapping[str, Any]) -> str | None:
    """``event`` as one terminal line, led by its engine's name; None if it is not an
    engine's line (cuzkd's own, or an engine process's own log, with no name bound)."""
    if event.get("logger") != ENGINE_LOGGER:
        return None
    source = next((event[key] for key in SOURCE_FIELDS if key in event), None)
    if source is None:
        return None
    fields = {key: value for key, value in event.items() if _matters(key, value, event)}
    message = event.get("event", "")
    if message == "engine_output" and "line" in fields:  # a plain line: its text is its message
        message = fields.pop("line")
    columns = {key: event[key] for key in ("timestamp", "level") if key in event}
    columns["event"] = f"{_printable(str(source))} | {_printable(str(message))}"
    words = [f"{_printable(str(key))}={_value(value)}" for key, value in fields.items()]
    return " ".join([_HEAD(None, "", columns), *words])


def _matters(key: str, value: Any, event: Mapping[str, Any]) -> bool:
    """Whether the terminal shows field ``key``: not bookkeeping, nor the engine's own pid
    where it is the pid cuzkd knows the line by."""
    if key in BOOKKEEPING:
        return False
    return not (key == "engine_pid" and value == event.get("pid"))


def _value(value: Any) -> str:
    """A field's value, on this line: a word as is, other strings and every other value as
    Python writes them (every character a terminal would not print escaped)."""
    if not isinstance(value, str):
        return repr(value)
    text = strip_controls(value)
    is_word = text and text.isprintable() and _QUOTED.isdisjoint(text)
    return text if is_word else repr(text)


def _printable(text: str) -> str:
    """``text`` without escape sequences and control characters, any other character a
    terminal would not print (a line separator, a zero-width space) written as its escape."""
    text = strip_controls(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char == "\t" else repr(char)[1:-1]
                   for char in text)
