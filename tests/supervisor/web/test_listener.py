"""``cuzkd.supervisor.web.listener.GatedListener`` in-process, over real TCP connections.

The limit and idle time are the seams: a limit of 2 or 3 and 1-2 s instead of the descriptor
budget and 10 s.
"""

from __future__ import annotations

import asyncio
import resource
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from support.waiting import wait_until

from cuzkd.supervisor.web.listener import GatedListener, connection_limit


class Served:
    def __init__(self, listener: GatedListener, port: int, limits: list[int]) -> None:
        self.listener, self.port, self.limits = listener, port, limits


async def _serve(limit: int, idle: float) -> tuple[web.AppRunner, Served]:
    async def hello(request: web.Request) -> web.Response:
        del request
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    assert runner.server is not None
    limits: list[int] = []
    listener = GatedListener(runner.server, limit=lambda: limit, idle=idle,
                             on_limit=limits.append)
    [(_, port)] = await listener.start("127.0.0.1", 0)
    return runner, Served(listener, port, limits)


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    limit, idle = request.param
    runner, out = await _serve(limit, idle)
    try:
        yield out
    finally:
        out.listener.close()
        await runner.cleanup()


async def _connect(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    try:
        data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 1), within)
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return data == b""


async def _refused(port: int) -> bool:
    """True when the server resets a new connection (during or right after the handshake)."""
    try:
        sock = await _connect(port)
    except ConnectionResetError:
        return True
    try:
        return await _closed_by_peer(sock, 5)
    finally:
        sock.close()


async def _get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    body = await reader.read()
    writer.close()
    return body


@pytest.mark.parametrize("served", [(3, 2.0)], indirect=True)
async def test_over_the_limit_refused_and_idle_ones_closed(served: Served) -> None:
    held = [await _connect(served.port) for _ in range(3)]
    for _ in range(2):  # refused at once, not left waiting
        assert await _refused(served.port)
    assert served.listener.refused_total == 2
    assert served.limits == [3, 3]
    assert served.listener.open == 3
    # the silent three are closed after `idle`; the listener then serves again
    for sock in held:
        assert await _closed_by_peer(sock, 5)
    assert served.listener.idle_closed_total == 3
    assert served.listener.open == 0
    assert (await _get(served.port)).endswith(b"ok")
    for sock in held:
        sock.close()


@pytest.mark.parametrize("served", [(3, 1.0)], indirect=True)
async def test_a_talking_connection_is_not_idle(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    for _ in range(5):  # 5 requests over ~1.5 s (longer than idle) on one connection
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"ok")
        await asyncio.sleep(0.3)
    assert served.listener.idle_closed_total == 0
    writer.close()


@pytest.mark.parametrize("served", [(2, 10.0)], indirect=True)
async def test_closing_a_connection_lets_the_next_in(served: Served) -> None:
    held = [await _connect(served.port) for _ in range(2)]
    assert await _refused(served.port)
    held[0].close()
    await _wait_open(served.listener, 1)
    assert (await _get(served.port)).endswith(b"ok")
    held[1].close()


async def _wait_open(listener: GatedListener, count: int) -> None:
    """The server sees a client's close on its next loop turns (which run while this waits)."""
    await asyncio.to_thread(wait_until, lambda: listener.open == count, 10,
                            f"{count} connection(s) open, not {listener.open}")


def test_connection_limit_leaves_a_reserve() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert connection_limit(8) < soft
    assert connection_limit(10_000) == 4  # never below a few connections for Prometheus
