"""cuzk's log lines read back into their parts: tracing-subscriber's default text format.

cuzk writes its log as text on stdout (its ``[logging] format`` is parsed and ignored), one
line per event, as ``tracing_subscriber::fmt`` writes it by default (colours already removed,
:mod:`cuzkd.log.controls`; the second line is one, cut here)::

    2026-12-01T13:00:00.123456Z  INFO cuzk_daemon: cuzk-daemon ready, serving on unix:///run/curio/cuzk.sock
    2026-12-01T13:00:07.5Z  WARN prove{job_id=porep-1}:partition{index=3}: cuzk_core::engine:
    slow gpu_ms=7512 worker="gpu 0"

that is: an RFC 3339 timestamp, the level (``TRACE`` ... ``ERROR``), the spans in scope (each
``name{fields}:``, then a space; only in some configurations), the target and ``: ``, the
message, then the event's fields as ``key=value`` (a string value recorded with ``?`` is
quoted, Rust-escaped). :func:`parse_tracing_line` takes such a line apart, without I/O; a line
that is not one (a panic, ``Error: ...``, anything else) is None and stays plain output.

Two readings are guesses, as they are for anyone reading this format: the fields are the
longest run of ``key=value`` words that ends the line (a message ending in ``a=b`` loses it to
the fields), and a first part before the target is read as spans only if it has a ``{``
(``name{...}:``) or the part after it is a ``::`` path that it is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cuzkd.log.configure import LogLevel

#: cuzk's levels as cuzkd's (tracing has no ``critical``; ``TRACE`` is below our ``debug``).
LEVELS = {"ERROR": LogLevel.ERROR, "WARN": LogLevel.WARNING, "INFO": LogLevel.INFO,
          "DEBUG": LogLevel.DEBUG, "TRACE": LogLevel.DEBUG}

_HEAD = re.compile(
    r"(?P<timestamp>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d))"
    r" +(?P<level>TRACE|DEBUG|INFO|WARN|ERROR) +")
#: A target: a Rust module path (``cuzk_core::engine``) or any word without spaces.
_TARGET = re.compile(r"[A-Za-z_][\w\-]*(?:::[\w\-]+)*")
#: One span of the prefix: its name and, optionally, its fields in braces.
_SPAN = re.compile(r"[A-Za-z_][\w\-]*(?:\{(?:[^{}\"]|\"(?:[^\"\\]|\\.)*\")*\})?:")
#: A ``key=value`` word (value quoted with escapes, or up to the next space), or another word.
_WORD = re.compile(r"(?P<key>[A-Za-z_][\w.]*)=(?P<value>\"(?:[^\"\\]|\\.)*\"|\S*)(?=\s|$)|\S+")
_INTEGER = re.compile(r"-?\d{1,18}")
_DECIMAL = re.compile(r"-?\d{1,18}\.\d{1,18}")
_ESCAPE = re.compile(r"\\(?:u\{([0-9a-fA-F]{1,6})\}|(.))", re.DOTALL)
_ESCAPED = {"n": "\n", "r": "\r", "t": "\t", "0": "\0"}


@dataclass(frozen=True)
class TracingLine:
    """One parsed line; ``level`` is cuzkd's (``error`` ... ``debug``), ``spans`` the raw span
    prefix without its last colon (``""``: none)."""

    timestamp: str
    level: LogLevel
    target: str
    message: str
    fields: dict[str, str | int | float | bool]
    spans: str = ""


def parse_tracing_line(text: str) -> TracingLine | None:
    """``text`` read as a tracing-subscriber line; None when it is not one."""
    head = _HEAD.match(text)
    if head is None:
        return None
    rest = text[head.end():]
    spans, rest = _split_spans(rest)
    target = _TARGET.match(rest)
    if target is None or not rest.startswith(": ", target.end()):
        return None
    message, fields = _split_fields(rest[target.end() + 2:])
    return TracingLine(head["timestamp"], LEVELS[head["level"]], target.group(), message,
                       fields, spans)


def _split_spans(rest: str) -> tuple[str, str]:
    """The span prefix of ``rest`` (without its colon) and what follows it; ``("", rest)``
    when the line has none."""
    end = 0
    while (span := _SPAN.match(rest, end)) is not None:
        end = span.end()
    if not end or not rest.startswith(" ", end):
        return "", rest
    spans, after = rest[:end - 1], rest[end + 1:]
    target = _TARGET.match(after)
    if target is None or not after.startswith(": ", target.end()):
        return "", rest  # no target after it: the first word was the target
    if "{" in spans or ("::" in target.group() and "::" not in spans):
        return spans, after
    return "", rest


def _split_fields(text: str) -> tuple[str, dict[str, str | int | float | bool]]:
    """The message and the fields of an event's text: the fields are the ``key=value`` words
    that end it."""
    words = list(_WORD.finditer(text))
    first = len(words)
    while first and words[first - 1]["key"] is not None:
        first -= 1
    fields = {word["key"]: _value(word["value"]) for word in words[first:]}
    message = text[:words[first].start()].rstrip() if first < len(words) else text.rstrip()
    return message, fields


def _value(text: str) -> str | int | float | bool:
    """A field's value: a quoted string unescaped; integers, decimals and booleans as such."""
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        return _ESCAPE.sub(_unescape, text[1:-1])
    if text in ("true", "false"):
        return text == "true"
    if _INTEGER.fullmatch(text):
        return int(text)
    if _DECIMAL.fullmatch(text):
        return float(text)
    return text


def _unescape(match: re.Match[str]) -> str:
    code, char = match.groups()
    if code is not None:
        value = int(code, 16)
        return chr(value) if value <= 0x10FFFF and not 0xD800 <= value <= 0xDFFF else ""
    return _ESCAPED.get(char, char)
