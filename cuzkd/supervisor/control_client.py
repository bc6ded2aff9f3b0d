"""The client side of the control socket, for ``cuzkd status|start|stop|restart``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp


class ControlUnavailable(Exception):
    """The supervisor cannot be reached (no socket, refused, permission denied)."""


class ControlRequestFailed(Exception):
    """The supervisor answered with an error; the message is its ``error``."""


def call(socket_path: Path, method: str, path: str, *, timeout: float = 120.0) -> Any:
    """One request to the control API; the decoded JSON body."""
    return asyncio.run(_call(socket_path, method, path, aiohttp.ClientTimeout(total=timeout)))


async def _call(socket_path: Path, method: str, path: str,
                client_timeout: aiohttp.ClientTimeout) -> Any:
    connector = aiohttp.UnixConnector(path=str(socket_path))
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=client_timeout) as session:
        try:
            async with session.request(method, f"http://cuzkd{path}") as resp:
                body = await resp.json(content_type=None)
        except aiohttp.ClientConnectorError as exc:
            reason = exc.os_error.strerror or str(exc.os_error)
            raise ControlUnavailable(f"cannot reach the supervisor at {socket_path}: {reason} "
                                     "(is `cuzkd run` running with this config?)") from None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ControlUnavailable(f"control socket {socket_path}: {exc}") from None
    if resp.status >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        raise ControlRequestFailed(str(error or f"HTTP {resp.status}"))
    return body
