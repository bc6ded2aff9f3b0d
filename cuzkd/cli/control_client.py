"""The client side of the control socket, for ``cuzkd status|start|stop|restart|swap``.

Plain requests (:func:`call`, :func:`get_status`) use the standard library's ``http.client``:
``cuzkd status`` is typed by hand and run in loops, and importing aiohttp alone costs more
than the whole answer should take. Only the streaming ``cuzkd swap`` needs aiohttp
(:func:`control_session`), imported when it runs.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cuzkd.errors import ControlRequestFailed, ControlUnavailable
from cuzkd.errortext import error_text

if TYPE_CHECKING:
    import aiohttp

#: Requests go over the Unix socket; the host part only fills the URL.
BASE_URL = "http://cuzkd"
#: How long ``cuzkd status NAME`` waits for the engine's own status: a person is waiting, and an
#: engine that answers at all answers within milliseconds.
STATUS_TIMEOUT = 5.0


class _UnixConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _exchange(conn: http.client.HTTPConnection, method: str, path: str,
              body: bytes | None = None) -> tuple[int, bytes]:
    """Send one request on ``conn`` and close it; (HTTP status, body)."""
    try:
        conn.request(method, path, body,
                     {} if body is None else {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def call(socket_path: Path, method: str, path: str, *, timeout: float = 120.0,
         body: Any = None) -> Any:
    """One request to the control API (``body``: sent as JSON), the decoded JSON answer.

    Every way of not getting a sensible answer -- no socket, refused, permission denied, a
    dropped connection, a timeout, a body that is not JSON -- is one :class:`ControlUnavailable`
    whose message says which socket and why (exit 69); an error answer is
    :class:`ControlRequestFailed` with the supervisor's message (exit 1).
    """
    try:
        status, raw = _exchange(_UnixConnection(str(socket_path), timeout), method, path,
                                None if body is None else json.dumps(body).encode())
        answer = json.loads(raw or b"null")
    except (FileNotFoundError, ConnectionRefusedError, PermissionError) as exc:
        raise ControlUnavailable(f"cannot reach the supervisor at {socket_path}: "
                                 f"{exc.strerror} (is `cuzkd run` running with this config?)"
                                 ) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:  # timeouts are OSErrors
        raise ControlUnavailable(f"control socket {socket_path}: {error_text(exc)}") from None
    if status >= 400:
        error = answer.get("error") if isinstance(answer, dict) else None
        raise ControlRequestFailed(str(error or f"HTTP {status}"), status)
    return answer


def get_status(address: str, *, timeout: float = STATUS_TIMEOUT) -> bytes:
    """The body of an engine's status at ``unix:SOCKET`` (its ``/status``) or an ``http://`` URL.

    For ``cuzkd status NAME``, which reads the document where the supervisor does (the
    engine's ``status_address``). Errors are ``OSError``, ``http.client.HTTPException`` or
    ``ValueError`` (an HTTP error status).
    """
    conn: http.client.HTTPConnection
    if address.startswith("unix:"):
        conn, path = _UnixConnection(address.removeprefix("unix:"), timeout), "/status"
    else:
        parts = urlsplit(address)
        conn, path = http.client.HTTPConnection(parts.netloc, timeout=timeout), parts.path
    status, body = _exchange(conn, "GET", path or "/")
    if status != 200:
        raise ValueError(f"HTTP {status}")
    return body


@asynccontextmanager
async def control_session(socket_path: Path,
                          timeout: aiohttp.ClientTimeout) -> AsyncIterator[aiohttp.ClientSession]:
    """A client session on the control socket (request ``BASE_URL + path``), for streaming.

    Failures inside the block become :class:`ControlUnavailable`, as in :func:`call`.
    """
    import aiohttp  # only `cuzkd swap` streams; plain requests do not pay this import

    connector = aiohttp.UnixConnector(path=str(socket_path))
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            yield session
    except aiohttp.ClientConnectorError as exc:
        reason = exc.os_error.strerror or str(exc.os_error)
        raise ControlUnavailable(f"cannot reach the supervisor at {socket_path}: {reason} "
                                 "(is `cuzkd run` running with this config?)") from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ControlUnavailable(f"control socket {socket_path}: {error_text(exc)}") from None
