"""The bundled engine's cuzk gRPC face: in-process on a real Unix socket, and one real
``cuzkd engine --grpc-listen`` process (the flag, the socket's mode, replies through a drain)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.bundled_inprocess import make_engine
from support.live import promtool_check_metrics
from support.waiting import wait_until

from cuzkd.bundled.grpcface import (
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_ID_CHARS,
    ProvingFace,
    check_grpc_listen,
    start_grpc,
)
from cuzkd.bundled.pipeline import Engine
from cuzkd.bundled.settings import Sizes
from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.telemetry import outcomes_of
from cuzkd.errors import EX_UNAVAILABLE, EX_USAGE, ListenError
from cuzkd.units import parse_listen

SMALL = Sizes(porep_c2=10, snap_update=10, window_post=11, winning_post=10)
#: cuzk's enum for each kind, and the proofs a whole job of it carries (PoSt: one, whole)
KINDS = {pb.POREP_SEAL_COMMIT: ("porep-c2", 10), pb.SNAP_DEALS_UPDATE: ("snap-update", 16),
         pb.WINDOW_POST_PARTITION: ("window-post", 1), pb.WINNING_POST: ("winning-post", 1)}
SERVICE = "/cuzk.v1.ProvingEngine/"


class Client:
    """Typed calls of cuzk's methods over one channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    async def call(self, method: str, request: Any, reply: Any, **kw: Any) -> Any:
        stub = self.channel.unary_unary(SERVICE + method,
                                        request_serializer=type(request).SerializeToString,
                                        response_deserializer=reply.FromString)
        return await stub(request, timeout=30, **kw)

    async def prove(self, kind: int, request_id: str = "", **kw: Any) -> pb.AwaitProofResponse:
        reply = await self.call("Prove", pb.ProveRequest(submit=pb.SubmitProofRequest(
            request_id=request_id, proof_kind=kind)), pb.ProveResponse, **kw)
        return reply.result

    async def submit(self, kind: int, request_id: str) -> pb.SubmitProofResponse:
        return await self.call("SubmitProof", pb.SubmitProofRequest(
            request_id=request_id, proof_kind=kind), pb.SubmitProofResponse)

    async def await_proof(self, job_id: str) -> pb.AwaitProofResponse:
        return await self.call("AwaitProof", pb.AwaitProofRequest(job_id=job_id),
                               pb.AwaitProofResponse)

    async def status(self, **kw: Any) -> pb.GetStatusResponse:
        return await self.call("GetStatus", pb.GetStatusRequest(), pb.GetStatusResponse, **kw)

    async def raw(self, method: str, body: bytes) -> bytes:
        reply: bytes = await self.channel.unary_unary(SERVICE + method)(body, timeout=30)
        return reply


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for sockets (a Unix socket path has at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cuzkd-grpc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def served(sock_dir: Path) -> AsyncIterator[tuple[Engine, Client]]:
    engine = make_engine(256 << 20, sizes=SMALL)
    await engine.start()
    server, address = await start_grpc(engine, f"unix://{sock_dir}/g.sock")
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            yield engine, Client(channel)
    finally:
        await server.stop(0)
        await engine.close()


def queue(reply: pb.GetStatusResponse, kind: str) -> tuple[int, int]:
    (entry,) = [q for q in reply.queues if q.proof_kind == kind]
    return entry.pending, entry.in_progress


async def test_a_prove_of_each_kind_completes_with_its_proofs_and_measured_timings(
        served: tuple[Engine, Client]) -> None:
    engine, client = served
    for kind, (name, proofs) in KINDS.items():
        result = await client.prove(kind, f"{name}-[1 2]")  # PoSt ids have brackets, spaces
        assert result.status == pb.AwaitProofResponse.COMPLETED, result.error_message
        assert result.job_id == f"{name}-[1 2]"
        assert len(json.loads(result.proof)) == proofs  # partitions, or PoSt proved whole
        assert result.gpu_compute_ms > 0 and result.srs_load_ms == 0
        assert result.total_ms >= max(result.queue_wait_ms, result.synthesis_ms,
                                      result.gpu_compute_ms)
    # the HTTP API's pipeline proved them: its /status counted every kind
    assert engine.tracker.snapshot().counters.completed_by_kind == {
        name: 1 for name, _ in KINDS.values()}


async def test_submit_then_await_and_a_retry_of_an_open_request_joins_it(
        served: tuple[Engine, Client]) -> None:
    engine, client = served
    submitted = await client.submit(pb.SNAP_DEALS_UPDATE, "snap-1000-7")
    assert submitted.job_id == "snap-1000-7"
    retry = asyncio.create_task(client.prove(pb.SNAP_DEALS_UPDATE, "snap-1000-7"))
    with pytest.raises(grpc.aio.AioRpcError) as other_kind:
        await client.prove(pb.POREP_SEAL_COMMIT, "snap-1000-7")
    assert other_kind.value.code() == grpc.StatusCode.ALREADY_EXISTS
    first = await client.await_proof("snap-1000-7")
    assert first.status == pb.AwaitProofResponse.COMPLETED
    assert (await retry).proof == first.proof
    assert len(engine.jobs) == 1  # proved once
    again = await client.prove(pb.SNAP_DEALS_UPDATE, "snap-1000-7")  # finished: proves anew
    assert again.status == pb.AwaitProofResponse.COMPLETED and len(engine.jobs) == 2


async def test_queue_position_is_the_schedulers_order_priority_first(
        served: tuple[Engine, Client]) -> None:
    engine, _ = served
    face = ProvingFace(engine)  # called directly: no scheduler turn between the submissions

    async def position(kind: int, priority: int) -> int:
        reply = await face.submit_proof(pb.SubmitProofRequest(
            proof_kind=kind, priority=priority).SerializeToString())
        return reply.queue_position

    assert [await position(pb.SNAP_DEALS_UPDATE, pb.NORMAL) for _ in range(3)] == [0, 1, 2]
    assert await position(pb.WINNING_POST, pb.CRITICAL) == 0
    assert await position(pb.POREP_SEAL_COMMIT, pb.PRIORITY_UNSPECIFIED) == 4


async def test_await_of_an_unknown_job_is_not_found(served: tuple[Engine, Client]) -> None:
    _, client = served
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.await_proof("porep-1000-1")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_get_status_queues_move_while_a_burst_runs_and_metrics_count_it(
        served: tuple[Engine, Client]) -> None:
    engine, client = served
    for n in range(4):
        await client.submit(pb.SNAP_DEALS_UPDATE, f"snap-{n}")
    busy = await client.status()
    assert sum(queue(busy, "snap-update")) == 4 and queue(busy, "porep-c2") == (0, 0)
    assert len(busy.gpus) == len(engine.workers)  # one entry per GPU worker, as cuzk
    for n in range(4):
        assert (await client.await_proof(f"snap-{n}")).status == pb.AwaitProofResponse.COMPLETED
    done = await client.status()
    assert queue(done, "snap-update") == (0, 0) and done.total_proofs_completed == 4
    text = (await client.call("GetMetrics", pb.GetMetricsRequest(),
                              pb.GetMetricsResponse)).prometheus_text
    assert promtool_check_metrics(text) == ""
    assert outcomes_of(text).completed["snap-update"] == 4  # what the supervisor reads


def not_utf8_request_id() -> bytes:
    """A ProveRequest whose submit's request_id (field 1, a string) is not UTF-8."""
    submit = b"\x0a\x02\xff\xfe" + b"\x10\x04"  # request_id, then proof_kind = WINNING_POST
    return b"\x0a" + bytes([len(submit)]) + submit


@pytest.mark.parametrize(("body", "code"), [
    (b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT),
    (not_utf8_request_id(), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.ProveRequest(submit=pb.SubmitProofRequest(request_id="x")).SerializeToString(),
     grpc.StatusCode.INVALID_ARGUMENT),
    (pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id="x" * (MAX_REQUEST_ID_CHARS + 1), proof_kind=pb.WINNING_POST)
    ).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.ProveRequest(submit=pb.SubmitProofRequest(proof_kind=pb.WINNING_POST, priority=99)
                     ).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT),
    (bytes(MAX_MESSAGE_BYTES + 1), grpc.StatusCode.RESOURCE_EXHAUSTED),
], ids=["no-protobuf", "request-id-not-utf8", "no-proof-kind", "request-id-too-long",
        "unknown-priority", "over-128-MiB"])
