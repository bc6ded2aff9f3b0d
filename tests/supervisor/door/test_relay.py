"""A front door -- the supervisor's :class:`Doors` and a real door process -- with a real gRPC
engine of the test's own behind it (``support.cuzk_grpc``): what a caller gets while no engine
can answer.

``GetStatus`` and ``GetMetrics`` never wait for an engine: the last good reply is given again
(the same bytes), or a clear ``UNAVAILABLE`` when there never was one; a held call that no
engine takes within ``hold_timeout`` is refused saying so. The seat is driven as the runner
drives it (admit, stop admitting, gone); ``settled`` waits until the door process has carried
out what its seats were told (a question over the same channel, answered after them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from support.cuzk_grpc import method, serve
from support.door_process import door_plan, running_doors
from support.waiting import until

from cuzkd.config.doors import DoorPlan
from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.errors import ChannelClosed
from cuzkd.supervisor.core.doorbook import EngineEnd, EngineReading
from cuzkd.supervisor.door.doors import Doors

SERVICE = "/cuzk.v1.ProvingEngine/"


def plan(address: str, hold_timeout: float = 60.0) -> DoorPlan:
    return dataclasses.replace(door_plan(address), hold_timeout=hold_timeout)


async def settled(doors: Doors) -> None:
    """The door process has carried out every message sent to it so far, and the supervisor
    has heard everything it said before answering."""
    await doors.ask("doors")


async def dialled_again(doors: Doors, timeout: float = 20.0) -> None:
    """Once the door process has dialled the channel again (and carried out the state it was
    told): a question of the supervisor's answered."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await settled(doors)
        except ChannelClosed:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.02)


async def call(address: str, method: str, request: bytes) -> bytes | grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply: bytes = await channel.unary_unary(SERVICE + method)(request, timeout=20)
            return reply
        except grpc.aio.AioRpcError as exc:
            return exc


def test_get_status_answers_from_the_last_good_reply_while_no_engine_can(
        tmp_path: Path) -> None:
    async def answer(request: pb.GetStatusRequest, context: object) -> pb.GetStatusResponse:
        return pb.GetStatusResponse(total_proofs_completed=7, uptime_seconds=42)

    async def main() -> list[bytes | grpc.aio.AioRpcError]:
        engine, engine_address = await serve(tmp_path, answer)
        door_address = f"unix://{tmp_path}/door.sock"
        async with running_doors([plan(door_address)]) as doors:
            seat = doors.seat("cz")
            assert seat is not None
            request = pb.GetStatusRequest().SerializeToString()
            never = await call(door_address, "GetStatus", request)
            seat.admit(engine_address, lambda error: None)
            await settled(doors)
            live = await call(door_address, "GetStatus", request)
            seat.stop_admitting(None)
            await engine.stop(0)
            seat.gone(EngineEnd.DRAINED)
            await settled(doors)
            kept = await call(door_address, "GetStatus", request)
            metrics = await call(door_address, "GetMetrics", b"")
            return [never, live, kept, metrics]

    never, live, kept, metrics = asyncio.run(main())
    assert isinstance(never, grpc.aio.AioRpcError)
    assert never.code() is grpc.StatusCode.UNAVAILABLE
    assert "none has answered it yet" in (never.details() or "")
    assert isinstance(live, bytes)
    assert pb.GetStatusResponse.FromString(live).total_proofs_completed == 7
    assert kept == live  # the engine is gone: its last good reply, byte for byte
    assert isinstance(metrics, grpc.aio.AioRpcError)  # GetMetrics never answered: no reply kept
    assert metrics.code() is grpc.StatusCode.UNAVAILABLE


def test_a_call_no_engine_takes_within_hold_timeout_is_refused_saying_so(
        tmp_path: Path) -> None:
    async def main() -> bytes | grpc.aio.AioRpcError:
        door_address = f"unix://{tmp_path}/door.sock"
        request = pb.ProveRequest(submit=pb.SubmitProofRequest(
            request_id="porep-1-1", proof_kind=pb.POREP_SEAL_COMMIT))
        async with running_doors([plan(door_address, hold_timeout=0.3)]):
            return await call(door_address, "Prove", request.SerializeToString())

    refused = asyncio.run(main())
    assert isinstance(refused, grpc.aio.AioRpcError)
    assert refused.code() is grpc.StatusCode.UNAVAILABLE
    assert "hold_timeout" in (refused.details() or "")


