"""``cuzkd run --demo``: the burst/gap decision, and the load shape on a real demo run."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest
from support.live import scrape
from support.supervisor_harness import start_supervisor, write_config

from cuzkd.config import engine_command, parse_config
from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.errors import ConfigError
from cuzkd.status.document import PARTITIONS
from cuzkd.supervisor.daemon.demo import (
    EXTRA_SECTOR_JOBS,
    GAP_FACTOR,
    MAX_GAP,
    MIN_GAP,
    POST_KINDS,
    SECTOR_KINDS,
    BurstShape,
    DoorCaller,
)


def _burst(shape: BurstShape, now: float, finished: int) -> list[str]:
    kinds = shape.next_burst(now, finished)
    assert kinds is not None
    shape.submitted(now, finished, len(kinds))
    return kinds


def test_bursts_mix_sector_jobs_and_a_post_and_two_in_a_row_hold_every_kind() -> None:
    shape = BurstShape(random.Random(7))
    sizes = set()
    finished, now = 0, 0.0
    previous: list[str] = []
    for _ in range(200):
        kinds = _burst(shape, now, finished)
        sizes.add(len(kinds))
        assert set(kinds[:-1]) <= set(SECTOR_KINDS) and kinds[-1] in POST_KINDS
        if previous:
            assert set(previous + kinds) == set(PARTITIONS)
        previous = kinds
        finished += len(kinds)
        now += 1000.0  # past any gap
        assert shape.next_burst(now, finished) is None  # the burst ended: a gap starts now
        now += MAX_GAP
    assert sizes == {n + 2 for n in range(EXTRA_SECTOR_JOBS[0], EXTRA_SECTOR_JOBS[1] + 1)}


def test_a_burst_lasts_until_its_jobs_finished_then_a_gap_like_it() -> None:
    shape = BurstShape(random.Random(1))
    kinds = _burst(shape, 100.0, finished=5)
    for finished in range(5, 5 + len(kinds)):
        assert shape.next_burst(130.0, finished) is None  # still working through the burst
    assert shape.next_burst(110.0, 5 + len(kinds)) is None  # done after 10 s: the gap starts
    gap = shape.idle_until - 110.0
    assert 10.0 * GAP_FACTOR[0] <= gap <= 10.0 * GAP_FACTOR[1]
    assert shape.next_burst(shape.idle_until - 0.01, 5 + len(kinds)) is None
    assert shape.next_burst(shape.idle_until, 5 + len(kinds))  # the next burst


@pytest.mark.parametrize(("took", "low", "high"), [(0.1, MIN_GAP, MIN_GAP),
                                                    (1000.0, MAX_GAP, MAX_GAP)])
def test_gaps_are_bounded(took: float, low: float, high: float) -> None:
    shape = BurstShape(random.Random(3))
    kinds = _burst(shape, 0.0, 0)
    assert shape.next_burst(took, len(kinds)) is None
    assert low <= shape.idle_until - took <= high


def test_an_engine_restart_ends_the_burst_and_a_refused_burst_waits() -> None:
    shape = BurstShape(random.Random(5))
    _burst(shape, 0.0, finished=40)
    assert shape.next_burst(0.1, finished=0) is None  # counters reset: the burst is gone
    assert shape.burst is None and shape.idle_until == 0.1 + MIN_GAP
    kinds = shape.next_burst(0.1 + MIN_GAP, 0)
    assert kinds is not None
    shape.submitted(0.1 + MIN_GAP, 0, 0)  # nothing accepted (engine draining)
    assert shape.burst is None and shape.idle_until == 0.1 + 2 * MIN_GAP


def test_demo_is_a_flag_not_a_config_key() -> None:
    """`run --demo` makes bundled engines demo engines; a file cannot (nor ask for a path)."""
    config = parse_config({"engine": [{"name": "b"}, {"name": "c", "command": ["/bin/c"]}]},
                          "x.toml")
    bundled, command = config.engine
    assert "--demo" not in engine_command(config, bundled)
    demo = msgspec.structs.replace(config, demo=True)
    assert engine_command(demo, bundled)[-1] == "--demo"
    assert engine_command(demo, command) == ["/bin/c"]
    for key in ("demo", "path"):
        with pytest.raises(ConfigError, match=f"key `{key}`: unknown key"):
            parse_config({key: True}, "x.toml")


def test_the_demo_calls_a_door_as_curio_does(tmp_path: Path) -> None:
    """One Prove per job, a burst's all at once (the door here answers none before it holds
    them all), each with a fresh request id and Curio's priority; every call that returned
    counts as finished, one the door refused too (else its burst would never end)."""
    kinds = [*SECTOR_KINDS, *POST_KINDS]

    async def main() -> tuple[list[pb.SubmitProofRequest], int]:
        seen: list[pb.SubmitProofRequest] = []
        all_in = asyncio.Event()

        async def prove(request: pb.ProveRequest, context: grpc.aio.ServicerContext[
                pb.ProveRequest, pb.ProveResponse]) -> pb.ProveResponse:
            seen.append(request.submit)
            if len(seen) == len(kinds):
                all_in.set()
            await all_in.wait()
            if request.submit.proof_kind == pb.WINNING_POST:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the door is shutting down")
            return pb.ProveResponse(result=pb.AwaitProofResponse(
                status=pb.AwaitProofResponse.COMPLETED))

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "cuzk.v1.ProvingEngine", {"Prove": grpc.unary_unary_rpc_method_handler(
                prove, request_deserializer=pb.ProveRequest.FromString,
                response_serializer=pb.ProveResponse.SerializeToString)}),))
        server.add_insecure_port(f"unix:{tmp_path}/door.sock")
        await server.start()
        caller = DoorCaller(f"unix://{tmp_path}/door.sock")
        try:
            await asyncio.wait_for(asyncio.gather(*caller.prove(kinds)), 30)
            await asyncio.wait_for(asyncio.gather(*caller.prove(kinds[:1])), 30)
        finally:
            await caller.close()
            await server.stop(None)
        return seen, caller.finished

    seen, finished = asyncio.run(main())
    assert finished == len(kinds) + 1
    assert sorted((r.proof_kind, r.priority) for r in seen[:len(kinds)]) == [
        (pb.POREP_SEAL_COMMIT, pb.NORMAL), (pb.SNAP_DEALS_UPDATE, pb.NORMAL),
        (pb.WINDOW_POST_PARTITION, pb.HIGH), (pb.WINNING_POST, pb.CRITICAL)]
    assert len({r.request_id for r in seen}) == len(seen)  # never one id twice


# --- a real demo run ------------------------------------------------------------------------

#: Gaps (jobs in flight back to 0 after work) to see before judging the shape.
CYCLES = 2


def _engine_status(status_url: str) -> dict[str, Any] | None:
    with urllib.request.urlopen(status_url, timeout=10) as resp:
        doc = json.load(resp)
    (engine,) = doc["engines"]
    status: dict[str, Any] | None = engine["status"]
    return status


#: The priority label of each kind's Prove as Curio sets it (demo.PRIORITIES).
CURIO_PRIORITIES = {"winning-post": "critical", "window-post": "high", "snap-update": "normal",
                    "porep-c2": "normal"}


def _prove(address: str, request_id: str) -> pb.ProveResponse:
    """A WinningPoSt ``Prove`` as Curio sends it, through the door at ``address``."""
    with grpc.insecure_channel(address) as channel:
        prove = channel.unary_unary("/cuzk.v1.ProvingEngine/Prove",
                                    request_serializer=pb.ProveRequest.SerializeToString,
                                    response_deserializer=pb.ProveResponse.FromString)
        reply: pb.ProveResponse = prove(pb.ProveRequest(submit=pb.SubmitProofRequest(
            request_id=request_id, proof_kind=pb.WINNING_POST, priority=pb.CRITICAL)),
            timeout=60)
    return reply


def test_demo_load_shape(tmp_path: Path) -> None:
    """One bundled engine under ``--demo``, sampled through the supervisor's /status until
    CYCLES bursts ended in a gap: bursts and idle gaps, every proof kind with its partition
    count, synthesis seen, each worker busy 20-80 % of the run, the budget (at most 2 GiB)
    used over at least a quarter of its size. The load came through the engine's front door
    as Curio's does (every kind relayed as a Prove, with Curio's priority), and the door
    answers a caller's own Prove through the bundled engine."""
    sup = start_supervisor(write_config(tmp_path, [{"name": "b0"}]), extra_args=["--demo"],
                           timeout=60)
    try:
        engine = sup.wait_engine("b0", lambda e: e["state"] == "running", timeout=60)
        assert engine["command"][-1] == "--demo"
        status_url = f"http://{sup.about()['metrics_listen']}/status"
        samples: list[dict[str, Any]] = []
        gaps = 0
        deadline = time.monotonic() + 180
        while gaps < CYCLES or len(samples) < 40:
            assert time.monotonic() < deadline, f"only {gaps} bursts ended in 180 s"
            doc = _engine_status(status_url)
            if doc is not None:
                in_flight = doc["cuzkd_extensions"]["jobs_in_flight"]
                if samples and in_flight == 0 and \
                        samples[-1]["cuzkd_extensions"]["jobs_in_flight"] > 0:
                    gaps += 1
                samples.append(doc)
            time.sleep(0.25)  # sampling period of a time series, not a synchronisation
        reply = _prove(f"unix://{tmp_path}/state/b0.door.sock", "curio-1")
        metrics = scrape(f"http://{sup.about()['metrics_listen']}/metrics")
    finally:
        sup.stop()

    assert reply.result.status == pb.AwaitProofResponse.COMPLETED, reply
    assert reply.result.job_id == "curio-1" and reply.result.total_ms > 0
    for kind, priority in CURIO_PRIORITIES.items():
        relayed = metrics.value("cuzkd_door_proofs_total", door="b0", proof_kind=kind,
                                priority=priority, result="completed")
        assert relayed is not None and relayed >= 1, (kind, priority)

    first, last = samples[0], samples[-1]
    wall = last["uptime_secs"] - first["uptime_secs"]
    start = {w["worker_id"]: w["busy_seconds_total"]
             for w in first["cuzkd_extensions"]["worker_busy"]}
    fractions = {w["worker_id"]: (w["busy_seconds_total"] - start[w["worker_id"]]) / wall
                 for w in last["cuzkd_extensions"]["worker_busy"]}
    assert fractions and all(0.2 <= f <= 0.8 for f in fractions.values()), fractions

    assert any(s["synthesis"]["active"] > 0 for s in samples)
    in_flight = [s["cuzkd_extensions"]["jobs_in_flight"] for s in samples]
    assert in_flight.count(0) >= CYCLES and max(in_flight) >= 2

    total = last["memory"]["total_bytes"]
    used = [s["memory"]["used_bytes"] for s in samples]
    assert total <= 2 * 2**30
    assert max(used) - min(used) >= 0.25 * total, (min(used), max(used), total)

    done = last["cuzkd_extensions"]["phase_transitions"]
    completed = last["counters"]["completed_by_kind"]
    assert set(completed) == set(PARTITIONS), completed  # every kind, in two bursts
    for kind, jobs in completed.items():
        # partitions done = jobs done x the kind's count (+ the partitions of running jobs)
        running = sum(p["partitions_done"] for p in last["pipelines"]
                      if p["proof_kind"] == kind and p["partitions_done"] < p["total_partitions"])
        assert done[kind]["done"] == jobs * PARTITIONS[kind] + running, kind
