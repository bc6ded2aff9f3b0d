"""The cuzk stand-in behaves as the real cuzk does where cuzkd depends on it.

Real processes and real signals: these are the facts (bytes on the wire, what SIGINT and SIGTERM
do, the exit codes) that the cuzk drain and the exit causes are built on.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from support.cuzk_load import channel_to, prove
from support.cuzk_standin import NVIDIA_SMI_SECS, SCRIPT, parse_budget, write_cuzk_toml
from support.ports import free_port
from support.waiting import wait_until

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.client import read_telemetry
from cuzkd.cuzk.telemetry import Outcomes

TOP_LEVEL = ["uptime_secs", "memory", "synthesis", "pipelines", "gpu_workers", "allocations",
             "counters", "buffers"]


class StandIn:
    def __init__(self, tmp: Path, env: dict[str, str] | None = None, extra: str = "",
                 args: list[str] | None = None) -> None:
        self.port = free_port()
        self.listen = f"unix://{tmp}/cuzk.sock"
        config = write_cuzk_toml(tmp / "cuzk.toml", self.listen, f"127.0.0.1:{self.port}", extra)
        self.stdout = tmp / "stdout"
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "-c", str(config), *(args or [])],
            stdout=self.stdout.open("wb"), stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})})

    def ready(self) -> None:
        wait_until(lambda: "status endpoint listening" in self.stdout.read_text(), 20,
                   "the stand-in's listeners")

    def raw(self, request: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(request)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    def status(self) -> dict[str, object]:
        body = self.raw(b"GET /status HTTP/1.1\r\n\r\n").partition(b"\r\n\r\n")[2]
        return dict(json.loads(body))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        assert self.proc.stderr is not None
        self.proc.stderr.close()


Start = Callable[[dict[str, str]], StandIn]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Starts one stand-in with these knobs, ready; it is killed after the test."""
    started: list[StandIn] = []

    def start_one(env: dict[str, str]) -> StandIn:
        engine = StandIn(tmp_path, env=env)
        started.append(engine)
        engine.ready()
        return engine

    yield start_one
    for engine in started:
        engine.stop()


@pytest.fixture
def standin(start: Start) -> StandIn:
    return start({})


def test_status_bytes_and_headers_are_cuzks(standin: StandIn) -> None:
    answer = standin.raw(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n") == [
        b"HTTP/1.1 200 OK", b"Content-Type: application/json",
        f"Content-Length: {len(body)}".encode(), b"Access-Control-Allow-Origin: *",
        b"Connection: close"]
    assert b" " not in body  # compact JSON
    assert list(json.loads(body)) == TOP_LEVEL
    assert standin.raw(b"GET /statusfoo HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200 OK")
    for other in (b"HEAD /status HTTP/1.1\r\n\r\n", b"GET /metrics HTTP/1.1\r\n\r\n"):
        assert standin.raw(other) == (
            b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 14\r\n"
            b"Connection: close\r\n\r\n404 Not Found\n")


async def get_status(listen: str) -> pb.GetStatusResponse:
    async with channel_to(listen) as channel:
        call = channel.unary_unary("/cuzk.v1.ProvingEngine/GetStatus",
                                   request_serializer=pb.GetStatusRequest.SerializeToString,
                                   response_deserializer=pb.GetStatusResponse.FromString)
        reply: pb.GetStatusResponse = await call(pb.GetStatusRequest(), timeout=5)
        return reply


def queues(reply: pb.GetStatusResponse) -> dict[str, tuple[int, int]]:
    return {q.proof_kind: (q.pending, q.in_progress) for q in reply.queues}


async def test_first_sigint_strands_undispatched_partitions_and_never_exits(
        start: Start) -> None:
    # "auto" on a 20 GiB host: two synthesis slots, a 10-partition job goes 2 at a time
    standin = start({"CUZK_STANDIN_SYNTH_SECS": "0.4", "CUZK_STANDIN_MEMTOTAL": str(20 << 30)})
    async with channel_to(standin.listen) as channel:
        job = asyncio.create_task(prove(channel, "porep-c2", "porep-1000-1"))
        await asyncio.to_thread(wait_until, lambda: standin.status()["pipelines"], 10, "the job")
        standin.proc.send_signal(signal.SIGINT)
        await asyncio.to_thread(wait_until,
                                lambda: "received SIGINT, shutting down" in
                                standin.stdout.read_text(), 10, "the SIGINT line")

        def settled() -> list[str] | None:
            states = [p["state"] for p in standin.status()["pipelines"][0]["partitions"]]
            return states if not {"synthesizing", "synth_done", "gpu"} & set(states) else None

        states = await asyncio.to_thread(wait_until, settled, 10, "dispatched partitions done")
        assert "pending" in states  # never dispatched, never finished
        standin.proc.send_signal(signal.SIGINT)  # later SIGINTs are ignored
        assert queues(await get_status(standin.listen))["porep_c2"] == (0, 1)
        assert standin.proc.poll() is None
        assert not job.done()
        job.cancel()
    standin.proc.send_signal(signal.SIGTERM)
    assert standin.proc.wait(10) == -signal.SIGTERM


def test_sighup_kills_at_once(standin: StandIn) -> None:
    standin.proc.send_signal(signal.SIGHUP)
    assert standin.proc.wait(10) == -signal.SIGHUP


