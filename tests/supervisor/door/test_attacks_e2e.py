"""Hostile callers at the door, end to end: a real ``cuzkd run`` with the cuzk stand-in behind
its door, an honest Curio-like caller proving throughout, and callers speaking raw HTTP/2
(``support.h2_client``) or flooding with grpc.

Each attack is held to its bound in the door process (``cuzkd_door_bounds_hit_total``), and
none costs an honest call, the engine (same process, its health polls answered) or the
supervisor's descriptors. Every wait is on an event or a count, never a sleep.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import h2.errors
import h2.events
import pytest
from support.cuzk_caller import Caller
from support.cuzk_harness import cuzk_engine
from support.door_under_test import Door, prove_request
from support.h2_client import RawH2, message
from support.supervisor_harness import start_supervisor, write_config
from support.waiting import until, wait_until

from cuzkd.cuzk import proving_pb2 as pb

#: a PoRep C2 in ~0.3 s; each GetStatus burns 30 ms of the engine's CPU (cuzk's nvidia-smi)
KNOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.25", "CUZK_STANDIN_GPU_SECS": "0.02",
         "CUZK_STANDIN_NVIDIA_SMI_SECS": "0.03"}
SERVICE = "/cuzk.v1.ProvingEngine/"


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    tmp = tmp_path_factory.mktemp("attacks")
    table, address = cuzk_engine(tmp, "cz", env=KNOBS, door="", stop_timeout="1s",
                                 drain_timeout="5s")
    sup = start_supervisor(write_config(tmp, [table], supervisor={"shutdown_grace": "5s"},
                                        door={"max_connections": 64, "max_streams": 16}))
    try:
        yield Door(tmp, sup, address)
    finally:
        sup.stop()


@pytest.fixture
def honest(door: Door) -> Iterator[Caller]:
    """Curio proving one PoRep after another; every call must complete."""
    engine = door.running()
    caller = Caller(door.address)
    caller.start()
    wait_until(lambda: caller.completed() >= 2, 30, "proofs before the attack")
    yield caller
    done = caller.completed()
    wait_until(lambda: caller.completed() >= done + 2, 30, "proofs after the attack")
    caller.finish()
    assert set(caller.outcomes) == {"COMPLETED"}, caller.outcomes
    assert door.running() == engine, "the engine was touched"
    assert not door.sup.events("engine_unhealthy")


def bounds_hit(door: Door, bound: str) -> float:
    return door.metric("cuzkd_door_bounds_hit_total", door="cz", bound=bound)


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_raw_http2_attacks_are_held_to_their_bounds(door: Door, honest: Caller) -> None:
    """Streams reset flat out, 3000 streams at once, 200 KiB of metadata: each costs the
    attacker its connection (or its stream), nothing else."""
    resets = await RawH2.open(door.address)
    for _ in range(200):  # in batches: a loaded host still resets far past the bound's rate
        if resets.closed or any(isinstance(e, h2.events.ConnectionTerminated)
                                for e in resets.events):
            break
        for _ in range(50):
            resets.reset(resets.call("Prove", message(b"x"), end=False))
        await resets.drain()
    await resets.wait_closed()  # (its GOAWAY's code: test_door_server; here it may be lost
    # with the connection, as the client reads nothing past a frame it takes for an error)
    goaways = [e for e in resets.events if isinstance(e, h2.events.ConnectionTerminated)]
    assert all(e.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM  # type: ignore
               for e in goaways)

    flood = await RawH2.open(door.address)
    for _ in range(3000):
        flood.call("Prove", b"", end=False)
    await flood.drain()
    await flood.wait_closed()

    metadata = await RawH2.open(door.address)
    refused = metadata.call("Prove", message(b""), extra=[("x-junk", "j" * (20 << 10))])
    await metadata.wait_for(h2.events.StreamReset, lambda e: e.stream_id == refused)
    metadata.call("Prove", message(b""), extra=[("x-junk", "j" * (200 << 10))])
    await metadata.wait_closed()

    for bound in ("rapid_reset", "streams", "header_list"):
        assert bounds_hit(door, bound) >= 1, bound


async def test_silent_connections_cost_the_supervisor_no_descriptor(
        door: Door, honest: Caller) -> None:
    """300 connections that never say a word, against a bound of 64: they are the door
    process's to hold (and send away); the supervisor's descriptors do not move."""
    supervisor = door.sup.proc.pid
    before = descriptors(supervisor)
    path = door.address.removeprefix("unix://")
    silent = [await asyncio.open_unix_connection(path) for _ in range(300)]
    await until(lambda: bounds_hit(door, "connections") >= 300 - 64, "the idlest sent away")
    assert descriptors(supervisor) <= before + 2  # a scrape's connection, at most
    await asyncio.gather(*(asyncio.wait_for(reader.read(), 30) for reader, _ in silent))
    for _, writer in silent:
        writer.close()


async def test_a_status_flood_costs_the_engine_one_read_at_a_time(
        door: Door, honest: Caller) -> None:
    """2000 GetStatus at once from 20 callers: callers asking at the same moment share one
    read of the engine, so the engine burns a few reads' CPU, not 2000 x 30 ms (60 s), and its
    health polls go on being answered."""
    engine = door.running()
    spent = cpu_seconds(engine)

    async def caller() -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(door.address) as channel:
            status = channel.unary_unary(SERVICE + "GetStatus")
            replies = await asyncio.gather(*(status(b"", timeout=60) for _ in range(100)),
                                           return_exceptions=True)
        return [r.code() if isinstance(r, grpc.aio.AioRpcError) else grpc.StatusCode.OK
                for r in replies]

    codes = [code for codes in await asyncio.gather(*(caller() for _ in range(20)))
             for code in codes]
    assert set(codes) == {grpc.StatusCode.OK}
    assert cpu_seconds(engine) - spent < 10.0, "the engine answered the flood one by one"


async def test_status_reads_back_to_back_cost_the_engine_a_few_a_second(
        door: Door, honest: Caller) -> None:
    """300 GetStatus one after another (none at once, so none shares a read in flight): a
    reply also answers those asking within a quarter second after it, so the engine burns a
    few reads' CPU, not 300 x 30 ms (9 s)."""
    engine = door.running()
    spent = cpu_seconds(engine)
    async with grpc.aio.insecure_channel(door.address) as channel:
        status = channel.unary_unary(SERVICE + "GetStatus")
        for _ in range(300):
            await status(b"", timeout=20)
    assert cpu_seconds(engine) - spent < 3.0, "the engine answered each read"


def test_a_request_id_too_long_to_be_cuzks_is_refused_and_counted(
        door: Door, honest: Caller) -> None:
    with door.channel() as channel:
        prove = channel.unary_unary(SERVICE + "Prove",
                                    request_serializer=pb.ProveRequest.SerializeToString,
                                    response_deserializer=pb.ProveResponse.FromString)
        with pytest.raises(grpc.RpcError) as refused:
            prove(prove_request("porep-c2", "p" * (100 << 10)), timeout=20)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "request_id is 102400 bytes long" in (refused.value.details() or "")
    assert bounds_hit(door, "request_id") == 1
