"""A real HTTP/1.1 server that writes each response in small pieces, flushing between them.

A busy cuzk writes its 0.25-1 MB ``/status`` document in many small writes; a client that takes
the body from one read sees a fraction of it. This server reproduces that on a real socket (TCP
or Unix) inside the test's event loop: every ``piece`` bytes it drains the transport and yields,
so the client's reads return partial bodies. ``framing`` picks how the body's end is marked:
``length`` (Content-Length, keep-alive), ``chunked`` (Transfer-Encoding: chunked, keep-alive) or
``close`` (no length, the server closes the connection). ``hang`` accepts and never answers;
``delay`` answers that many seconds after the request (a busy engine's reply in flight).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Framing = Literal["length", "chunked", "close"]

_REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}


@dataclass
class PieceServer:
    body: bytes
    framing: Framing = "chunked"
    piece: int = 1024
    status: int = 200
    hang: bool = False
    delay: float = 0.0
    requests: int = 0
    #: set at each request's arrival (then replaced): a test can await a poll in flight
    arrived: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _server: asyncio.Server | None = field(default=None, repr=False)

    async def start_tcp(self) -> str:
        """Listen on a free loopback port; the status URL."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/status"

    async def start_unix(self, path: Path) -> str:
        """Listen on a Unix socket; the ``unix:`` status address."""
        self._server = await asyncio.start_unix_server(self._handle, str(path))
        return f"unix:{path}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                self.requests += 1
                self.arrived.set()
                self.arrived = asyncio.Event()
                if self.hang:
                    await asyncio.Event().wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                await self._respond(writer)
                if self.framing == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _respond(self, writer: asyncio.StreamWriter) -> None:
        head = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Status')}",
                "Content-Type: application/json"]
        if self.framing == "length":
            head.append(f"Content-Length: {len(self.body)}")
        elif self.framing == "chunked":
            head.append("Transfer-Encoding: chunked")
        else:
            head.append("Connection: close")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        for start in range(0, len(self.body), self.piece):
            piece = self.body[start:start + self.piece]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece)
                         if self.framing == "chunked" else piece)
            await writer.drain()
            await asyncio.sleep(0)  # let the client read what has arrived so far
        if self.framing == "chunked":
            writer.write(b"0\r\n\r\n")
        await writer.drain()
