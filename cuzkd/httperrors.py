"""One error shape for every HTTP API cuzkd serves: ``{"error": "..."}`` with a 4xx/5xx status.

Clients (the CLI, ``cuzkd bench``, operators with curl and jq) never have to parse HTML or
text. Two layers make that hold everywhere:

* :func:`json_errors`, a middleware, rewrites what handlers and routing raise -- aiohttp's
  404, 405 and 413 included -- and turns a handler's bug into a logged 500.
* :class:`JsonErrorsRunner` covers what fails before any middleware runs: a request line or
  header longer than aiohttp's limits, or bytes that are not HTTP at all. aiohttp answers those
  from its protocol handler in text; the runner's handler answers the same status in JSON.

Request bodies are read through :func:`read_body`, which bounds the wait for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

log = structlog.get_logger("cuzkd.http")

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: How long a request body may take to arrive. aiohttp waits for a body without limit, so a
#: client announcing more than it sends (a Content-Length above its body, a chunked body never
#: ended) would hold its handler and connection for good.
BODY_TIMEOUT = 10.0


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def read_body(request: web.Request, timeout: float = BODY_TIMEOUT) -> bytes:
    """The request's whole body; a JSON 408 (through :func:`json_errors`) when it has not
    arrived within ``timeout`` seconds."""
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"the request body did not arrive within {timeout:g}s") from None


@web.middleware
async def json_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Turn aiohttp's text errors (404, 405, 413, ...) and handler bugs into the JSON shape."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        custom = exc.text is not None and not exc.text.startswith(f"{exc.status}:")
        return error_response(exc.status, exc.text if custom and exc.text else exc.reason)
    except Exception as exc:  # a bug: still the API's shape, and logged with its traceback
        log.exception("http_request_failed", method=request.method, path=request.path)
        return error_response(500, f"internal error: {exc!r}")


class _JsonErrorRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol handler, answering its own errors in JSON."""

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # The base class logs, and refuses (ConnectionError) when a response already started.
        super().handle_error(request, status, exc, message)
        phrase = HTTPStatus(status).phrase
        detail = " ".join(str(getattr(exc, "message", "") or message or "").split())
        response = error_response(status, f"{phrase}: {detail}" if detail else phrase)
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorsRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose protocol-level errors are JSON too."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # Application builds a plain Server (with its routing handler and request factory);
        # the subclass only changes which protocol handler each connection gets.
        server.__class__ = _JsonErrorServer
        return server
