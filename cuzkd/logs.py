"""Structured logging set-up shared by every cuzkd process, and engine output re-logging.

``--log-format auto`` (the default) writes ``key=value`` console lines on a terminal and JSON
lines elsewhere (journald, Loki and ``docker logs`` want one event per line); ``console`` and
``json`` force one or the other. Configured once per process, before any logger is used.

An engine's output reaches the supervisor's log through :func:`engine_line_fields`: a line
that is a JSON object (the bundled engine logs JSON on its pipe) is re-logged as its own event,
level and fields, so the supervisor's JSON line carries them as fields and its console line
shows them as ``key=value`` -- never as a JSON string escaped inside another line.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, Literal, TextIO, get_args

if TYPE_CHECKING:
    import structlog

LogFormat = Literal["auto", "console", "json"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)

#: The levels an engine's line may name; any other is logged at ``info``.
_LEVELS = ("debug", "info", "warning", "error", "critical")
#: Fields the supervisor sets on a re-logged line (and the method's own parameter names): an
#: engine's field of the same name is kept as ``engine_<name>`` rather than overwriting ours.
_RESERVED = frozenset({"engine", "stream", "pid", "self", "logger"})


def configure_logging(*, level: str = "info", log_format: LogFormat = "auto",
                      stream: TextIO | None = None) -> None:
    """Configure structlog for this process (``auto``: JSON unless ``stream`` is a TTY)."""
    import logging  # here: the config (and so `cuzkd status`) imports this module's types

    import structlog

    out = stream if stream is not None else sys.stderr
    use_json = log_format == "json" or (log_format == "auto" and not out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    def named_logger(*args: Any) -> structlog.PrintLogger:
        """``structlog.get_logger(NAME)`` → a print logger that knows NAME, so every line says
        which part of cuzkd wrote it (``logger`` field)."""
        logger = structlog.PrintLogger(file=out)
        logger.name = str(args[0]) if args else "cuzkd"  # type: ignore[attr-defined]
        return logger

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=named_logger,
        cache_logger_on_first_use=False,
    )


def _add_logger_name(logger: Any, method: str, event_dict: Any) -> Any:
    """Processor: the ``logger`` field is the name given to ``structlog.get_logger`` -- unless
    the event names one itself (a bridged stdlib record says ``aiohttp.server`` wrote it)."""
    del method
    event_dict.setdefault("logger", getattr(logger, "name", "cuzkd"))
    return event_dict


def engine_line_fields(line: str) -> tuple[str, str, dict[str, Any]] | None:
    """``(level, event, fields)`` of an engine's JSON-object log line; None for anything else.

    The engine's ``timestamp`` is dropped (the re-logged line gets the supervisor's, a moment
    later); a field named like one the supervisor adds is renamed ``engine_<name>``. A line
    without ``event`` becomes an ``engine_output`` event with the line's fields.
    """
    stripped = line.strip()
    if not stripped.startswith("{"):
        return None
    try:
        record = json.loads(stripped)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    level = str(record.pop("level", "info")).lower()
    event = str(record.pop("event", "engine_output"))
    record.pop("timestamp", None)
    fields = {(f"engine_{key}" if key in _RESERVED else key): value
              for key, value in record.items()}
    return (level if level in _LEVELS else "info"), event, fields
