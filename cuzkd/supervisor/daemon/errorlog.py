"""Errors reported outside our own log calls, made structured and rate-limited.

asyncio reports a failing ``accept`` (``EMFILE`` when descriptors run out) through the event
loop's exception handler, and aiohttp reports connection errors through the stdlib ``logging``
loggers ``aiohttp.server``/``aiohttp.web``/``aiohttp.access``. Left alone, both print a raw
multi-line traceback on stderr for every occurrence: under descriptor exhaustion that was
686,000 lines in 30 s. Here the loop's handler and a handler on the stdlib root logger turn
each report into one JSON event (``event_loop_error_caught``, ``library_logged``) written through a
shared :class:`~cuzkd.log.ratelimit.LimitedLog`: at most once per 10 s per kind and errno.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import structlog

from cuzkd.errortext import error_text
from cuzkd.log.ratelimit import LimitedLog, errno_name

log = structlog.get_logger("cuzkd.supervisor")


def loop_exception_handler(limited: LimitedLog) -> Any:
    """A handler for ``loop.set_exception_handler``."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        del loop
        message = str(context.get("message") or "unhandled exception in event loop")
        exc = context.get("exception")
        fields: dict[str, Any] = {"message": message}
        if isinstance(exc, BaseException):
            fields["error"] = error_text(exc)
            fields["errno"] = errno_name(exc)
            if not isinstance(exc, OSError):  # a bug: its traceback, inside the JSON line
                fields["exc_info"] = exc
        limited.log(log, "error", "event_loop_error_caught", key=(message, fields.get("errno")),
                    **fields)

    return handle


class StdlibBridge(logging.Handler):
    """Routes stdlib ``logging`` records (aiohttp's, asyncio's) into the structured log."""

    def __init__(self, limited: LimitedLog) -> None:
        super().__init__(logging.WARNING)
        self._limited = limited

    def emit(self, record: logging.LogRecord) -> None:
        try:
            exc = record.exc_info[1] if record.exc_info else None
            fields: dict[str, Any] = {"logger": record.name, "message": record.getMessage()}
            if exc is not None:
                fields["error"] = error_text(exc)
                fields["errno"] = errno_name(exc)
            # the unformatted message: one key per kind of report, not per peer address
            key = (record.name, str(record.msg), fields.get("errno"))
            self._limited.log(log, record.levelname.lower(), "library_logged", key=key, **fields)
        except Exception:  # a logging handler must never raise into the code that logged
            self.handleError(record)


def install(loop: asyncio.AbstractEventLoop, limited: LimitedLog) -> None:
    """Take over the loop's exception reports and the stdlib root logger's output."""
    loop.set_exception_handler(loop_exception_handler(limited))
    root = logging.getLogger()
    root.handlers = [StdlibBridge(limited)]
    root.setLevel(logging.WARNING)
