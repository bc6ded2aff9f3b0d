"""The door process's HTTP/2 server (door/server.py) under hostile callers speaking raw HTTP/2
(``support.h2_client``), in-process on a real Unix socket, with an honest grpc caller beside
each: every attack is held to its bound (counted by name), and costs the honest caller nothing.

The handler answers ``Echo`` with its request and ``Big`` with :data:`BIG` bytes; the bounds
are small so that each attack reaches them in moments.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import h2.errors
import h2.events
import pytest
from support.h2_client import RawH2, message
from support.waiting import until

from cuzkd.errors import GrpcError
from cuzkd.metrics.door_metrics import SERVER_BOUNDS
from cuzkd.supervisor.door.server import BOUNDS as BOUNDS_HELD
from cuzkd.supervisor.door.server import (
    CallContext,
    GrpcServer,
    ServerBounds,
    parse_timeout,
    percent_encoded,
)

SERVICE = "/cuzk.v1.ProvingEngine/"
BIG = 4 << 20
BOUNDS = ServerBounds(max_connections=40, max_streams=16, max_header_list_bytes=8 << 10,
                      max_message_bytes=64 << 20, request_bytes=48 << 20,
                      connection_request_bytes=16 << 20, reply_bytes=12 << 20,
                      preface_timeout=0.5, idle_timeout=30.0, reply_stall_timeout=1.0,
                      min_request_rate=64 << 10, request_stall_timeout=0.5,
                      resets_per_second=50)


@dataclasses.dataclass
class Served:
    server: GrpcServer
    address: str
    #: the calls whose handler ran, by method
    handled: Counter[str]


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, bounds: ServerBounds = BOUNDS) -> AsyncIterator[Served]:
    handled: Counter[str] = Counter()

    async def handler(path: str, request: bytes, context: CallContext) -> bytes:
        method = path.rpartition("/")[2]
        handled[method] += 1
        if method == "Echo":
            return request
        if method == "Size":
            return b"%d" % len(request)
        if method == "Big":
            return b"\x01" * BIG
        if method == "Slow":
            await asyncio.sleep(3600)
        raise GrpcError(grpc.StatusCode.UNIMPLEMENTED, f"no méthode {method}")

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "door.sock"))
    sock.listen(512)
    server = GrpcServer(handler, bounds)
    await server.serve(sock)
    try:
        yield Served(server, f"unix://{tmp_path}/door.sock", handled)
    finally:
        await server.close(0)
        sock.close()


class Honest:
    """A grpc caller making ``Echo`` calls of ``size`` bytes one after another on its own
    channel, until stopped; every outcome kept."""

    def __init__(self, address: str, size: int = 1 << 10) -> None:
        self.outcomes: Counter[str] = Counter()
        self._address, self._size = address, size
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async with grpc.aio.insecure_channel(self._address) as channel:
            echo = channel.unary_unary(SERVICE + "Echo")
            while True:
                try:
                    reply = await echo(b"h" * self._size, timeout=20)
                    self.outcomes["OK" if reply == b"h" * self._size else "WRONG"] += 1
                except grpc.aio.AioRpcError as exc:
                    self.outcomes[f"{exc.code().name}: {exc.details()}"] += 1

    async def finish(self, at_least: int = 5) -> Counter[str]:
        """Once it completed ``at_least`` more calls: stop; its outcomes."""
        done = self.outcomes["OK"]
        await until(lambda: self.outcomes["OK"] >= done + at_least or len(self.outcomes) > 1,
                    "the honest caller's calls")
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.outcomes


async def test_an_honest_call_is_answered_and_errors_are_grpc_statuses(tmp_path: Path) -> None:
    async with serving(tmp_path) as served, grpc.aio.insecure_channel(served.address) as ch:
        assert await ch.unary_unary(SERVICE + "Echo")(b"x" * (3 << 20), timeout=20) \
            == b"x" * (3 << 20)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ch.unary_unary(SERVICE + "Nope")(b"", timeout=20)
        assert failed.value.code() is grpc.StatusCode.UNIMPLEMENTED
        assert failed.value.details() == "no méthode Nope"
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await ch.unary_unary(SERVICE + "Slow")(b"", timeout=0.2)
        assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED


def test_grpc_timeouts_and_messages_are_spelled_as_grpc_spells_them() -> None:
    assert parse_timeout(b"250m") == pytest.approx(0.25)
    assert parse_timeout(b"3S") == 3.0 and parse_timeout(b"1H") == 3600.0
    assert parse_timeout(b"123456789S") is None and parse_timeout(b"") is None
    assert percent_encoded("100% é\n") == "100%25 %C3%A9%0A"


async def test_a_rapid_reset_flood_is_sent_away_and_runs_no_handler(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        honest = Honest(served.address)
        attacker = await RawH2.open(served.address)
        for _ in range(500):
            if attacker.closed:
                break
            stream = attacker.call("Echo", message(b"x"), end=False)
            attacker.reset(stream)
            await attacker.drain()
        goaway = await attacker.wait_for(h2.events.ConnectionTerminated)
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM  # type: ignore
        await attacker.wait_closed()
        assert set(await honest.finish()) == {"OK"}
    assert served.server.bounds_hit["rapid_reset"] == 1
    assert set(served.handled) == {"Echo"}  # the honest caller's alone


async def test_a_stream_flood_costs_the_flooder_its_connection_alone(tmp_path: Path) -> None:
    """3000 calls opened at once on one connection, none ended: past the 16 the server
    advertised, HTTP/2 is broken (h2 enforces the bound from the first frame), the connection
    is cut and counted, and no handler ran for it."""
    async with serving(tmp_path) as served:
        honest = Honest(served.address)
        attacker = await RawH2.open(served.address)
        for _ in range(3000):
            attacker.conn.send_headers(attacker.conn.get_next_available_stream_id(), [
                (":method", "POST"), (":scheme", "http"), (":path", SERVICE + "Echo"),
                (":authority", "x"), ("content-type", "application/grpc")])
        await attacker.drain()
        await attacker.wait_closed()
        assert set(await honest.finish()) == {"OK"}
    assert served.server.bounds_hit["streams"] == 1


async def test_calls_past_the_stream_bound_wait_in_the_honest_caller(tmp_path: Path) -> None:
    """200 calls at once on one grpc channel, with a bound of 16 streams a connection: grpc
    keeps the rest until a stream is free, and every call is answered."""
    async with serving(tmp_path) as served, \
            grpc.aio.insecure_channel(served.address) as channel:
        echo = channel.unary_unary(SERVICE + "Echo")
        replies = await asyncio.gather(*(echo(b"%d" % i, timeout=30) for i in range(200)))
    assert replies == [b"%d" % i for i in range(200)]
    assert served.server.bounds_hit["streams"] == 0


async def test_huge_metadata_is_refused_on_its_stream_or_ends_its_connection(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        honest = Honest(served.address)
        attacker = await RawH2.open(served.address)
        stream = attacker.call("Echo", message(b"x"), extra=[("x-junk", "j" * (12 << 10))])
        reset = await attacker.wait_for(h2.events.StreamReset, lambda e: e.stream_id == stream)
        assert reset.error_code == h2.errors.ErrorCodes.REFUSED_STREAM  # type: ignore
        # past what HPACK decodes at all (64 KiB): the whole connection goes, nothing else
        attacker.call("Echo", message(b"x"), extra=[("x-junk", "j" * (200 << 10))])
        await attacker.wait_closed()
        assert set(await honest.finish()) == {"OK"}
    assert served.server.bounds_hit["header_list"] == 1
    assert set(served.handled) == {"Echo"}


async def test_a_request_announced_and_never_sent_gives_its_bytes_back(tmp_path: Path) -> None:
    """Callers announce 60 MiB requests, send 15 MiB each and go silent: flow control holds
    what they may send within the request budgets, each stalled request is reset once it has
    not moved for request_stall_timeout, and the budget is whole again."""
    async with serving(tmp_path) as served:
        honest = Honest(served.address, size=256 << 10)
        attackers = [await RawH2.open(served.address, window=1 << 30) for _ in range(6)]
        streams = []
        for attacker in attackers:
            stream = attacker.call("Echo", b"", end=False)
            attacker.send(stream, message(b"z" * (15 << 20), declared=60 << 20))
            streams.append(stream)
        for attacker, stream in zip(attackers, streams, strict=True):
            await attacker.wait_for(h2.events.StreamReset, lambda e, s=stream: e.stream_id == s)
        assert set(await honest.finish()) == {"OK"}
        # the honest caller was stopped mid-call: its reset reaches the server in its time
        await until(lambda: served.server.request_budget.used == 0, "the budget given back")
    assert served.server.bounds_hit["request_stall"] == len(attackers)


async def test_calls_that_together_pass_the_request_budgets_all_finish(tmp_path: Path) -> None:
    """Six 6 MiB calls at once on each of three connections: each connection passes its own
    16 MiB budget and together they pass the 48 MiB one. Past a budget only the oldest request
    moves, so they finish one by one instead of each holding bytes the others wait for; a
    small caller beside them is served, and nobody is reset for being held (a stall is
    judged from the moment a held request may move again: 2 s here, for a loaded host)."""
    bounds = dataclasses.replace(BOUNDS, request_stall_timeout=2.0)
    async with serving(tmp_path, bounds) as served:
        honest = Honest(served.address)

        async def six_at_once() -> list[bytes]:
            async with grpc.aio.insecure_channel(served.address) as channel:
                size = channel.unary_unary(SERVICE + "Size")
                return list(await asyncio.gather(*(size(bytes([i]) * (6 << 20), timeout=60)
                                                   for i in range(6))))

        assert await asyncio.gather(*(six_at_once() for _ in range(3))) \
            == [[b"%d" % (6 << 20)] * 6] * 3
        assert set(await honest.finish()) == {"OK"}
        await until(lambda: served.server.request_budget.used == 0, "the budget given back")
    assert served.server.bounds_hit["request_bytes"] >= 1
    assert served.server.bounds_hit["request_stall"] == 0


async def test_held_calls_past_what_is_kept_for_them_are_refused_unprocessed(
        tmp_path: Path) -> None:
    """Sixteen 4 MiB calls at once on one connection past its 16 MiB budget, against 2 MiB
    kept for held calls: each held call may send its window before it knows, so past the
    2 MiB the newest held calls of that connection are refused ``REFUSED_STREAM`` (grpc:
    UNAVAILABLE, never processed); the others finish, the caller on another connection is
    not touched, and the budgets are whole again."""
    bounds = dataclasses.replace(BOUNDS, held_request_bytes=2 << 20,
                                 request_stall_timeout=2.0)
    async with serving(tmp_path, bounds) as served:
        honest = Honest(served.address)
        async with grpc.aio.insecure_channel(served.address, options=[
                ("grpc.use_local_subchannel_pool", 1)]) as channel:  # a connection of its own
            size = channel.unary_unary(SERVICE + "Size")
            replies = await asyncio.gather(*(size(bytes([i]) * (4 << 20), timeout=60)
                                             for i in range(16)), return_exceptions=True)
        refused = [r for r in replies if isinstance(r, grpc.aio.AioRpcError)]
        assert refused and len(refused) < 16
        assert {(r.code(), "error code 7" in (r.details() or "")) for r in refused} \
            == {(grpc.StatusCode.UNAVAILABLE, True)}
        assert all(r == b"%d" % (4 << 20) for r in replies if isinstance(r, bytes))
        assert set(await honest.finish()) == {"OK"}
        await until(lambda: served.server.request_budget.used == 0, "the budget given back")
        assert served.server.request_budget.held == 0
    assert served.server.bounds_hit["request_stall"] == 0


async def test_replies_nobody_reads_are_reset_and_the_budget_given_back(tmp_path: Path) -> None:
    """Callers whose window stays shut ask for 4 MiB replies: past the 12 MiB reply budget
    the stalest is reset, the rest once they stall; honest replies go on."""
    async with serving(tmp_path) as served:
        honest = Honest(served.address)
        readers = [await RawH2.open(served.address, window=0) for _ in range(5)]
        streams = [(r, r.call("Big", message(b""))) for r in readers]
        for reader, stream in streams:
            await reader.wait_for(h2.events.StreamReset, lambda e, s=stream: e.stream_id == s)
        assert set(await honest.finish()) == {"OK"}
        await until(lambda: served.server.reply_budget.used == 0, "the budget given back")
    assert served.server.bounds_hit["reply_bytes"] + served.server.bounds_hit["reply_stall"] \
        >= len(readers)


async def test_silent_connections_do_not_keep_callers_out(tmp_path: Path) -> None:
    """300 connections that never say a word, against a bound of 40: at the bound the idlest
    is sent away to make room, any other closed after the preface timeout; the honest caller
    is served meanwhile, and every silent one is closed in the end."""
    async with serving(tmp_path) as served:
        silent = [await asyncio.open_unix_connection(str(tmp_path / "door.sock"))
                  for _ in range(300)]
        honest = Honest(served.address)
        assert set(await honest.finish()) == {"OK"}
        # each is told SETTINGS (and perhaps GOAWAY), then closed: read to its end
        await asyncio.gather(*(asyncio.wait_for(reader.read(), 30) for reader, _ in silent))
        for _, writer in silent:
            writer.close()
        await until(lambda: served.server.connections == 0, "every connection gone")
    hit = served.server.bounds_hit
    assert hit["preface_timeout"] + hit["connections"] >= 300


async def test_a_message_over_the_size_bound_is_refused_before_it_is_received(
        tmp_path: Path) -> None:
    """A request declaring 100 MiB against a 64 MiB bound is refused RESOURCE_EXHAUSTED at
    its prefix, as grpc refuses it: its bytes are never taken, its handler never runs."""
    async with serving(tmp_path) as served:
        attacker = await RawH2.open(served.address)
        stream = attacker.call("Echo", message(b"x" * 1000, declared=100 << 20), end=False)
        await until(lambda: attacker.ended(stream), "the refusal")
        assert attacker.status(stream) == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        assert served.server.request_budget.used == 0
    assert served.server.bounds_hit["message_size"] == 1
    assert not served.handled


async def test_an_idle_connection_is_told_goaway_and_a_new_call_opens_another(
        tmp_path: Path) -> None:
    bounds = dataclasses.replace(BOUNDS, idle_timeout=0.3)
    async with serving(tmp_path, bounds) as served, \
            grpc.aio.insecure_channel(served.address) as channel:
        echo = channel.unary_unary(SERVICE + "Echo")
        assert await echo(b"1", timeout=20) == b"1"
        await until(lambda: served.server.bounds_hit["idle"], "the idle GOAWAY")
        assert await echo(b"2", timeout=20) == b"2"


def test_every_bound_the_server_holds_has_its_series() -> None:
    assert (*BOUNDS_HELD, "request_id") == SERVER_BOUNDS


async def test_a_frame_longer_than_http2_allows_ends_its_connection_at_its_header(
        tmp_path: Path) -> None:
    """A DATA frame header claiming 16 MiB, then its bytes trickling: refused on the 9-byte
    header (h2 would hold it whole first), not after 16 MiB of it is held."""
    async with serving(tmp_path) as served:
        honest = Honest(served.address)
        attacker = await RawH2.open(served.address)
        stream = attacker.call("Echo", b"", end=False)
        attacker.raw(((16 << 20) - 1).to_bytes(3, "big") + b"\\x00\\x00" + stream.to_bytes(4, "big")
                     + b"z" * 1000)
        await attacker.wait_closed()
        assert set(await honest.finish()) == {"OK"}
    assert served.server.bounds_hit["frame_size"] == 1