def test_an_engine_answering_garbage_is_taken_out_of_rotation_and_reported(
        tmp_path: Path) -> None:
    """Bytes that are not the method's reply are the engine's fault: the caller never gets
    them, the engine's process gets no further call, and its runner is told once."""
    answered: list[int] = []

    async def answer(request: pb.GetStatusRequest, context: object) -> pb.GetStatusResponse:
        answered.append(1)
        return pb.GetStatusResponse()

    async def main() -> tuple[list[bytes | grpc.aio.AioRpcError], list[str]]:
        engine, engine_address = await serve(tmp_path, answer,
                                             serializer=lambda m: b"\xff\xff\xff\xff")
        door_address = f"unix://{tmp_path}/door.sock"
        try:
            async with running_doors([plan(door_address)]) as doors:
                seat = doors.seat("cz")
                assert seat is not None
                told: list[str] = []
                seat.admit(engine_address, told.append)
                await settled(doors)
                request = pb.GetStatusRequest().SerializeToString()
                replies = [await call(door_address, "GetStatus", request) for _ in range(2)]
                await settled(doors)
                return replies, told
        finally:
            await engine.stop(0)

    replies, told = asyncio.run(main())
    for reply in replies:
        assert isinstance(reply, grpc.aio.AioRpcError), reply
        assert reply.code() is grpc.StatusCode.UNAVAILABLE
    assert answered == [1], "the second call never reached the broken process"
    [error] = told
    assert "GetStatus's reply is not a cuzk.v1.GetStatusResponse" in error


def test_a_shared_door_spreads_calls_and_merges_what_every_engine_reports(
        tmp_path: Path) -> None:
    """Two engines (one per GPU) behind one door: Proves go to the one with the fewest in
    flight; GetStatus, GetMetrics and PreloadSRS go to both and come back merged; with one
    gone, the other takes every call and its last good status stands in for the gone one."""
    gate, all_in = asyncio.Event(), asyncio.Event()
    proved: list[str] = []
    ordinal = {"e0": 0, "e1": 1}

    def engine_methods(name: str) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        async def prove(request: pb.ProveRequest, context: object) -> pb.ProveResponse:
            proved.append(name)
            if len(proved) == 4:
                all_in.set()
            await gate.wait()
            job = request.submit.request_id
            return pb.ProveResponse(result=pb.AwaitProofResponse(job_id=job))

        async def preload(request: pb.PreloadSrsRequest,
                          context: object) -> pb.PreloadSrsResponse:
            return pb.PreloadSrsResponse(already_loaded=name == "e0",
                                         load_time_ms=1500 * ordinal[name])

        return {"Prove": method(prove, pb.ProveRequest),
                "PreloadSRS": method(preload, pb.PreloadSrsRequest)}

    def status(name: str) -> Any:
        async def answer(request: pb.GetStatusRequest, context: object) -> pb.GetStatusResponse:
            reply = pb.GetStatusResponse(total_proofs_completed=10 + ordinal[name],
                                         uptime_seconds=100 * (1 + ordinal[name]))
            for _ in range(2):  # cuzk lists one entry per GPU worker
                reply.gpus.add(ordinal=ordinal[name], name="gpu")
            reply.queues.add(proof_kind="POREP_SEAL_COMMIT", pending=1, in_progress=1)
            return reply
        return answer

    def metrics(name: str) -> Any:
        async def answer(request: pb.GetMetricsRequest,
                         context: object) -> pb.GetMetricsResponse:
            return pb.GetMetricsResponse(prometheus_text=(
                "# TYPE cuzk_proofs_completed_total counter\n"
                f"cuzk_proofs_completed_total {10 + ordinal[name]}\n"))
        return answer

    async def main() -> dict[str, Any]:
        engines = {name: await serve(tmp_path, status(name), metrics=metrics(name), name=name,
                                     more=engine_methods(name)) for name in ordinal}
        door_address = f"unix://{tmp_path}/door.sock"
        shared = dataclasses.replace(plan(door_address), engines=("e0", "e1"))
        got: dict[str, Any] = {}
        async with running_doors([shared]) as doors:
            seats = {name: doors.seat(name) for name in ordinal}
            for name, (_, address) in engines.items():
                seat = seats[name]
                assert seat is not None
                seat.admit(address, lambda error: None)
            await settled(doors)
            proves = [asyncio.create_task(call(door_address, "Prove", pb.ProveRequest(
                submit=pb.SubmitProofRequest(request_id=f"porep-1-{i}")).SerializeToString()))
                for i in range(4)]
            await asyncio.wait_for(all_in.wait(), 20)
            got["spread"] = sorted(proved)
            gate.set()
            got["proves"] = await asyncio.gather(*proves)
            for what in ("GetStatus", "GetMetrics", "PreloadSRS"):
                got[what] = await call(door_address, what, b"")
            e1 = seats["e1"]
            assert e1 is not None
            e1.stop_admitting(None)
            await engines["e1"][0].stop(0)
            e1.gone(EngineEnd.DRAINED)
            await settled(doors)
            got["status_after"] = await call(door_address, "GetStatus", b"")
            got["prove_after"] = await call(door_address, "Prove", pb.ProveRequest(
                submit=pb.SubmitProofRequest(request_id="porep-1-9")).SerializeToString())
        await engines["e0"][0].stop(0)
        return got

    got = asyncio.run(main())
    assert got["spread"] == ["e0", "e0", "e1", "e1"]  # the fewest in flight, in turn
    assert all(isinstance(reply, bytes) for reply in got["proves"])
    status_reply = pb.GetStatusResponse.FromString(got["GetStatus"])
    assert [g.ordinal for g in status_reply.gpus] == [0, 0, 1, 1]  # each GPU's workers
    assert [(q.proof_kind, q.pending, q.in_progress) for q in status_reply.queues] == [
        ("POREP_SEAL_COMMIT", 2, 2)]
    assert (status_reply.total_proofs_completed, status_reply.uptime_seconds) == (21, 100)
    text = pb.GetMetricsResponse.FromString(got["GetMetrics"]).prometheus_text
    assert text == ("# TYPE cuzk_proofs_completed_total counter\n"
                    'cuzk_proofs_completed_total{engine="e0"} 10\n'
                    'cuzk_proofs_completed_total{engine="e1"} 11\n')
    preload = pb.PreloadSrsResponse.FromString(got["PreloadSRS"])
    assert (preload.already_loaded, preload.load_time_ms) == (False, 1500)
    after = pb.GetStatusResponse.FromString(got["status_after"])
    assert [g.ordinal for g in after.gpus] == [0, 0, 1, 1]  # e1's last good reply stands in
    assert isinstance(got["prove_after"], bytes)
    assert proved[-1] == "e0"


