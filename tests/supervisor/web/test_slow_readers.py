"""Slow readers of the metrics listener's responses, over real TCP connections.

The real listener and the real ``/status`` and ``/metrics`` routes, in-process, answering from a
stand-in supervisor with a body of a few MiB; the clients are real sockets with a small
``SO_RCVBUF`` that read never, or at a pace. The assertions are on bytes and on the
connections the server still holds (aiohttp's own list of them), never on elapsed time: the
idle time and the deadline are seams (1 s here instead of 10 s and 120 s).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web
from support.waiting import until

from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.sample import EngineSample, SupervisorSample
from cuzkd.states import ConnectionClose
from cuzkd.supervisor.web.access import WebAccess
from cuzkd.supervisor.web.listener import GatedListener
from cuzkd.supervisor.web.metrics_routes import build_metrics_app
from cuzkd.supervisor.web.outbox import SLICE_BYTES, Outbox

#: Engines in the stand-in's sample: a /metrics body of ~600 KB.
ENGINES = 300
#: Room for the response's status line and headers, sent with the first slice.
HEADERS = 512


class _Supervisor:
    """A ScrapeTarget whose /status is ``body`` (a new version of it for each request when
    ``versions``: another object, the same bytes)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.versions = False

    async def sample(self, max_age: float = 1.0) -> SupervisorSample:
        del max_age
        return SupervisorSample(engines=[_engine(f"engine-{i}") for i in range(ENGINES)],
                                zombies_reaped_total=0)


    async def status_body(self) -> bytes:
        return bytes(bytearray(self.body)) if self.versions else self.body


def _engine(name: str) -> EngineSample:
    return EngineSample(name=name, state="running", restarts_total=0, exits_total={},
                        start_time_seconds=1.0, resident_memory_bytes=1, cpu_seconds_total=1.0,
                        status=None, extensions=None, fetch_duration_seconds=0.1,
                        fetch_errors_total=0)


