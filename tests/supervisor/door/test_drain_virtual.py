"""A cuzk engine behind a front door, its runner in-process on virtual time: what the runner
tells its seat (admit at the first answer, stop admitting when a stop begins, gone at the
exit) and the ``door`` drain, which sends the stop signal only once the door holds nothing of
the engine -- however long that takes, within drain_timeout."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
import structlog
from support.big_status import big_document
from support.piece_server import PieceServer
from support.virtual_clock import run_virtual
from support.virtual_engines import Script, StandInEngines, config_of, exited, in_state

from cuzkd.cuzk.reading import QueueReading
from cuzkd.states import State
from cuzkd.supervisor.core.doorbook import EngineEnd, EngineReading
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.runner import EngineRunner
from cuzkd.supervisor.engines.seat import BrokenAnswers


class Seat:
    """The runner's side of a door seat, recorded; ``calls``: what the door has in flight."""

    def __init__(self, calls: int, wants: bool = False) -> None:
        self.calls = calls
        self.said: list[tuple[Any, ...]] = []
        #: the runner's hook for the current process's broken answers
        self.broken: BrokenAnswers | None = None
        #: whether the seat asks for readings while the engine runs, and those it got
        self.wants = wants
        self.readings: list[EngineReading] = []

    def admit(self, address: str, broken: BrokenAnswers) -> None:
        self.said.append(("admit", address))
        self.broken = broken

    def stop_admitting(self, drain_left: float | None) -> None:
        self.said.append(("stop_admitting", drain_left))

    def in_flight(self) -> int:
        return self.calls

    def wants_reading(self) -> bool:
        return self.wants

    def reading(self, reading: EngineReading) -> None:
        self.readings.append(reading)

    def gone(self, end: EngineEnd) -> None:
        self.said.append(("gone", end))


async def no_grpc(address: str, timeout: float) -> QueueReading:
    """The stand-in engines of these tests serve /status only: GetStatus tells nothing."""
    return QueueReading.unknown(f"no gRPC at {address} in this test")


async def door_runner(tmp_path: Path, script: Script, seat: Seat, *,
                      scripts: list[Script] | None = None, **keys: Any
                      ) -> tuple[PieceServer, StandInEngines, EngineRunner]:
    """A cuzk engine (its /status a real document) behind a door, started and running;
    ``scripts``: how the later processes behave."""
    server = PieceServer(big_document(0, extensions=True))
    status_url = await server.start_tcp()
    cuzk_toml = tmp_path / "cuzk.toml"
    listen = status_url.removeprefix("http://").removesuffix("/status")
    cuzk_toml.write_text(f'[daemon]\nlisten = "unix://{tmp_path}/curio.sock"\n'
                         f'status_listen = "{listen}"\n')
    config = config_of(tmp_path, {"name": "cz", "type": "cuzk",
                                  "command": ["stand-in", "-c", str(cuzk_toml)],
                                  "stall_after": "0s", **keys})
    engines = StandInEngines(script, *(scripts or []))
    runner = EngineRunner(config.engine[0], config, children=engines.table,
                          binary_resolver=lambda: "unused", on_change=lambda: None,
                          clock=RunClock(asyncio.get_running_loop().time), seat=seat,
                          queue_reader=no_grpc)
    runner.start()
    await in_state(runner, State.RUNNING)
    return server, engines, runner


def test_a_door_drain_signals_only_once_nothing_is_in_flight(tmp_path: Path) -> None:
    seat = Seat(calls=2)

    async def main() -> tuple[float, list[tuple[float, int]], EngineRunner]:
        with structlog.testing.capture_logs():
            server, engines, runner = await door_runner(tmp_path, Script(), seat,
                                                        drain_timeout="60s")
            asked = asyncio.get_running_loop().time()
            asyncio.get_running_loop().call_later(12, lambda: setattr(seat, "calls", 0))
            await runner.stop()
            await runner.close()
        await server.close()
        return asked, engines.spawned[0].signals, runner

    asked, signals, runner = run_virtual(main)
    assert seat.said == [("admit", f"unix://{tmp_path}/state/engines/cz.grpc.sock"),
                         ("stop_admitting", pytest.approx(60.0)), ("gone", EngineEnd.DRAINED)]
    [(at, signum)] = signals
    assert signum == signal.SIGTERM and asked + 12 <= at <= asked + 12.5
    assert runner.drains == {"clean": 1}