def test_a_shared_door_leaves_out_an_engine_answering_garbage_and_reports_it(
        tmp_path: Path) -> None:
    async def answer(request: pb.GetStatusRequest, context: object) -> pb.GetStatusResponse:
        return pb.GetStatusResponse(total_proofs_completed=3, uptime_seconds=9)

    async def main() -> tuple[list[bytes | grpc.aio.AioRpcError], list[str]]:
        good = await serve(tmp_path, answer, name="good")
        bad = await serve(tmp_path, answer, name="bad", serializer=lambda m: b"\xff\xff")
        door_address = f"unix://{tmp_path}/door.sock"
        shared = dataclasses.replace(plan(door_address), engines=("bad", "good"))
        told: list[str] = []
        try:
            async with running_doors([shared]) as doors:
                for name, (_, address) in (("bad", bad), ("good", good)):
                    seat = doors.seat(name)
                    assert seat is not None
                    seat.admit(address, told.append)
                await settled(doors)
                replies = [await call(door_address, "GetStatus", b"") for _ in range(2)]
                await settled(doors)
                return replies, told
        finally:
            for server, _ in (good, bad):
                await server.stop(0)

    replies, told = asyncio.run(main())
    for reply in replies:  # the good engine's alone, as it came
        assert reply == pb.GetStatusResponse(total_proofs_completed=3,
                                             uptime_seconds=9).SerializeToString()
    [error] = told  # once: the broken process is out of rotation after the first
    assert "GetStatus's reply is not a cuzk.v1.GetStatusResponse" in error


