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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import grpc
import psutil
import pytest
from support.cuzk_load import KINDS, PRIORITIES, channel_to, prove
from support.cuzk_standin import NVIDIA_SMI_SECS, SCRIPT, parse_budget, write_cuzk_toml
from support.ports import free_port
from support.waiting import wait_until

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.client import read_telemetry
from cuzkd.cuzk.telemetry import Outcomes

TOP_LEVEL = ["uptime_secs", "memory", "synthesis", "pipelines", "gpu_workers", "allocations",
             "counters", "buffers"]
#: one GPU worker: the shape in which work waits in cuzk's GPU work queue
ONE_WORKER = "[gpus]\ngpu_workers_per_device = 1\n"
#: GetStatus free of nvidia-smi's CPU, so that polling it does not hold up the engine's timers
NO_SMI = {"CUZK_STANDIN_NVIDIA_SMI_SECS": "0"}


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


class Start(Protocol):
    def __call__(self, env: dict[str, str], extra: str = "") -> StandIn: ...


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Starts one stand-in with these knobs (and TOML sections), ready; it is killed after the
    test."""
    started: list[StandIn] = []

    def start_one(env: dict[str, str], extra: str = "") -> StandIn:
        engine = StandIn(tmp_path, env=env, extra=extra)
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


def on_gpu(reply: pb.GetStatusResponse, job_id: str) -> bool:
    return any(g.current_job_id == job_id for g in reply.gpus)


async def status_until(listen: str, check: Callable[[pb.GetStatusResponse], bool],
                       what: str, timeout: float = 10) -> pb.GetStatusResponse:
    """GetStatus, asked again until its answer passes ``check``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check(reply := await get_status(listen)):
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)
    return reply


def started(standin: StandIn, job_id: str) -> bool:
    """The engine's ``proof job started`` line for this job is out: it was dispatched (a PoSt's
    synthesis, a partitioned job's pipeline, began). GetStatus cannot tell: cuzk counts a job
    ``in_progress`` only while a GPU worker proves it."""
    return any("proof job started" in line and f'"{job_id}"' in line
               for line in standin.stdout.read_text().splitlines())


async def dispatched(standin: StandIn, job_id: str) -> None:
    await asyncio.to_thread(wait_until, lambda: started(standin, job_id), 10,
                            f"{job_id} dispatched")


def submit_request(kind: str, job_id: str) -> pb.SubmitProofRequest:
    return pb.SubmitProofRequest(request_id=job_id, proof_kind=KINDS[kind],
                                 priority=PRIORITIES.get(kind, pb.NORMAL), sector_size=32 << 30)


async def prove_within(channel: grpc.aio.Channel, kind: str, job_id: str,
                       timeout: float) -> pb.ProveResponse:
    """One ``Prove`` with a deadline; its status code raised as it comes (``prove`` waits for
    ever and calls every error ``lost``)."""
    call = channel.unary_unary("/cuzk.v1.ProvingEngine/Prove",
                               request_serializer=pb.ProveRequest.SerializeToString,
                               response_deserializer=pb.ProveResponse.FromString)
    reply: pb.ProveResponse = await call(pb.ProveRequest(submit=submit_request(kind, job_id)),
                                         timeout=timeout)
    return reply


async def submit(channel: grpc.aio.Channel, kind: str, job_id: str) -> pb.SubmitProofResponse:
    call = channel.unary_unary("/cuzk.v1.ProvingEngine/SubmitProof",
                               request_serializer=pb.SubmitProofRequest.SerializeToString,
                               response_deserializer=pb.SubmitProofResponse.FromString)
    reply: pb.SubmitProofResponse = await call(submit_request(kind, job_id), timeout=5)
    return reply


async def await_proof(channel: grpc.aio.Channel, job_id: str,
                      timeout: float) -> pb.AwaitProofResponse:
    call = channel.unary_unary("/cuzk.v1.ProvingEngine/AwaitProof",
                               request_serializer=pb.AwaitProofRequest.SerializeToString,
                               response_deserializer=pb.AwaitProofResponse.FromString)
    reply: pb.AwaitProofResponse = await call(pb.AwaitProofRequest(job_id=job_id),
                                              timeout=timeout)
    return reply


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
        # out of the scheduler's queue and on no GPU worker: GetStatus shows nothing of it
        reply = await get_status(standin.listen)
        assert queues(reply)["porep_c2"] == (0, 0)
        assert [g.current_job_id for g in reply.gpus] == ["", ""]
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
    # partitions synthesized by then may be on a GPU worker a moment longer; then the job is in
    # neither count, though /status keeps it
    reply = await status_until(standin.listen, lambda r: queues(r)["snap_update"] == (0, 0),
                               "no snap_update job on a GPU worker")
    assert reply.total_proofs_failed == 1
    assert [g.current_job_id for g in reply.gpus] == ["", ""]
    telemetry = await read_telemetry(standin.listen, timeout=5)  # GetMetrics counts it by kind
    assert telemetry.outcomes == Outcomes(completed={}, failed={"snap-update": 1})