def test_a_door_drain_that_times_out_and_an_exit_nobody_asked_for_are_crashes(
        tmp_path: Path) -> None:
    """In flight for good: SIGTERM at drain_timeout, and the door is told the engine did not
    end drained (its calls are to be retried). A crash of the next process is one too."""
    seat = Seat(calls=1)

    async def main() -> tuple[float, list[tuple[float, int]]]:
        with structlog.testing.capture_logs():
            server, engines, runner = await door_runner(
                tmp_path, Script(), seat, drain_timeout="5s",
                scripts=[Script(runs_for=1, status=exited(1))])
            asked = asyncio.get_running_loop().time()
            await runner.stop()
            await runner.start_and_wait()
            await in_state(runner, State.RUNNING)
            await runner.wait_for(lambda: len(seat.said) == 5)
            await runner.stop()
            await runner.close()
        await server.close()
        return asked, engines.spawned[0].signals

    asked, signals = run_virtual(main)
    assert signals == [(asked + 5, signal.SIGTERM)]
    assert seat.said[:5] == [("admit", seat.said[0][1]), ("stop_admitting", pytest.approx(5.0)),
                             ("gone", EngineEnd.STOPPED), ("admit", seat.said[0][1]),
                             ("gone", EngineEnd.CRASHED)]


def test_an_engine_answering_garbage_is_killed_without_a_drain_and_restarted(
        tmp_path: Path) -> None:
    """The door reports broken answers: SIGKILL at once (no drain, though calls are in
    flight: the door retries them), counted ``unhealthy`` with the door's words, and the next
    process is admitted again."""
    seat = Seat(calls=3)

    async def main() -> tuple[float, list[tuple[float, int]], EngineRunner, list[Any]]:
        with structlog.testing.capture_logs() as logs:
            server, engines, runner = await door_runner(tmp_path, Script(), seat,
                                                        drain_timeout="60s")
            told = asyncio.get_running_loop().time()
            assert seat.broken is not None
            seat.broken("Prove's reply is not a cuzk.v1.ProveResponse")
            await runner.wait_for(lambda: len(seat.said) == 4)
            seat.calls = 0  # the retried calls ended on the new process
            await runner.stop()
            await runner.close()
        await server.close()
        return told, engines.spawned[0].signals, runner, logs

    told, signals, runner, logs = run_virtual(main)
    assert signals == [(told, signal.SIGKILL)]
    assert seat.said[:4] == [("admit", seat.said[0][1]), ("stop_admitting", None),
                             ("gone", EngineEnd.STOPPED), ("admit", seat.said[0][1])]
    info = runner.info()
    assert info.exits == {"unhealthy": 1, "stopped": 1}, info.exits
    [event] = [e for e in logs if e["event"] == "engine_answers_broken"]
    assert "ProveResponse" in event["error"]
    assert runner.drains == {"clean": 1}, "only the later stop drained"


class AbandoningSeat(Seat):
    """A door whose book stops waiting for its calls once a reading shows the engine's jobs."""

    def reading(self, reading: EngineReading) -> None:
        super().reading(reading)
        if reading.jobs is not None:
            self.calls = 0


def test_a_door_drain_reads_the_engine_and_ends_when_the_door_stops_waiting(
        tmp_path: Path) -> None:
    """While calls are in flight the drain reads the engine's /status (and GetStatus) for the
    door, which may stop waiting for work the engine dropped: the drain then ends at once,
    not at drain_timeout."""
    seat = AbandoningSeat(calls=1)

    async def main() -> tuple[float, list[tuple[float, int]], EngineRunner]:
        with structlog.testing.capture_logs():
            server, engines, runner = await door_runner(tmp_path, Script(), seat,
                                                        drain_timeout="60s")
            asked = asyncio.get_running_loop().time()
            await runner.stop()
            await runner.close()
        await server.close()
        return asked, engines.spawned[0].signals, runner

    asked, signals, runner = run_virtual(main)
    [(at, signum)] = signals
    assert signum == signal.SIGTERM and at < asked + 5
    [reading] = seat.readings
    assert reading.jobs and all(job.startswith("ps-") for job in reading.jobs)
    assert reading.past_gpu_queue < reading.jobs
    assert seat.said[-1] == ("gone", EngineEnd.DRAINED)
    assert runner.drains == {"clean": 1}


def test_the_health_loop_reads_the_engine_for_a_door_that_waits_on_a_reading(
        tmp_path: Path) -> None:
    """A fresh process's first partitioned job keeps PoSts away until /status shows its
    partition 0 past cuzk's GPU queue: the door asks, and each health poll gives it the read."""
    seat = Seat(calls=0, wants=True)

    async def main() -> None:
        with structlog.testing.capture_logs():
            server, _engines, runner = await door_runner(tmp_path, Script(), seat)
            await runner.wait_for(lambda: len(seat.readings) >= 3, within=10)
            seat.wants = False
            await runner.stop()
            await runner.close()
        await server.close()

    run_virtual(main)
    assert len(seat.readings) >= 3
    assert all(r.jobs and r.queues is None for r in seat.readings)