async def test_failed_synthesis_is_left_behind(start: Start) -> None:
    standin = start({"CUZK_STANDIN_FAIL": "snap-1000-7:3", "CUZK_STANDIN_SYNTH_SECS": "0.05"})
    async with channel_to(standin.listen) as channel:
        sent = await prove(channel, "snap-update", "snap-1000-7")
    assert sent.outcome == "failed"
    document = standin.status()
    (job,) = document["pipelines"]
    assert job["job_id"] == "snap-1000-7"
    assert job["partitions"][3]["state"] == "failed"
    assert document["counters"]["total_failed"] == 0
    assert document["synthesis"]["active"] == 1  # the failed synthesis is never counted off
    reply = await get_status(standin.listen)
    assert reply.total_proofs_failed == 1
    assert queues(reply)["snap_update"] == (0, 0)
    telemetry = await read_telemetry(standin.listen, timeout=5)  # GetMetrics counts it by kind
    assert telemetry.outcomes == Outcomes(completed={}, failed={"snap-update": 1})


async def test_post_is_proved_whole_and_only_grpc_sees_it(start: Start) -> None:
    standin = start({"CUZK_STANDIN_POST_SECS": "5"})
    async with channel_to(standin.listen) as channel:
        job = asyncio.create_task(prove(channel, "window-post", "wdpost-1000-[0 1] dl 3"))

        async def proving() -> pb.GetStatusResponse | None:
            reply = await get_status(standin.listen)
            return reply if queues(reply)["window_post"] == (0, 1) else None

        reply = None
        while reply is None:
            reply = await proving()
        assert "wdpost-1000-[0 1] dl 3" in [g.current_job_id for g in reply.gpus]
        telemetry = await read_telemetry(standin.listen, timeout=5)
        assert telemetry.gpus is not None
        assert [g.proving for g in telemetry.gpus] == [{"window-post": 1}]
        document = standin.status()
        assert document["pipelines"] == []
        assert {w["state"] for w in document["gpu_workers"]} == {"idle"}
        job.cancel()


async def test_each_getstatus_costs_the_engine_nvidia_smis_cpu(standin: StandIn) -> None:
    """The real cuzk runs nvidia-smi per GetStatus: the stand-in burns its CPU time."""
    process = psutil.Process(standin.proc.pid)
    before = sum(process.cpu_times()[:2])
    for _ in range(5):
        await get_status(standin.listen)
    assert sum(process.cpu_times()[:2]) - before >= 5 * NVIDIA_SMI_SECS * 0.9


@pytest.mark.parametrize(("env", "args", "code", "says"), [
    ({"CUZK_STANDIN_EXIT": "101"}, [], 101, "thread 'main' panicked at cuzk-daemon/src/main.rs"),
    ({}, ["--version"], 2, "error: unexpected argument '--version' found"),
    ({}, ["run"], 2, "error: unexpected argument 'run' found"),
])
def test_exits_as_cuzk_does(tmp_path: Path, env: dict[str, str], args: list[str], code: int,
                            says: str) -> None:
    engine = StandIn(tmp_path, env=env, args=args)
    assert engine.proc.wait(20) == code
    assert engine.proc.stderr is not None
    assert says in engine.proc.stderr.read().decode()
    engine.stop()


def test_bad_toml_is_error_exit_1(tmp_path: Path) -> None:
    (tmp_path / "cuzk.toml").write_text("[daemon\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "-c", str(tmp_path / "cuzk.toml")],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: failed to parse config file")


def test_a_grpc_bind_failure_is_error_exit_1(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = write_cuzk_toml(tmp_path / "cuzk.toml", f"127.0.0.1:{port}", "")
        proc = subprocess.run([sys.executable, str(SCRIPT), "-c", str(config)],
                              capture_output=True, text=True, timeout=20)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: failed to bind gRPC listener")


def test_ready_line_is_tracing_format_with_ansi(standin: StandIn) -> None:
    ready = next(line for line in standin.stdout.read_text().splitlines()
                 if "serving on" in line)
    assert ready.startswith("\x1b[2m20")
    assert "\x1b[32m INFO\x1b[0m \x1b[2mcuzk_daemon\x1b[0m\x1b[2m:\x1b[0m" in ready
    assert ready.endswith(f"cuzk-daemon ready, serving on {standin.listen}")


def test_grpc_stubs_answer_as_the_real_ones(standin: StandIn) -> None:
    async def call() -> tuple[bool, grpc.StatusCode | None]:
        async with channel_to(standin.listen) as channel:
            cancel = channel.unary_unary(
                "/cuzk.v1.ProvingEngine/CancelProof",
                request_serializer=pb.CancelProofRequest.SerializeToString,
                response_deserializer=pb.CancelProofResponse.FromString)
            awaited = channel.unary_unary(
                "/cuzk.v1.ProvingEngine/AwaitProof",
                request_serializer=pb.AwaitProofRequest.SerializeToString,
                response_deserializer=pb.AwaitProofResponse.FromString)
            reply = await cancel(pb.CancelProofRequest(job_id="x"), timeout=5)
            try:
                await awaited(pb.AwaitProofRequest(job_id="nope"), timeout=5)
            except grpc.aio.AioRpcError as exc:
                return reply.was_running, exc.code()
            return reply.was_running, None

    assert asyncio.run(call()) == (False, grpc.StatusCode.NOT_FOUND)


@pytest.mark.parametrize(("budget", "gib"), [
    ("256GiB", 256), (" 256 GiB ", 256), ("256G", 50), ("1TiB", 50), ("1.5GiB", 50),
    ("256gib", 50), ("512MiB", 0.5), ("lots MiB", 0), ("auto", 64 - 5),
])
def test_budget_spellings_read_as_cuzk_reads_them(budget: str, gib: float) -> None:
    assert parse_budget(budget, 64 << 30, "5GiB") == int(gib * (1 << 30))
