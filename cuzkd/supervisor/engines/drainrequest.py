"""The stop sequence's ``http`` drain: ask the engine itself to drain.

The bundled engine's ``POST /v1/drain`` is served on the address its status is served on (a 0600
Unix socket for bundled engines); the reading of its status for a quiet moment is the pure
:mod:`cuzkd.supervisor.core.drain`.
"""

from __future__ import annotations

from urllib.parse import urljoin

import aiohttp

from cuzkd.status.client import describe_exception, split_address

#: Beyond the supervisor's own drain_timeout, the deadline given to an engine asked to drain:
#: the supervisor's clock decides (its stop signal ends the engine's drain), never a race
#: between two deadlines.
ENGINE_DEADLINE_SLACK = 5.0
#: How long the drain request itself may take: an engine accepts at once (202) and drains after
#: answering, so one that has not answered by then is not going to drain.
REQUEST_TIMEOUT = 5.0


def drain_target(status_address: str) -> tuple[str | None, str]:
    """(Unix socket or None, URL) of ``POST /v1/drain`` next to the engine's status."""
    socket_path, status_url = split_address(status_address)
    return socket_path, urljoin(status_url, "/v1/drain")


async def request_drain(status_address: str, timeout_secs: float) -> str | None:
    """Ask the engine to drain within ``timeout_secs``; None once it accepted, else why not."""
    socket_path, url = drain_target(status_address)
    connector: aiohttp.BaseConnector = (aiohttp.UnixConnector(path=socket_path)
                                        if socket_path is not None else aiohttp.TCPConnector())
    try:
        async with (aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT))
                    as session,
                    session.post(url, json={"timeout_secs": timeout_secs}) as resp):
            return None if resp.status == 202 else f"POST {url}: HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return str(describe_exception(exc, address=status_address, timeout=REQUEST_TIMEOUT))