async def test_a_bad_request_gets_a_status_and_the_engine_proves_on(
        served: tuple[Engine, Client], body: bytes, code: grpc.StatusCode) -> None:
    engine, client = served
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.raw("Prove", body)
    assert err.value.code() == code
    assert not engine.jobs
    assert (await client.prove(pb.WINNING_POST)).status == pb.AwaitProofResponse.COMPLETED


async def test_a_draining_engine_refuses_new_proofs_as_unavailable(
        served: tuple[Engine, Client]) -> None:
    engine, client = served
    engine.begin_drain(5.0, "test")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.prove(pb.WINNING_POST, "winning-1")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("listen", ["unix:/one/slash", "unix://relative/g.sock", "engine",
                                    "unix:///a\0b", "127.0.0.1:99999"])
def test_a_grpc_listen_that_is_no_address_is_a_usage_error(listen: str) -> None:
    with pytest.raises(ListenError) as err:
        check_grpc_listen(listen)
    assert err.value.exit_code == EX_USAGE and "--grpc-listen" in str(err.value)


def test_the_http_apis_socket_is_no_grpc_listen() -> None:
    with pytest.raises(ListenError) as err:
        check_grpc_listen("unix:///run/e.sock", parse_listen("unix:/run/e.sock"))
    assert err.value.exit_code == EX_USAGE and "--listen socket" in str(err.value)