@dataclass
class Served:
    supervisor: _Supervisor
    runner: web.AppRunner
    listener: GatedListener
    outbox: Outbox
    port: int
    body: bytes

    def transports(self) -> dict[int, asyncio.Transport]:
        """Client port -> the server's transport of the connection."""
        assert self.runner.server is not None
        return {h.transport.get_extra_info("peername")[1]: h.transport
                for h in self.runner.server.connections if h.transport is not None}

    def transport_of(self, port: int) -> asyncio.Transport:
        return self.transports()[port]

    def waiting(self) -> dict[int, int]:
        """Client port -> bytes its response has waiting in the server's transport."""
        return {port: t.get_write_buffer_size() for port, t in self.transports().items()}


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    size, outbox, idle = request.param
    body = bytes(range(256)) * (size // 256)
    supervisor = _Supervisor(body)
    app = build_metrics_app(supervisor, outbox, WebAccess("", LimitedLog()))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    assert runner.server is not None
    listener = GatedListener(runner.server, limit=lambda: 64, idle=idle)
    [(_, port)] = await listener.start("127.0.0.1", 0)
    try:
        yield Served(supervisor, runner, listener, outbox, port, body)
    finally:
        listener.close()
        await runner.cleanup()


async def _request(served: Served, path: str = "/status", *, method: str = "GET",
                   server_sndbuf: int | None = None) -> socket.socket:
    """A client with a small receive buffer that has sent ``METHOD path`` and read nothing.

    ``server_sndbuf`` shrinks the server's socket buffer before the request (on loopback the
    kernel would take ~4 MB of the response off cuzkd's hands: a slow link's bytes stay in
    cuzkd then, as they do across a WAN).
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", served.port))
    if server_sndbuf is not None:
        port = sock.getsockname()[1]
        await until(lambda: port in served.waiting(), "the server's side of the connection")
        served.transport_of(port).get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, server_sndbuf)
    request = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    await loop.sock_sendall(sock, request.encode())
    return sock


async def _read(sock: socket.socket, pace: float) -> bytes:
    """Everything until the server closes, 4 KiB at a time every ``pace`` seconds (a slow
    link: the pacing is the client's speed, not a wait for the server)."""
    loop, got = asyncio.get_running_loop(), bytearray()
    while True:
        try:
            data = await loop.sock_recv(sock, 4096)
        except ConnectionResetError:
            return bytes(got)
        if not data:
            return bytes(got)
        got += data
        await asyncio.sleep(pace)


async def _until_waiting(served: Served, client: socket.socket) -> None:
    port = client.getsockname()[1]
    await until(lambda: served.waiting().get(port), f"client {port}'s response waiting")


def _body_of(response: bytes) -> bytes:
    return response.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("served", [(4 * 2**20, Outbox(), 10.0)], indirect=True)
async def test_a_reader_that_never_reads_holds_one_slice(served: Served) -> None:
    """Six clients of a 4 MiB /status that never read: each response waits with at most one
    slice (16 KiB) in cuzkd's memory, not the rest of the body (4 MiB less what the kernel
    took: 24 MiB here, 1.1 GB for 2,000 clients of 1 MB); a client that reads then gets it
    whole (and one that asks with HEAD, the headers alone)."""
    stalled = [await _request(served) for _ in range(6)]
    await until(lambda: len(w := served.waiting()) == 6 and all(w.values()),
                 "six responses waiting on their readers")
    assert max(served.waiting().values()) <= SLICE_BYTES + HEADERS
    reader = await _request(served)
    assert _body_of(await _read(reader, 0)) == served.body
    head = await _request(served, method="HEAD")
    headers, _, body = (await _read(head, 0)).partition(b"\r\n\r\n")
    assert f"Content-Length: {len(served.body)}".encode() in headers and body == b""
    for sock in (*stalled, reader, head):
        sock.close()


@pytest.mark.parametrize("served", [(2**20, Outbox(budget=2**20 + 1024), 10.0)],
                         indirect=True)
async def test_past_the_send_budget_the_longest_waiting_are_closed(served: Served) -> None:
    """Room for the body and 1 KiB unsent in all, six stalled clients: the first ones are
    closed (counted ``send_budget``), the last stays, what all hold stays within the budget
    (the shared body counted once), and a client that reads still gets the whole body."""
    await _stall_six(served)
    assert served.outbox.held <= 2**20 + max(1024, SLICE_BYTES + HEADERS)
    reader = await _request(served)
    assert _body_of(await _read(reader, 0)) == served.body


@pytest.mark.parametrize("served", [(2**20, Outbox(budget=5 * 2**19), 10.0)], indirect=True)
async def test_each_version_in_flight_counts(served: Served) -> None:
    """Six stalled clients, each sent another version of a 1 MiB /status, with room for two
    and a half: those on the oldest versions are closed, at most two bodies stay alive."""
    served.supervisor.versions = True
    survivors = await _stall_six(served)
    assert survivors <= 2
    assert served.outbox.held <= 5 * 2**19


async def _stall_six(served: Served) -> int:
    """Six clients that never read, one after the other (so their order is known): the
    oldest are closed by the budget, the newest stay; how many stay."""
    stalled = []
    for _ in range(6):
        stalled.append(await _request(served, server_sndbuf=32768))
        await _until_waiting(served, stalled[-1])
    evicted = served.outbox.closed_total[ConnectionClose.SEND_BUDGET]
    assert 1 <= evicted < 6
    ports = [sock.getsockname()[1] for sock in stalled]
    await until(lambda: set(served.waiting()) == set(ports[evicted:]),
                 f"the {evicted} oldest closed")
    for sock in stalled:
        sock.close()
    return 6 - evicted


@pytest.mark.parametrize("served", [(2 * 2**20, Outbox(), 1.0)], indirect=True)
async def test_a_response_still_being_read_is_not_idle(served: Served) -> None:
    """A client reading 2 MiB at ~1 MB/s (seconds, against an idle time of 1 s) gets all of
    it: bytes moved, so the connection is not idle (it used to be cut `idle` after the
    request)."""
    sock = await _request(served, server_sndbuf=32768)
    assert _body_of(await _read(sock, 0.004)) == served.body
    assert served.listener.idle_closed_total == 0
    sock.close()


@pytest.mark.parametrize("served", [(2 * 2**20, Outbox(deadline=1.0), 10.0)], indirect=True)
async def test_a_response_past_its_deadline_is_closed(served: Served) -> None:
    """A client that keeps reading, too slowly (~1 MB/s) for a 2 MiB body to end within the
    deadline (1 s), is cut there: it gets part of the body, counted ``deadline``."""
    sock = await _request(served, server_sndbuf=32768)
    got = _body_of(await _read(sock, 0.004))
    assert 0 < len(got) < len(served.body)
    assert served.outbox.closed_total[ConnectionClose.DEADLINE] == 1
    assert served.listener.idle_closed_total == 0
    sock.close()


@pytest.mark.parametrize("served", [(0, Outbox(), 10.0)], indirect=True)
async def test_metrics_leaves_in_slices_too(served: Served) -> None:
    """/metrics goes out through the same outbox: a stalled scrape of a large exposition
    waits with at most a slice."""
    stalled = await _request(served, "/metrics", server_sndbuf=32768)
    await until(lambda: any(served.waiting().values()), "the stalled scrape waiting")
    assert max(served.waiting().values()) <= SLICE_BYTES + HEADERS
    stalled.close()