def test_the_supervisor_s_side_of_the_channel_restarted_costs_no_call(tmp_path: Path) -> None:
    """The door process stops reading (SIGSTOP) while the supervisor has readings of a busy
    engine to tell it: past the channel's backlog the supervisor drops the channel rather
    than queue more. The door process, let go on, finds its channel gone, serves on, dials
    again and is told the whole state: the same process answers a call, and the supervisor's
    questions, as before."""
    async def answer(request: pb.GetStatusRequest, context: object) -> pb.GetStatusResponse:
        return pb.GetStatusResponse(total_proofs_completed=5)

    async def main() -> tuple[int, int, bytes | grpc.aio.AioRpcError, list[dict[str, Any]]]:
        engine, engine_address = await serve(tmp_path, answer)
        door_address = f"unix://{tmp_path}/door.sock"
        busy = EngineReading(frozenset(f"porep-{i:06d}-{'x' * 20}" for i in range(60_000)),
                             frozenset(), None)
        try:
            async with running_doors([plan(door_address)]) as doors:
                seat = doors.seat("cz")
                assert seat is not None
                seat.admit(engine_address, lambda error: None)
                await settled(doors)
                pid = doors.process_info()["pid"]
                with structlog.testing.capture_logs() as logs:
                    os.kill(pid, signal.SIGSTOP)
                    try:
                        for _ in range(4):
                            seat.reading(busy)
                    finally:
                        os.kill(pid, signal.SIGCONT)
                    await until(lambda: any(e["event"] == "door_channel_closed" for e in logs),
                                "the dropped channel")
                    await dialled_again(doors)
                reply = await call(door_address, "GetStatus", b"")
                return pid, doors.process_info()["pid"], reply, logs
        finally:
            await engine.stop(0)

    before, after, reply, logs = asyncio.run(main())
    assert before == after, "the door process was not restarted"
    assert isinstance(reply, bytes)
    assert pb.GetStatusResponse.FromString(reply).total_proofs_completed == 5
    said = [e.get("error", "") for e in logs if e["event"] == "door_channel_closed"]
    assert any("the door process is not reading" in error for error in said), said


@pytest.mark.parametrize("answered_once", [True, False], ids=["hangs-later", "hangs-always"])
def test_a_shared_door_answers_status_reads_without_an_engine_that_hangs(
        tmp_path: Path, answered_once: bool) -> None:
    """One engine behind a shared door stops answering GetStatus (or never did): the door
    answers from the other by its reading deadline (2 s), with the hung one's last good reply
    standing in if it gave one, well within the caller's own deadline; from then on it answers
    at once (the hung engine read behind the callers' backs) -- never at its pace."""
    hang, asked = asyncio.Event(), asyncio.Event()
    if not answered_once:
        hang.set()

    def status(name: str) -> Any:
        async def answer(request: pb.GetStatusRequest, context: object) -> pb.GetStatusResponse:
            if name == "slow" and hang.is_set():
                asked.set()
                await asyncio.sleep(3600)
            reply = pb.GetStatusResponse(total_proofs_completed=1)
            reply.gpus.add(ordinal=0 if name == "fast" else 1, name=name)
            return reply
        return answer

    async def main() -> list[bytes | grpc.aio.AioRpcError]:
        engines = {name: await serve(tmp_path, status(name), name=name)
                   for name in ("fast", "slow")}
        door_address = f"unix://{tmp_path}/door.sock"
        shared = dataclasses.replace(plan(door_address), engines=("fast", "slow"))
        try:
            async with running_doors([shared]) as doors:
                for name, (_, address) in engines.items():
                    seat = doors.seat(name)
                    assert seat is not None
                    seat.admit(address, lambda error: None)
                await settled(doors)
                replies = [await call(door_address, "GetStatus", b"")]
                hang.set()
                async with grpc.aio.insecure_channel(door_address) as channel:
                    status_call = channel.unary_unary(SERVICE + "GetStatus")
                    while not asked.is_set():  # (a reply a moment old answers at once)
                        replies.append(await status_call(b"", timeout=10))
                    # the read that found it hung ran out its 2 s: the next callers, with
                    # half that left, are answered without waiting on it
                    replies += await asyncio.gather(*(status_call(b"", timeout=1)
                                                      for _ in range(3)))
                return replies
        finally:
            for server, _ in engines.values():
                await server.stop(0)

    replies = asyncio.run(main())
    for reply in replies:
        assert isinstance(reply, bytes), reply
        status_reply = pb.GetStatusResponse.FromString(reply)
        assert [g.name for g in status_reply.gpus] == (["fast", "slow"] if answered_once
                                                       else ["fast"])  # slow's last good one