async def running_jobs(listen: str) -> float:
    """``cuzk_running_jobs`` from the engine's ``GetMetrics``."""
    async with channel_to(listen) as channel:
        call = channel.unary_unary("/cuzk.v1.ProvingEngine/GetMetrics",
                                   request_serializer=pb.GetMetricsRequest.SerializeToString,
                                   response_deserializer=pb.GetMetricsResponse.FromString)
        reply: pb.GetMetricsResponse = await call(pb.GetMetricsRequest(), timeout=5)
    (line,) = [line for line in reply.prometheus_text.splitlines()
               if line.startswith("cuzk_running_jobs ")]
    return float(line.split()[1])


async def test_a_failed_gpu_run_frees_the_worker_for_grpc_alone(start: Start) -> None:
    """After a failed GPU run /status shows the worker still proving that partition; cuzk's job
    tracker frees it whatever the outcome, so GetStatus and ``cuzk_running_jobs`` do not."""
    # one worker pops partitions 0 to 9 in order: the failed one is its last run
    standin = start({"CUZK_STANDIN_FAIL": "porep-1000-5:9:gpu", "CUZK_STANDIN_SYNTH_SECS": "0.05",
                     **NO_SMI}, ONE_WORKER)
    async with channel_to(standin.listen) as channel:
        failed = await prove_within(channel, "porep-c2", "porep-1000-5", 10)
    assert failed.result.status == pb.AwaitProofResponse.FAILED
    (worker,) = standin.status()["gpu_workers"]
    assert (worker["state"], worker["current_job"], worker["current_partition"]) == (
        "proving", "porep-1000-5", 9)
    reply = await get_status(standin.listen)
    assert [g.current_job_id for g in reply.gpus] == [""]
    assert set(queues(reply).values()) == {(0, 0)}
    assert await running_jobs(standin.listen) == 0


async def test_running_jobs_counts_the_workers_proving(start: Start) -> None:
    """``cuzk_running_jobs`` is the number of GPU workers with a job (as GetStatus's
    in_progress), not of jobs begun: a job synthesizing is not running."""
    standin = start({"CUZK_STANDIN_SYNTH_SECS": "1", "CUZK_STANDIN_POST_SECS": "1", **NO_SMI})
    post_id = "wdpost-1000-[5 0] dl 3"
    async with channel_to(standin.listen) as channel:
        porep = asyncio.create_task(prove_within(channel, "porep-c2", "porep-1000-6", 10))
        post = asyncio.create_task(prove_within(channel, "window-post", post_id, 10))
        await dispatched(standin, "porep-1000-6")
        reply = await status_until(standin.listen, lambda r: on_gpu(r, post_id), "the PoSt")
        assert [g.current_job_id for g in reply.gpus].count("") == 1  # the PoRep synthesizes
        assert queues(reply)["porep_c2"] == (0, 0)
        assert await running_jobs(standin.listen) == 1
        for job in (porep, post):
            assert (await job).result.status == pb.AwaitProofResponse.COMPLETED
    assert await running_jobs(standin.listen) == 0


async def test_post_is_proved_whole_and_only_grpc_sees_it(start: Start) -> None:
    standin = start({"CUZK_STANDIN_POST_SECS": "5"})
    async with channel_to(standin.listen) as channel:
        job = asyncio.create_task(prove(channel, "window-post", "wdpost-1000-[0 1] dl 3"))
        reply = await status_until(standin.listen,
                                   lambda r: on_gpu(r, "wdpost-1000-[0 1] dl 3"), "the PoSt")
        assert queues(reply)["window_post"] == (0, 1)
        telemetry = await read_telemetry(standin.listen, timeout=5)
        assert telemetry.gpus is not None
        assert [g.proving for g in telemetry.gpus] == [{"window-post": 1}]
        document = standin.status()
        assert document["pipelines"] == []
        assert {w["state"] for w in document["gpu_workers"]} == {"idle"}
        job.cancel()


