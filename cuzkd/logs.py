"""Structured logging set-up shared by every cuzkd process.

JSON lines when stderr is not a terminal (journald, Loki and ``docker logs`` want one event per
line), ``key=value`` console rendering on a terminal. Configured once per process, before any
logger is used.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(*, level: str = "info", json: bool | None = None,
                      stream: TextIO | None = None) -> None:
    """Configure structlog for this process.

    ``json=None`` picks JSON when ``stream`` is not a TTY.
    """
    out = stream if stream is not None else sys.stderr
    use_json = (not out.isatty()) if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
