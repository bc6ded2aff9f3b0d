"""The forwarder of a door on a passed socket (door/forward.py), on real sockets: every byte
both ways, half-closes passed on, the connection cap held by the kernel's backlog, and
close() ending what is under way. The upstream is a plain echo server: the forwarder never
parses what it moves."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from cuzkd.log.ratelimit import LimitedLog
from cuzkd.supervisor.door.forward import SocketForward

TIMEOUT = 20


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Everything back, then the end once the caller ended."""
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()


@asynccontextmanager
async def forwarded(tmp: Path, max_connections: int = 8
                    ) -> AsyncIterator[tuple[SocketForward, str]]:
    """A forwarder from a listening socket at tmp/passed.sock to an echo server."""
    upstream = await asyncio.start_unix_server(_echo, str(tmp / "up.sock"))
    passed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    passed.bind(str(tmp / "passed.sock"))
    passed.listen(16)
    forward = SocketForward("cz", passed, tmp / "up.sock", LimitedLog(), max_connections)
    forward.start()
    try:
        yield forward, str(tmp / "passed.sock")
    finally:
        await forward.close()
        upstream.close()
        await upstream.wait_closed()


async def _round_trip(path: str, data: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(path)
    async def send() -> None:
        writer.write(data)
        await writer.drain()
        writer.write_eof()  # the half-close reaches the echo server through the forwarder
    sending = asyncio.create_task(send())
    back = await reader.read()  # to the end: the echo server's close came back too
    await sending
    writer.close()
    return back


async def _piped(path: str, data: bytes
                 ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection through the forwarder, ``data`` echoed once: the pipe is up."""
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(data)
    assert await asyncio.wait_for(reader.readexactly(len(data)), TIMEOUT) == data
    return reader, writer


async def _still_waiting(read: asyncio.Future[bytes]) -> bool:
    """Nothing has come back to ``read`` for a while (a bound on a negative)."""
    done, _ = await asyncio.wait({read}, timeout=0.3)
    return not done


async def test_bytes_go_both_ways_unchanged_and_half_closes_pass(tmp_path: Path) -> None:
    async with forwarded(tmp_path) as (_, path):
        odd = os.urandom(8 << 20) + b"\0\xff" * 1000  # no framing of any kind
        backs = await asyncio.wait_for(asyncio.gather(
            _round_trip(path, odd), _round_trip(path, b""), _round_trip(path, b"x")),
            TIMEOUT)
        assert backs == [odd, b"", b"x"]


async def test_connections_over_the_cap_wait_in_the_backlog(tmp_path: Path) -> None:
    async with forwarded(tmp_path, max_connections=1) as (_, path):
        _, w1 = await _piped(path, b"one")
        # connected (the kernel's backlog), not piped while the first holds the slot
        r2, w2 = await asyncio.open_unix_connection(path)
        w2.write(b"two")
        waiting = asyncio.ensure_future(r2.readexactly(3))
        assert await _still_waiting(waiting), "a second connection was piped past the cap"
        w1.close()
        assert await asyncio.wait_for(waiting, TIMEOUT) == b"two"
        w2.close()


async def test_stop_accepting_leaves_new_connections_to_the_next_process(tmp_path: Path) -> None:
    async with forwarded(tmp_path) as (forward, path):
        r1, w1 = await _piped(path, b"a")
        forward.stop_accepting()
        await asyncio.sleep(0)  # the accept task's cancellation lands
        r2, w2 = await asyncio.open_unix_connection(path)  # the kernel still takes it
        w2.write(b"b")
        w1.write(b"c")  # the pipe under way goes on
        assert await asyncio.wait_for(r1.readexactly(1), TIMEOUT) == b"c"
        waiting = asyncio.ensure_future(r2.read(1))
        assert await _still_waiting(waiting), "accepted after stop_accepting"
        waiting.cancel()
        w1.close()
        w2.close()


async def test_close_ends_a_pipe_whose_caller_sends_nothing(tmp_path: Path) -> None:
    async with forwarded(tmp_path) as (forward, path):
        reader, writer = await _piped(path, b"z")
        await asyncio.wait_for(forward.close(), TIMEOUT)  # a silent caller holds nothing
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
        writer.close()