async def test_a_post_pushed_over_a_waiting_post_loses_it_for_good(start: Start) -> None:
    """cuzk's GPU work queue is a map and every PoSt is pushed under the key (0, 0): while the
    one worker proves a PoSt, a second PoSt waits there, and a third replaces it. The second's
    Prove never returns, and GetStatus shows nothing of it: in neither count, on no worker."""
    standin = start({"CUZK_STANDIN_POST_SECS": "1", **NO_SMI}, ONE_WORKER)
    busy_id, lost_id, kept_id = ("wdpost-1000-[1 0] dl 3", "wdpost-1000-[2 0] dl 3",
                                 "winning-1000-[3]")
    async with channel_to(standin.listen) as channel:
        busy = asyncio.create_task(prove_within(channel, "window-post", busy_id, 10))
        await status_until(standin.listen, lambda r: on_gpu(r, busy_id), "the worker busy")
        lost = asyncio.create_task(prove_within(channel, "window-post", lost_id, 3))
        # dispatched: its synthesis began before the next one's, so it is pushed first
        await dispatched(standin, lost_id)
        kept = await prove_within(channel, "winning-post", kept_id, 10)
        assert kept.result.status == pb.AwaitProofResponse.COMPLETED
        assert (await busy).result.status == pb.AwaitProofResponse.COMPLETED
        reply = await get_status(standin.listen)
        assert queues(reply)["window_post"] == (0, 0)  # the lost one is in neither count
        assert queues(reply)["winning_post"] == (0, 0)
        assert [g.current_job_id for g in reply.gpus] == [""]
        assert (reply.total_proofs_completed, reply.total_proofs_failed) == (2, 0)
        with pytest.raises(grpc.aio.AioRpcError) as never:
            await lost
    assert never.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert standin.proc.poll() is None


async def test_posts_pushed_together_go_to_the_free_workers(start: Start) -> None:
    """Two PoSts whose syntheses end in one turn of the engine's loop (held up by a GetStatus's
    nvidia-smi) are both proved on the two free workers: a free worker pops at once, as cuzk's
    do, so work is lost only while no worker is free."""
    standin = start({"CUZK_STANDIN_POST_SYNTH_SECS": "0.5", "CUZK_STANDIN_NVIDIA_SMI_SECS": "1"})
    ids = ["wdpost-1000-[1 0] dl 3", "wdpost-1000-[2 0] dl 3"]
    async with channel_to(standin.listen) as channel:
        posts = [asyncio.create_task(prove_within(channel, "window-post", i, 10)) for i in ids]

        for i in ids:
            await dispatched(standin, i)  # both syntheses begun
        await get_status(standin.listen)  # the loop is held for 1 s: both syntheses end in it
        for post in posts:
            assert (await post).result.status == pb.AwaitProofResponse.COMPLETED


async def test_partition_0_of_the_first_job_and_a_post_replace_each_other(start: Start) -> None:
    """The process's first partitioned job has job_seq 0, so its partition 0 shares the PoSts'
    key: pushed over a waiting PoSt it loses that PoSt, and a PoSt pushed over it while it
    waits loses the partition (its job never completes, though its other partitions are
    proved)."""
    standin = start({"CUZK_STANDIN_POST_SECS": "1.2", "CUZK_STANDIN_SYNTH_SECS": "0.1", **NO_SMI},
                    ONE_WORKER)
    busy_id, post_id, porep_id, last_id = ("wdpost-1000-[1 0] dl 3", "winning-1000-[2]",
                                           "porep-1000-3", "winning-1000-[4]")
    async with channel_to(standin.listen) as channel:
        busy = asyncio.create_task(prove_within(channel, "window-post", busy_id, 10))
        await status_until(standin.listen, lambda r: on_gpu(r, busy_id), "the worker busy")
        post = asyncio.create_task(prove_within(channel, "winning-post", post_id, 10))
        await dispatched(standin, post_id)
        # its synthesis (0.1 s) began after the PoSt's (0.05 s): partition 0 is pushed later
        porep = asyncio.create_task(prove_within(channel, "porep-c2", porep_id, 10))

        def partition_0_waits() -> bool:
            pipelines = standin.status()["pipelines"]
            return bool(pipelines) and pipelines[0]["partitions"][0]["state"] == "synth_done"

        await asyncio.to_thread(wait_until, partition_0_waits, 10, "partition 0 in the queue")
        last = await prove_within(channel, "winning-post", last_id, 10)
        assert last.result.status == pb.AwaitProofResponse.COMPLETED
        assert (await busy).result.status == pb.AwaitProofResponse.COMPLETED

        def others_done() -> dict[str, object] | None:
            (job,) = standin.status()["pipelines"]
            return job if job["partitions_done"] == 9 else None

        job = await asyncio.to_thread(wait_until, others_done, 10, "partitions 1 to 9 proved")
        assert [p["state"] for p in job["partitions"]] == ["synth_done"] + ["done"] * 9
        reply = await get_status(standin.listen)
        # both lost jobs are in neither count: GetStatus shows nothing of them
        assert queues(reply)["porep_c2"] == (0, 0)
        assert queues(reply)["winning_post"] == (0, 0)  # the first PoSt, lost to partition 0
        assert [g.current_job_id for g in reply.gpus] == [""]
        assert not post.done() and not porep.done()  # nothing left to prove either
        post.cancel()
        porep.cancel()


