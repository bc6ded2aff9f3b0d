"""The gRPC client (GetStatus for the drain, GetStatus + GetMetrics for the telemetry) against
real gRPC servers that misbehave. Whatever the engine does, a read returns in time, with a
bounded reason when it told nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.cuzk_grpc import serve

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.client import read_queues, read_telemetry
from cuzkd.cuzk.reading import KindQueue
from cuzkd.cuzk.telemetry import MAX_GPUS, GpuReading, Outcomes, gpus_of


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


# -- the telemetry read: GetStatus and GetMetrics ------------------------------------------

METRICS_TEXT = """# TYPE cuzk_proofs_completed_total counter
cuzk_proofs_completed_total 12
# TYPE cuzk_proofs_completed counter
cuzk_proofs_completed{proof_kind="porep_c2"} 7
cuzk_proofs_completed{proof_kind="window_post"} 4
cuzk_proofs_completed{proof_kind="mystery"} 1
# TYPE cuzk_proofs_failed counter
cuzk_proofs_failed{proof_kind="winning_post"} 2
cuzk_proofs_failed{proof_kind="winning-post"} 1
# TYPE cuzk_proof_duration_seconds summary
cuzk_proof_duration_seconds{quantile="0.5"} 3.5
cuzk_proof_duration_seconds_count 12
"""


def status_with_post() -> pb.GetStatusResponse:
    """Two workers on GPU 0 (one proving a WindowPoSt), one on GPU 1 proving PoRep."""
    reply = pb.GetStatusResponse()
    reply.gpus.add(ordinal=0, name="NVIDIA H100", vram_total_bytes=80 << 30,
                   vram_free_bytes=30 << 30, current_job_id="wdpost-1-[0 1] dl 3",
                   current_proof_kind="window_post")
    reply.gpus.add(ordinal=0, name="NVIDIA H100", vram_total_bytes=80 << 30,
                   vram_free_bytes=30 << 30)
    reply.gpus.add(ordinal=1, name="NVIDIA L4", vram_total_bytes=24 << 30,
                   vram_free_bytes=4 << 30, current_job_id="porep-1-2",
                   current_proof_kind="porep_c2")
    reply.queues.add(proof_kind="window_post", pending=1, in_progress=1)
    reply.queues.add(proof_kind="porep_c2", pending=3, in_progress=1)
    return reply


async def serve_post(tmp_path: Path, servers: list[grpc.aio.Server], text: str) -> str:
    """A server answering :func:`status_with_post` and GetMetrics ``text``; its address."""
    async def status(request: Any, context: Any) -> pb.GetStatusResponse:
        return status_with_post()

    async def metrics(request: Any, context: Any) -> pb.GetMetricsResponse:
        return pb.GetMetricsResponse(prometheus_text=text)

    server, address = await serve(tmp_path, status, metrics=metrics)
    servers.append(server)
    return address


async def test_telemetry_reads_every_kind_per_gpu_and_by_kind(
        tmp_path: Path, servers: list[grpc.aio.Server]) -> None:
    telemetry = await read_telemetry(await serve_post(tmp_path, servers, METRICS_TEXT),
                                     timeout=5)
    assert telemetry.failures == ()
    assert telemetry.queues == {"window-post": KindQueue(1, 1), "porep-c2": KindQueue(3, 1)}
    assert telemetry.gpus == (
        GpuReading(0, "NVIDIA H100", 80 << 30, 30 << 30, {"window-post": 1}),
        GpuReading(1, "NVIDIA L4", 24 << 30, 4 << 30, {"porep-c2": 1}))
    assert telemetry.outcomes == Outcomes(
        completed={"porep-c2": 7, "window-post": 4, "other": 1}, failed={"winning-post": 3})


async def hang(request: Any, context: Any) -> pb.GetStatusResponse:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def huge(request: Any, context: Any) -> pb.GetStatusResponse:
    reply = pb.GetStatusResponse()
    for n in range(40_000):
        reply.gpus.add(ordinal=n, name="x" * 64)
    return reply


async def refuse(request: Any, context: Any) -> pb.GetStatusResponse:
    await context.abort(grpc.StatusCode.INTERNAL, "engine bug")
    raise AssertionError("unreachable")


async def garbage(request: Any, context: Any) -> bytes:
    return b"\xff\xff\xff"


@pytest.mark.parametrize(("handler", "reason"), [
    (hang, "timeout"), (huge, "too_large"), (refuse, "error_status"), (garbage, "undecodable"),
])
async def test_a_getstatus_that_tells_nothing_is_one_bounded_failure_in_time(
        tmp_path: Path, servers: list[grpc.aio.Server], handler: Callable[..., Any],
        reason: str) -> None:
    metrics_asked = asyncio.Event()

    async def metrics(request: Any, context: Any) -> pb.GetMetricsResponse:
        metrics_asked.set()
        return pb.GetMetricsResponse(prometheus_text=METRICS_TEXT)

    serializer = (lambda raw: raw) if handler is garbage else (lambda m: m.SerializeToString())
    server, address = await serve(tmp_path, handler, serializer, metrics=metrics)
    servers.append(server)
    began = time.monotonic()
    telemetry = await read_telemetry(address, timeout=0.5)
    assert time.monotonic() - began < 3
    assert [f.reason for f in telemetry.failures] == [reason]
    assert address in telemetry.failures[0].message
    assert telemetry.queues is None and telemetry.gpus is None and telemetry.outcomes is None
    assert not metrics_asked.is_set()  # a dead GetStatus is not waited for twice


async def test_a_listener_that_resets_every_connection_is_unavailable(tmp_path: Path) -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()

    listener = await asyncio.start_unix_server(reset, path=str(tmp_path / "reset.sock"))
    async with listener:
        telemetry = await read_telemetry(f"unix://{tmp_path}/reset.sock", timeout=2)
    assert [f.reason for f in telemetry.failures] == ["unavailable"]
    missing = await read_telemetry(f"unix://{tmp_path}/absent.sock", timeout=2)
    assert [f.reason for f in missing.failures] == ["unavailable"]
    refused = await read_telemetry("\x00", timeout=0.5)
    assert refused.queues is None and len(refused.failures) == 1


@pytest.mark.parametrize("text", [
    "<html><body>502 Bad Gateway</body></html>",
    "cuzk_proofs_failed{proof_kind=\"porep_c2\"} -1\n",
    "cuzk_proofs_completed{proof_kind=\"porep_c2\"} NaN\n",
    "cuzk_proofs_completed{proof_kind=\"porep_c2\" 3\n",
    "\x00\xff\x7f binary",
])
async def test_metrics_text_that_is_not_exposition_costs_only_the_outcomes(
        tmp_path: Path, servers: list[grpc.aio.Server], text: str) -> None:
    telemetry = await read_telemetry(await serve_post(tmp_path, servers, text), timeout=5)
    assert [f.reason for f in telemetry.failures] == ["bad_metrics_text"]
    assert telemetry.outcomes is None
    assert telemetry.queues == {"window-post": KindQueue(1, 1), "porep-c2": KindQueue(3, 1)}


async def test_an_engine_without_getmetrics_still_has_its_queues(
        tmp_path: Path, servers: list[grpc.aio.Server]) -> None:
    async def status(request: Any, context: Any) -> pb.GetStatusResponse:
        return status_with_post()

    server, address = await serve(tmp_path, status)
    servers.append(server)
    telemetry = await read_telemetry(address, timeout=5)
    assert [f.reason for f in telemetry.failures] == ["error_status"]
    assert "UNIMPLEMENTED" in telemetry.failures[0].message
    assert telemetry.queues is not None and telemetry.outcomes is None


def test_a_reading_keeps_a_bounded_number_of_gpus_whatever_the_reply_lists() -> None:
    entries = [(n, "g", 1, 1, "window_post") for n in range(100_000)]
    gpus = gpus_of([*entries, (0, "again", 2, 2, "mystery")])
    assert len(gpus) == MAX_GPUS
    assert gpus[0] == GpuReading(0, "g", 1, 1, {"window-post": 1, "other": 1})
