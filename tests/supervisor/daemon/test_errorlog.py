"""``cuzkd.supervisor.daemon.errorlog``: asyncio's and aiohttp's error reports become rate-limited
JSON events, never raw tracebacks on stderr."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from cuzkd.log.configure import configure_logging
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.supervisor.daemon import errorlog


@pytest.fixture
def out() -> Iterator[io.StringIO]:
    """The structured log, captured; the stdlib root logger restored afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging(log_format="json", stream=stream)
    try:
        yield stream
    finally:
        root.handlers, root.level = handlers, level


def _events(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_accept_failures_reported_by_the_loop_log_once(
        out: io.StringIO, capfd: pytest.CaptureFixture[str]) -> None:
    loop = asyncio.get_running_loop()
    errorlog.install(loop, LimitedLog())
    for _ in range(10_000):
        loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                     "exception": OSError(errno.EMFILE, "Too many open files")})
    [event] = _events(out)
    assert event["event"] == "event_loop_error_caught"
    assert event["errno"] == "EMFILE" and event["repeated"] == 1
    assert capfd.readouterr().err == ""


async def test_a_bug_reported_by_the_loop_keeps_its_traceback_in_the_json_line(
        out: io.StringIO) -> None:
    loop = asyncio.get_running_loop()
    errorlog.install(loop, LimitedLog())

    async def broken() -> None:
        raise RuntimeError("boom")

    task = loop.create_task(broken())
    await asyncio.wait([task])
    loop.call_exception_handler({"message": "Task exception was never retrieved",
                                 "exception": task.exception(), "future": task})
    [event] = _events(out)
    assert event["error"] == "RuntimeError: boom"
    assert "Traceback" in event["exception"]


async def test_aiohttp_server_errors_become_structured(
        out: io.StringIO, capfd: pytest.CaptureFixture[str]) -> None:
    errorlog.install(asyncio.get_running_loop(), LimitedLog())
    server_log = logging.getLogger("aiohttp.server")
    for peer in range(500):
        try:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        except ConnectionResetError:
            server_log.exception("Error handling request from %s", f"10.0.0.{peer}")
    [event] = _events(out)
    assert event["event"] == "library_logged" and event["logger"] == "aiohttp.server"
    assert event["message"] == "Error handling request from 10.0.0.0"
    assert event["errno"] == "ECONNRESET" and event["level"] == "error"
    assert capfd.readouterr().err == ""


async def test_an_exception_without_a_message_still_names_itself(out: io.StringIO) -> None:
    """``TimeoutError()`` has an empty message: never logged as ``TimeoutError: ``."""
    loop = asyncio.get_running_loop()
    errorlog.install(loop, LimitedLog())
    loop.call_exception_handler({"message": "read timed out", "exception": TimeoutError()})
    [event] = _events(out)
    assert event["error"] == "TimeoutError"
