"""Structured logging set-up shared by every cuzkd process.

``--log-format auto`` (the default) writes ``key=value`` console lines on a terminal
(:mod:`cuzkd.log.console`: an engine's led by its name) and JSON lines elsewhere (journald, Loki
and ``docker logs`` want one event per line, every field kept); ``console`` and ``json`` force
one or the other. Configured once per process, before any logger is used:
:func:`configure_queued_logging` for ``cuzkd run`` (its lines are written off the event loop,
:mod:`cuzkd.log.sink`), :func:`configure_logging` for everything else.

What an engine's output line becomes in this log is :mod:`cuzkd.log.engineline`'s.
"""

from __future__ import annotations

import enum
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import structlog

    from cuzkd.log.queue import DropReport
    from cuzkd.log.sink import LogSink



class LogFormat(enum.StrEnum):
    """How log lines are written (``--log-format``, ``[supervisor] log_format``)."""

    #: console lines on a terminal, JSON lines elsewhere
    AUTO = "auto"
    CONSOLE = "console"
    JSON = "json"


class LogLevel(enum.StrEnum):
    """A level of cuzkd's log; the least severe one logged is ``--log-level`` (``[supervisor]
    log_level``)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


def configure_logging(*, level: LogLevel = LogLevel.INFO, log_format: LogFormat = LogFormat.AUTO,
                      stream: TextIO | None = None) -> None:
    """Configure structlog for this process (``auto``: JSON unless ``stream`` is a TTY); each
    line is written to ``stream`` (stderr) as it is logged: the CLI commands, ``cuzkd engine``."""
    out = stream if stream is not None else sys.stderr
    _Rendering(level, log_format, out).install(_writer(out))


def configure_queued_logging(*, level: LogLevel = LogLevel.INFO,
                             log_format: LogFormat = LogFormat.AUTO,
                             stream: TextIO | None = None) -> LogSink:
    """As :func:`configure_logging`, but lines reach ``stream``'s descriptor through a
    :class:`~cuzkd.log.sink.LogSink` (``cuzkd run``: a stalled reader must never stall the
    event loop); the caller closes it at exit and reads its drop counts."""
    from cuzkd.log.sink import LogSink

    out = stream if stream is not None else sys.stderr
    rendering = _Rendering(level, log_format, out)
    sink = LogSink(out.fileno(), rendering.drop_report)
    rendering.install(sink.write)
    return sink


class _Rendering:
    """The processor chain of this process's log lines, for ``out``."""

    def __init__(self, level: LogLevel, log_format: LogFormat, out: TextIO) -> None:
        import logging  # here: the config (and so `cuzkd status`) imports this module's types

        import structlog

        from cuzkd.log.console import render_console

        use_json = log_format == LogFormat.JSON or (
            log_format == LogFormat.AUTO and not out.isatty())
        renderer: structlog.typing.Processor = (
            structlog.processors.JSONRenderer()
            if use_json
            else render_console
        )
        self._processors: list[structlog.typing.Processor] = [
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ]
        self._wrapper = structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()])
        #: renders a line without writing it (the sink writes its drop reports itself)
        self._renderer = structlog.wrap_logger(
            _LineLogger("cuzkd.logs", lambda line: line), processors=self._processors,
            wrapper_class=self._wrapper)

    def install(self, write: Callable[[str], None]) -> None:
        """Make this the process's logging, each line handed to ``write``."""
        import structlog

        structlog.configure(
            processors=self._processors,
            wrapper_class=self._wrapper,
            # ``structlog.get_logger(NAME)``: every line says which part of cuzkd wrote it
            logger_factory=lambda *args: _LineLogger(str(args[0]) if args else "cuzkd", write),
            cache_logger_on_first_use=False,
        )

    def drop_report(self, drop: DropReport) -> str | None:
        """The line that tells of a gap in the log (None when warnings are not logged)."""
        line: str | None = self._renderer.warning(
            "log_lines_dropped", reason=str(drop.reason), lines=drop.lines,
            seconds=round(drop.seconds, 3))
        return line


class _LineLogger:
    """structlog's logger: hands each rendered event to ``write`` as one line. ``name`` is the
    name given to ``structlog.get_logger`` (the ``logger`` field)."""

    def __init__(self, name: str, write: Callable[[str], Any]) -> None:
        self.name = name
        self._write = write

    def msg(self, message: str) -> Any:
        return self._write(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _writer(out: TextIO) -> Callable[[str], None]:
    """Synchronous output: each line written whole and flushed (threads log too)."""
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            out.write(line + "\n")
            out.flush()

    return write


def _add_logger_name(logger: Any, method: str, event_dict: Any) -> Any:
    """Processor: the ``logger`` field is the name given to ``structlog.get_logger`` -- unless
    the event names one itself (a bridged stdlib record says ``aiohttp.server`` wrote it)."""
    del method
    event_dict.setdefault("logger", getattr(logger, "name", "cuzkd"))
    return event_dict
