"""The client side of the control socket, for ``cuzkd status|start|stop|restart|swap``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

#: Requests go over the Unix socket; the host part only fills the URL.
BASE_URL = "http://cuzkd"


class ControlUnavailable(Exception):
    """The supervisor cannot be reached (no socket, refused, permission denied)."""


class ControlRequestFailed(Exception):
    """The supervisor answered with an error; the message is its ``error``."""


def call(socket_path: Path, method: str, path: str, *, timeout: float = 120.0) -> Any:
    """One request to the control API; the decoded JSON body."""
    return asyncio.run(_call(socket_path, method, path, aiohttp.ClientTimeout(total=timeout)))


@asynccontextmanager
async def control_session(socket_path: Path,
                          timeout: aiohttp.ClientTimeout) -> AsyncIterator[aiohttp.ClientSession]:
    """A client session on the control socket (request ``BASE_URL + path``).

    Every way of not getting a sensible answer inside the block -- no socket, refused,
    permission denied, a dropped connection, a timeout, a body that is not JSON -- becomes one
    :class:`ControlUnavailable` whose message says which socket and why, so each command
    reports it the same way (exit 69).
    """
    connector = aiohttp.UnixConnector(path=str(socket_path))
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            yield session
    except aiohttp.ClientConnectorError as exc:
        reason = exc.os_error.strerror or str(exc.os_error)
        raise ControlUnavailable(f"cannot reach the supervisor at {socket_path}: {reason} "
                                 "(is `cuzkd run` running with this config?)") from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ControlUnavailable(f"control socket {socket_path}: {exc}") from None


async def _call(socket_path: Path, method: str, path: str,
                client_timeout: aiohttp.ClientTimeout) -> Any:
    async with (
        control_session(socket_path, client_timeout) as session,
        session.request(method, BASE_URL + path) as resp,
    ):
        body = await resp.json(content_type=None)
    if resp.status >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        raise ControlRequestFailed(str(error or f"HTTP {resp.status}"))
    return body