async def test_a_poison_request_kills_the_engine_by_sigsegv_once_proved(start: Start) -> None:
    """``CRASH_ON``: other work is proved and the engine lives; the poison job dies with it
    ``CRASH_AFTER`` seconds after its proving began, by SIGSEGV, saying nothing."""
    standin = start({"CUZK_STANDIN_CRASH_ON": "porep-1000-66", "CUZK_STANDIN_CRASH_AFTER": "0.3",
                     "CUZK_STANDIN_SYNTH_SECS": "2"})
    async with channel_to(standin.listen) as channel:
        fine = await prove(channel, "winning-post")
        assert fine.outcome == "completed"
        assert standin.proc.poll() is None
        sent = time.monotonic()
        poison = await prove(channel, "porep-c2", "porep-1000-66")
    assert poison.outcome == "lost"
    assert standin.proc.wait(10) == -signal.SIGSEGV
    assert poison.ended is not None and poison.ended - sent >= 0.3
    started = [line for line in standin.stdout.read_text().splitlines()
               if "proof job started" in line and "porep-1000-66" in line]
    assert len(started) == 1
    assert standin.proc.stderr is not None
    assert standin.proc.stderr.read() == b""


async def test_unavailable_ids_are_refused_by_a_healthy_engine(start: Start) -> None:
    """``UNAVAILABLE``: the engine answers Prove and SubmitProof UNAVAILABLE itself, records
    nothing, and goes on serving."""
    standin = start({"CUZK_STANDIN_UNAVAILABLE": "porep-1000-77", **NO_SMI})
    async with channel_to(standin.listen) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as proved:
            await prove_within(channel, "porep-c2", "porep-1000-77", 5)
        with pytest.raises(grpc.aio.AioRpcError) as submitted:
            await submit(channel, "porep-c2", "porep-1000-77")
        for refused in (proved.value, submitted.value):
            assert refused.code() is grpc.StatusCode.UNAVAILABLE
            assert refused.details() == "proving engine busy"
        reply = await get_status(standin.listen)
        assert set(queues(reply).values()) == {(0, 0)}
        assert standin.status()["pipelines"] == []
        other = await prove_within(channel, "winning-post", "winning-1000-[7]", 5)
        assert other.result.status == pb.AwaitProofResponse.COMPLETED
    assert "porep-1000-77" not in standin.stdout.read_text()
    assert standin.proc.poll() is None


async def test_never_answer_ids_are_accepted_and_never_answered(start: Start) -> None:
    """``NEVER_ANSWER``: SubmitProof accepts the job, then nothing shows it and nothing answers
    it (a job of its kind is proved here in a fraction of the deadline: the last one is)."""
    standin = start({"CUZK_STANDIN_NEVER_ANSWER": "porep-1000-88",
                     "CUZK_STANDIN_SYNTH_SECS": "0.05", **NO_SMI})
    async with channel_to(standin.listen) as channel:
        accepted = await submit(channel, "porep-c2", "porep-1000-88")
        assert accepted.job_id == "porep-1000-88"
        assert set(queues(await get_status(standin.listen)).values()) == {(0, 0)}
        assert standin.status()["pipelines"] == []
        with pytest.raises(grpc.aio.AioRpcError) as proved:
            await prove_within(channel, "porep-c2", "porep-1000-88", 1)
        with pytest.raises(grpc.aio.AioRpcError) as awaited:
            await await_proof(channel, "porep-1000-88", 0.3)
        assert proved.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert awaited.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        reply = await get_status(standin.listen)
        assert set(queues(reply).values()) == {(0, 0)}
        assert (reply.total_proofs_completed, reply.total_proofs_failed) == (0, 0)
        assert standin.status()["pipelines"] == []
        assert (await prove(channel, "porep-c2")).outcome == "completed"  # others are proved


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