async def test_a_grpc_port_in_use_is_refused_not_shared(served: tuple[Engine, Client]) -> None:
    engine, _ = served
    first, address = await start_grpc(engine, "127.0.0.1:0")
    try:
        with pytest.raises(ListenError) as err:
            await start_grpc(engine, address)
        assert err.value.exit_code == EX_UNAVAILABLE
    finally:
        await first.stop(0)


def test_a_real_engine_serves_grpc_privately_and_answers_a_proof_a_stop_drains(
        sock_dir: Path) -> None:
    config = sock_dir / "engine.toml"
    config.write_text('synthesis_rounds = 400\n[sizes]\nwindow-post = 14\n')
    grpc_sock = sock_dir / "g.sock"
    with (sock_dir / "log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cuzkd", "engine", "--config", str(config),
             "--listen", f"unix:{sock_dir}/http.sock", "--grpc-listen", f"unix://{grpc_sock}"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        with grpc.insecure_channel(f"unix://{grpc_sock}") as channel:
            prove = channel.unary_unary(SERVICE + "Prove",
                                        request_serializer=pb.ProveRequest.SerializeToString,
                                        response_deserializer=pb.ProveResponse.FromString)
            status = channel.unary_unary(SERVICE + "GetStatus",
                                         request_serializer=pb.GetStatusRequest.SerializeToString,
                                         response_deserializer=pb.GetStatusResponse.FromString)
            proof = prove.future(pb.ProveRequest(submit=pb.SubmitProofRequest(
                request_id="wdpost-[0]", proof_kind=pb.WINDOW_POST_PARTITION)),
                timeout=60, wait_for_ready=True)
            wait_until(lambda: sum(queue(status(pb.GetStatusRequest(), timeout=10,
                                                wait_for_ready=True), "window-post")),
                       20, "the engine holding the WindowPoSt proof")
            assert stat.S_IMODE(grpc_sock.stat().st_mode) == 0o600
            proc.send_signal(signal.SIGTERM)  # a drain: the proof accepted is finished
            result = proof.result().result
        assert result.status == pb.AwaitProofResponse.COMPLETED, result.error_message
        assert proc.wait(30) == 0
        assert not grpc_sock.exists()
        events = [json.loads(line) for line in (sock_dir / "log").read_text().splitlines()]
        (draining,) = [e for e in events if e["event"] == "engine_draining"]
        assert draining["open_jobs"] == 1  # the stop came while the engine proved it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
