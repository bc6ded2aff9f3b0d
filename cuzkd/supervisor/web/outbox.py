"""How ``/metrics`` and ``/status`` bodies leave the supervisor: bounded in memory and in time.

Handed to the transport whole, a body the client does not read stays in the transport's buffer,
one copy per connection: 2,000 clients that sent ``GET /status`` for a 1 MB document and never
read held 1.1 GB. The outbox sends one body object, shared by every response of the same
document version, in slices of :data:`SLICE_BYTES`, each only once the previous one has left
cuzkd's memory for the kernel (the listener sets each transport's high-water mark to 0, so it
"pauses" as soon as anything waits). So a connection holds at most one slice unsent, and all of
them together, with the bodies they send (each counted once), at most
:data:`SEND_BUDGET_BYTES` (:class:`~cuzkd.supervisor.core.sendbudget.SendBudget`): past it the
connections whose response progressed longest ago are closed, reason ``send_budget`` -- a
client that reads, even slowly, is never the oldest.

A response still being sent :data:`RESPONSE_DEADLINE` seconds after its handler began is closed
(reason ``deadline``), so a client that reads a byte now and then, never idle for the
listener, cannot hold a connection and its body forever. 120 s is twice the longest scrape
interval commonly used (1 m; Prometheus' ``scrape_timeout`` may not exceed the interval): no
scrape Prometheus still waits for is cut.
"""

from __future__ import annotations

import asyncio

from aiohttp import hdrs, web
from aiohttp.typedefs import LooseHeaders

from cuzkd.states import ConnectionClose
from cuzkd.supervisor.core.sendbudget import SendBudget
from cuzkd.supervisor.web.listener import reset

#: Bytes of a body handed to a connection's transport at a time: the most one connection
#: leaves in cuzkd's memory (the kernel's socket buffer takes what the network needs).
SLICE_BYTES = 16 * 1024
#: Bytes all responses in flight together may hold: their bodies (one per document version,
#: however many responses send it) and their unsent slices. Room for several versions of the
#: largest /status (8 engines x 1 MB documents: ~5 MB) and /metrics bodies at once.
SEND_BUDGET_BYTES = 64 * 2**20
#: Seconds from a handler's start to the last byte of its response.
RESPONSE_DEADLINE = 120.0


class Outbox:
    """Sends shared bodies in slices, within the send budget and the response deadline;
    ``closed_total`` counts the connections it closed, by reason."""

    def __init__(self, *, budget: int = SEND_BUDGET_BYTES, slice_bytes: int = SLICE_BYTES,
                 deadline: float = RESPONSE_DEADLINE) -> None:
        self._budget: SendBudget[asyncio.Transport] = SendBudget(max(budget, slice_bytes))
        self._slice = slice_bytes
        self._deadline = deadline
        self.closed_total: dict[str, int] = dict.fromkeys(
            (ConnectionClose.DEADLINE, ConnectionClose.SEND_BUDGET), 0)
        #: responses being sent now, and set whenever none is
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def held(self) -> int:
        """Bytes the responses in flight hold now: their bodies (each once), waiting slices."""
        return self._budget.held

    async def idle(self) -> None:
        """Until no response is being sent."""
        await self._idle.wait()

    async def send(self, request: web.Request, body: bytes,
                   headers: LooseHeaders) -> web.StreamResponse:
        """Answer ``request`` with ``body`` (never copied: keep it shared) and ``headers``."""
        self._sending += 1
        self._idle.clear()
        try:
            return await self._send(request, body, headers)
        finally:
            self._sending -= 1
            if not self._sending:
                self._idle.set()

    async def _send(self, request: web.Request, body: bytes,
                    headers: LooseHeaders) -> web.StreamResponse:
        response = web.StreamResponse(headers=headers)
        response.content_length = len(body)
        transport = request.transport
        if transport is None:  # the client has gone already
            return response
        view = memoryview(body)
        try:
            self._evict(self._budget.start(transport, id(body), len(body)))
            async with asyncio.timeout(self._deadline):
                await response.prepare(request)
                for start in range(0, 0 if request.method == hdrs.METH_HEAD else len(view),
                                   self._slice):
                    await self._send_slice(request, response, view[start:start + self._slice])
                await response.write_eof()
        except TimeoutError:
            self._close(transport, ConnectionClose.DEADLINE)
        except ConnectionError:  # closed under us (by the client, the listener or the budget)
            pass
        finally:
            self._budget.finish(transport)
        return response

    async def _send_slice(self, request: web.Request, response: web.StreamResponse,
                          piece: memoryview) -> None:
        """Write ``piece`` and wait until it has left for the kernel; counted as waiting all
        along (aiohttp's ``write`` may itself wait for the transport, every 64 KiB)."""
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("closed")
        self._evict(self._budget.hold(transport, len(piece)))
        await response.write(piece)
        await request.writer.drain()
        self._budget.release(transport)

    def _evict(self, transports: list[asyncio.Transport]) -> None:
        for transport in transports:
            self._close(transport, ConnectionClose.SEND_BUDGET)

    def _close(self, transport: asyncio.Transport, reason: ConnectionClose) -> None:
        if not transport.is_closing():
            self.closed_total[reason] += 1
            reset(transport)
