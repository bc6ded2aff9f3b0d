"""What one line of an engine's output becomes in the supervisor's log: a record or plain text.

Every line is first stripped of escape sequences and control characters
(:mod:`cuzkd.log.controls`). Then a JSON object (the bundled engine logs JSON on its pipe) or a
tracing-subscriber line (cuzk's, :mod:`cuzkd.log.tracingline`) becomes a record of its own --
an event, level and fields, which the supervisor's JSON line carries as fields and its console
line shows as ``key=value``, never as a document escaped inside another line. Anything else is
plain text (``engine_output`` with ``line``).

A record is unmistakably the engine's: it is logged under the ``cuzkd.engine`` logger with the
``engine`` the supervisor binds, and nothing in the line can overwrite a field cuzkd sets. A
field named like one of them (:data:`RESERVED`: ``logger``, ``engine``, ``stream``, ...) is kept
as ``engine_<name>``; the line's own timestamp is kept as ``engine_timestamp``; its level is
capped at ``error`` -- ``critical`` is the supervisor's word for "cuzkd itself is failing", and
one engine's line must not raise that alarm -- the level it named then kept as
``engine_level``, as is one cuzkd does not know (logged at ``info``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from cuzkd.log.configure import LogLevel
from cuzkd.log.controls import strip_controls
from cuzkd.log.tracingline import parse_tracing_line

#: The levels an engine's line is logged at; ``critical`` is capped to ``error``.
_LEVELS = frozenset(LogLevel)
_CAPPED = {"critical": "error", "fatal": "error"}
#: Fields cuzkd sets on an engine's record (and the logging method's own parameter names): an
#: engine's field of the same name is kept as ``engine_<name>``. ``exc_info`` and
#: ``stack_info`` too: they are instructions to our processors, not data.
RESERVED = frozenset({
    "event", "level", "logger", "timestamp", "engine", "stream", "pid", "oneshot", "self",
    "exc_info", "stack_info", "line", "render_error", "target", "spans", "repeated", "truncated",
    "engine_level", "engine_timestamp",
})
#: Fields the output reader sets on every line it re-logs (and the logging method's own
#: parameter names): a line of cuzkd's own (:func:`own_line`) keeps every other name.
READER_FIELDS = frozenset({
    "event", "level", "logger", "timestamp", "stream", "pid", "line", "render_error",
    "truncated", "exc_info", "stack_info",
})
#: Deepest nesting of objects and arrays in an engine's line re-logged as fields (the line
#: itself is level 1); engines log flat records, and far below the recursion limit of the
#: parser and the renderers (about 990 levels once the supervisor's own frames are counted).
MAX_FIELD_DEPTH = 32


@dataclass(frozen=True)
class EngineRecord:
    """One line as a record: logged as ``event`` at ``level`` with ``fields``."""

    level: str
    event: str
    fields: dict[str, Any]


def engine_line(line: str) -> EngineRecord | str:
    """``line`` (without its newline) as a record, or as the plain text to log."""
    text = strip_controls(line)
    return _json_record(text) or _tracing_record(text) or text


def _json_record(text: str) -> EngineRecord | None:
    """A JSON-object line as a record; None for anything else.

    An object our renderers could not write is "anything else" (logged as a plain line): one
    nested deeper than :data:`MAX_FIELD_DEPTH` (the parser or the renderer would hit the
    recursion limit: a 1000-deep line once killed the output reader, and the engine with it),
    one with ``NaN``/``Infinity`` or a number too large for a float (the JSON log would carry
    ``Infinity``, which no JSON reader takes), an integer over Python's 4300 digits. The
    line's escape codes are gone before it is parsed, but JSON can spell them (``\\u001b``):
    its keys and strings are stripped too. A line without ``event`` is an ``engine_output``.
    """
    record = _json_object(text)
    if record is None:
        return None
    level = str(record.pop("level", "info"))
    event = str(record.pop("event", "engine_output"))
    own: dict[str, Any] = {}
    if "timestamp" in record:
        own["engine_timestamp"] = record.pop("timestamp")
    return _record(level, event, own, record)


def _json_object(text: str) -> dict[str, Any] | None:
    """The JSON object ``text`` holds, its strings stripped of controls; None if it holds
    none our renderers could write (:func:`_json_record`)."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    try:
        record = json.loads(stripped, parse_constant=_reject_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not _nested_at_most(record, MAX_FIELD_DEPTH):
        return None
    stripped_record: dict[str, Any] = _stripped(record)
    return stripped_record


def own_line(line: str) -> EngineRecord | str:
    """A line of a process that is part of cuzkd (the door process), as a record or text.

    Its JSON record is ours, so it is logged as cuzkd logged it: its fields keep their names
    (its ``engine`` is the engine it speaks of, not a claim to be one) and its level is not
    capped. Only its ``logger`` and ``timestamp`` go (the supervisor's logger and clock write
    the line), and a field named like one the output reader sets (:data:`READER_FIELDS`) is
    kept as ``own_<name>``."""
    text = strip_controls(line)
    record = _json_object(text)
    if record is None or not isinstance(record.get("event"), str):
        return text
    level = str(record.pop("level", "info")).lower()
    event = record.pop("event")
    record.pop("logger", None)
    record.pop("timestamp", None)
    fields: dict[str, Any] = {}
    for key, value in record.items():
        name = key
        while name in READER_FIELDS or name in fields:
            name = f"own_{name}"
        fields[name] = value
    return EngineRecord(level if level in (*_LEVELS, "critical") else "info", event, fields)


def _tracing_record(text: str) -> EngineRecord | None:
    """A tracing-subscriber line as a record (its message the event); None if it is not one."""
    parsed = parse_tracing_line(text)
    if parsed is None:
        return None
    own: dict[str, Any] = {"target": parsed.target, "engine_timestamp": parsed.timestamp}
    if parsed.spans:
        own["spans"] = parsed.spans
    return _record(parsed.level, parsed.message or "engine_output", own, parsed.fields)


def _record(level: str, event: str, own: dict[str, Any],
            fields: dict[str, Any]) -> EngineRecord:
    """The record: ``own`` (the fields this module sets) and the line's ``fields``, each
    renamed ``engine_<name>`` (again, until free) where it would take a name we use."""
    logged = _CAPPED.get(level.lower(), level.lower())
    if logged not in _LEVELS:
        logged = "info"
    if logged != level.lower():
        own["engine_level"] = level
    merged = dict(own)
    for key, value in fields.items():
        name = key
        while name in RESERVED or name in merged:
            name = f"engine_{name}"
        merged[name] = value
    return EngineRecord(logged, event, merged)


def _stripped(value: Any) -> Any:
    """``value`` with every string in it (keys too) stripped of controls; recursion is safe:
    the depth was checked (at most :data:`MAX_FIELD_DEPTH`)."""
    if isinstance(value, str):
        return strip_controls(value)
    if isinstance(value, dict):
        return {strip_controls(key): _stripped(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_stripped(item) for item in value]
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a JSON log can carry")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} does not fit a float")
    return value


def _nested_at_most(record: dict[str, Any], limit: int) -> bool:
    """Whether no value of ``record`` (itself level 1) nests objects or arrays deeper than
    ``limit`` levels; iterative, so any depth is measured without recursing."""
    pending: list[tuple[Any, int]] = [(record, 1)]
    while pending:
        value, depth = pending.pop()
        children = (value.values() if isinstance(value, dict)
                    else value if isinstance(value, list) else None)
        if children is None:
            continue
        if depth > limit:
            return False
        pending.extend((child, depth + 1) for child in children)
    return True
