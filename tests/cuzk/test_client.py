"""The GetStatus client against real gRPC servers: the stand-in, and servers that misbehave.
Whatever the engine does, a read returns a reading (``unknown`` with a reason), in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.client import read_queues
from cuzkd.cuzk.reading import KindQueue


async def serve(tmp_path: Path, handler: Callable[..., Any],
                serializer: Callable[[Any], bytes] = lambda m: m.SerializeToString()
                ) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    method = grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=pb.GetStatusRequest.FromString,
        response_serializer=serializer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "cuzk.v1.ProvingEngine", {"GetStatus": method}),))
    address = f"unix://{tmp_path}/cuzk.sock"
    server.add_insecure_port(f"unix:{tmp_path}/cuzk.sock")
    await server.start()
    return server, address


@pytest.fixture
async def servers() -> AsyncIterator[list[grpc.aio.Server]]:
    started: list[grpc.aio.Server] = []
    yield started
    for server in started:
        await server.stop(None)


async def test_a_reading_normalises_kinds_and_sums_repeated_entries(
        tmp_path: Path, servers: list[grpc.aio.Server]) -> None:
    async def answer(request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        reply = pb.GetStatusResponse(total_proofs_completed=7, total_proofs_failed=1)
        reply.queues.add(proof_kind="porep_c2", pending=2, in_progress=1)
        reply.queues.add(proof_kind="porep-c2", pending=1, in_progress=0)
        reply.queues.add(proof_kind="window_post", pending=0, in_progress=1)
        reply.queues.add(proof_kind="mystery_kind", pending=5, in_progress=0)
        reply.gpus.add(ordinal=0, current_job_id="wdpost-1-[0 1] dl 3")
        reply.gpus.add(ordinal=0, current_job_id="")
        return reply

    server, address = await serve(tmp_path, answer)
    servers.append(server)
    reading = await read_queues(address, timeout=5)
    assert reading.known and reading.holds_work
    assert dict(reading.queues) == {"porep-c2": KindQueue(3, 1), "window-post": KindQueue(0, 1),
                                    "other": KindQueue(5, 0)}
    assert reading.current_jobs == ("wdpost-1-[0 1] dl 3",)
    assert (reading.total_completed, reading.total_failed) == (7, 1)


async def test_nothing_listening_is_unknown_at_once(tmp_path: Path) -> None:
    began = time.monotonic()
    reading = await read_queues(f"unix://{tmp_path}/absent.sock", timeout=5)
    assert not reading.known and reading.holds_work
    assert "UNAVAILABLE" in reading.error
    assert time.monotonic() - began < 4


async def test_an_engine_that_never_answers_is_unknown_after_the_timeout(
        tmp_path: Path, servers: list[grpc.aio.Server]) -> None:
    async def hang(request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    server, address = await serve(tmp_path, hang)
    servers.append(server)
    began = time.monotonic()
    reading = await read_queues(address, timeout=0.3)
    assert "DEADLINE_EXCEEDED" in reading.error
    assert time.monotonic() - began < 3


@pytest.mark.parametrize("reply", [b"\xff\xff\xff", b"\x1a\x05\x0a\x03"])  # not protobuf; cut
async def test_a_reply_that_does_not_decode_is_unknown(
        tmp_path: Path, servers: list[grpc.aio.Server], reply: bytes) -> None:
    async def garbage(request: pb.GetStatusRequest, context: Any) -> bytes:
        return reply

    server, address = await serve(tmp_path, garbage, serializer=lambda raw: raw)
    servers.append(server)
    reading = await read_queues(address, timeout=5)
    assert not reading.known and reading.error


async def test_a_huge_reply_is_refused_not_read(tmp_path: Path,
                                                servers: list[grpc.aio.Server]) -> None:
    async def huge(request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        reply = pb.GetStatusResponse()
        for n in range(40_000):
            reply.gpus.add(ordinal=n, name="x" * 64)
        return reply

    server, address = await serve(tmp_path, huge)
    servers.append(server)
    reading = await read_queues(address, timeout=5)
    assert "RESOURCE_EXHAUSTED" in reading.error


@pytest.mark.parametrize("address", ["", "unix://", "dns:///no such host:1", "\x00"])
async def test_an_address_grpc_refuses_is_unknown_not_a_crash(address: str) -> None:
    reading = await read_queues(address, timeout=0.5)
    assert not reading.known
