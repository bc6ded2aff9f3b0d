"""A freeze of the supervisor itself is never counted against its engines.

The ledger's arithmetic with plain numbers; then the runner on virtual time, where
:meth:`VirtualClockLoop.freeze` stops the loop the way SIGSTOP does (time jumps, every timer due
meanwhile fires late, replies wait in the sockets), for each deadline the supervisor keeps:
``unhealthy_after`` with a poll in flight, ``start_timeout``, ``stall_after`` and the stop
sequence's ``stop_timeout``. The real-signal case is in ``test_freeze_e2e.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from pathlib import Path
from typing import Any, cast

import pytest
import structlog
from support.big_status import big_document
from support.piece_server import PieceServer
from support.virtual_clock import VirtualClockLoop, run_virtual
from support.virtual_engines import Script, StandIn, StandInEngines

from cuzkd.config import parse_config
from cuzkd.states import State
from cuzkd.supervisor.core.freezes import FREEZE_THRESHOLD, FreezeLedger
from cuzkd.supervisor.engines.runclock import HEARTBEAT, RunClock
from cuzkd.supervisor.engines.runner import EngineRunner

# -- the ledger ---------------------------------------------------------------------------


def test_a_timer_late_by_less_than_the_threshold_is_no_freeze() -> None:
    ledger = FreezeLedger()
    assert ledger.late(10.0, 10.0 + FREEZE_THRESHOLD) == 0
    assert ledger.freezes == 0 and ledger.frozen_total == 0


def test_one_freeze_seen_by_several_timers_in_any_order_counts_once() -> None:
    ledger = FreezeLedger()
    assert ledger.late(10.2, 26.0) == pytest.approx(15.8)
    assert ledger.late(10.0, 26.0) == pytest.approx(0.2)  # an earlier timer widens it
    assert ledger.late(14.0, 26.001) == pytest.approx(0.001)
    assert ledger.freezes == 1
    assert abs(ledger.frozen_total - 16.001) < 1e-9


def test_separate_freezes_add_up() -> None:
    ledger = FreezeLedger()
    ledger.late(10.0, 13.0)
    ledger.late(20.0, 25.0)
    assert ledger.freezes == 2 and ledger.frozen_total == 8.0


def test_the_first_reading_after_a_freeze_already_excludes_it() -> None:
    """Whichever callback reads the clock first after the resume sees the freeze: the
    heartbeat is found overdue before its own timer has run."""
    async def main() -> tuple[float, float, int]:
        loop = cast(VirtualClockLoop, asyncio.get_running_loop())
        clock = RunClock(loop.time)
        clock.start()
        await asyncio.sleep(1.0)
        before = clock.now()
        with structlog.testing.capture_logs() as logs:
            loop.freeze(16.0)
            after = clock.now()
        clock.close()
        assert [e["event"] for e in logs] == ["supervisor_resumed"]
        return before, after, clock.freezes

    before, after, epoch = run_virtual(main)
    assert epoch == 1
    assert 0 <= after - before <= HEARTBEAT  # at most the heartbeat's period is counted


# -- the runner on virtual time ----------------------------------------------------------

DOCUMENT = big_document(0, extensions=True)


def runner_of(tmp_path: Path, engines: StandInEngines, **keys: Any) -> EngineRunner:
    raw = {"supervisor": {"state_dir": str(tmp_path / "state")},
           "engine": [{"name": "e", "command": ["stand-in"], **keys}]}
    config = parse_config(raw, "test")
    clock = RunClock(asyncio.get_running_loop().time)
    clock.start()
    return EngineRunner(config.engine[0], config, children=engines.table,
                        binary_resolver=lambda: "unused", on_change=lambda: None, clock=clock)


def virtual_loop() -> VirtualClockLoop:
    return cast(VirtualClockLoop, asyncio.get_running_loop())


async def answered(server: PieceServer, polls: int) -> None:
    """Wait until ``polls`` more status requests have arrived."""
    for _ in range(polls):
        await server.arrived.wait()


async def finish(runner: EngineRunner, server: PieceServer) -> None:
    await runner.stop()
    await runner.close()
    await server.close()


def test_a_freeze_with_a_poll_in_flight_kills_nothing_and_fresh_polls_decide(
        tmp_path: Path) -> None:
    """The issue's case: defaults, replies taking 0.5 s, the supervisor frozen 16 s with a
    poll in flight. Its overdue timeout says nothing; later answers keep the engine; once it
    really goes silent, unhealthy_after runs on the supervisor's running time only."""
    async def main() -> tuple[StandIn, EngineRunner, float, float]:
        server = PieceServer(DOCUMENT, delay=0.5)
        address = await server.start_unix(tmp_path / "status.sock")
        engines = StandInEngines(Script())
        with structlog.testing.capture_logs():
            runner = runner_of(tmp_path, engines, status_url=address, drain="none",
                               stall_after="0s")
            runner.start()
            assert await runner.wait_for(lambda: runner.state is State.RUNNING)
            await server.arrived.wait()  # a poll is in flight: its reply comes in 0.5 s
            virtual_loop().freeze(16.0)
            await answered(server, 3)
            assert runner.state is State.RUNNING and len(engines.spawned) == 1
            assert not engines.spawned[0].signals
            last_ok = runner.lifecycle.last_ok
            assert last_ok is not None
            server.hang = True
            await engines.next_spawn()  # killed for silence, then restarted
            frozen = runner._run_clock.frozen_seconds_total
            await finish(runner, server)
        return engines.spawned[0], runner, last_ok, frozen

    first, runner, last_ok, frozen = run_virtual(main)
    assert 16.0 - HEARTBEAT <= frozen <= 16.0
    (stopped_at, signum), *_ = first.signals
    assert signum == signal.SIGTERM
    silent_for = (stopped_at - frozen) - last_ok  # on the supervisor's running time
    assert 15 <= silent_for <= 15 + 1 + 5 + 0.5  # + a poll interval, its timeout, the reply
    assert runner.lifecycle.exits["unhealthy"] == 1


def replaced(tmp_path: Path, server: PieceServer, *, times: int = 1,
             freeze: tuple[float, float] | None = None,
             **keys: Any) -> tuple[list[StandIn], float]:
    """Run an engine whose status ``server`` serves until its process was replaced ``times``
    times; ``freeze`` = (at, seconds): the supervisor is frozen that long, that long after the
    start. Every process spawned, and the seconds of freeze the clock counted."""
    async def main() -> tuple[list[StandIn], float]:
        address = await server.start_unix(tmp_path / "status.sock")
        engines = StandInEngines(Script())
        with structlog.testing.capture_logs():
            runner = runner_of(tmp_path, engines, status_url=address, **keys)
            runner.start()
            if freeze is not None:
                virtual_loop().call_later(freeze[0], virtual_loop().freeze, freeze[1])
            while len(engines.spawned) <= times:
                await engines.next_spawn()
            frozen = runner._run_clock.frozen_seconds_total
            await finish(runner, server)
        return engines.spawned, frozen

    spawned, frozen = run_virtual(main)
    seconds = 0.0 if freeze is None else freeze[1]
    assert seconds - HEARTBEAT <= frozen <= seconds
    return spawned, frozen


def test_start_timeout_counts_only_the_time_the_supervisor_ran(tmp_path: Path) -> None:
    server = PieceServer(DOCUMENT, hang=True)  # never answers: start_timeout decides
    (first, _), frozen = replaced(tmp_path, server, freeze=(5.0, 40.0), start_timeout="30s")
    (stopped_at, _), *_ = first.signals
    ran_for = stopped_at - first.spawned_at - frozen
    assert 30 <= ran_for <= 30 + 5 + 0.1 + HEARTBEAT  # + one status_timeout and start poll


def test_stall_after_counts_only_the_time_the_supervisor_ran(tmp_path: Path) -> None:
    """Work listed and nothing moving: the stall's start-up limit is 3 x stall_after of the
    supervisor's running time, not 10 s of it and a 200 s freeze."""
    (first, _), frozen = replaced(tmp_path, PieceServer(DOCUMENT), freeze=(10.0, 200.0),
                                  stall_after="60s")
    (killed_at, signum), *_ = first.signals
    assert signum == signal.SIGKILL
    assert 180 <= killed_at - first.spawned_at - frozen <= 180 + 2


def test_a_loop_blocked_again_and_again_still_finds_a_hung_engine(tmp_path: Path) -> None:
    """The supervisor blocked 0.7 s in every 2 s (a hostile document elsewhere, a starved
    host): each poll of an engine that never answers spans a freeze, but most of its
    status_timeout ran while the supervisor did, so it counts -- the engine is still killed,
    unhealthy_after of running time after its last answer."""
    async def main() -> tuple[StandIn, float, float]:
        server = PieceServer(DOCUMENT)
        address = await server.start_unix(tmp_path / "status.sock")
        engines = StandInEngines(Script())
        loop = virtual_loop()

        def block() -> None:
            loop.freeze(0.7)
            loop.call_later(2.0, block)

        with structlog.testing.capture_logs():
            runner = runner_of(tmp_path, engines, status_url=address, drain="none",
                               stall_after="0s")
            runner.start()
            assert await runner.wait_for(lambda: runner.state is State.RUNNING)
            last_ok = runner.lifecycle.last_ok
            assert last_ok is not None
            server.hang = True
            loop.call_soon(block)
            assert await runner.wait_for(lambda: len(engines.spawned) > 1, within=120), \
                "the hung engine was never killed"
            frozen = runner._run_clock.frozen_seconds_total
            await finish(runner, server)
        return engines.spawned[0], last_ok, frozen

    first, last_ok, frozen = run_virtual(main)
    (stopped_at, signum), *_ = first.signals
    assert signum == signal.SIGTERM
    assert frozen > 0
    assert 15 <= (stopped_at - frozen) - last_ok <= 15 + 1 + 5 + 0.5


def test_stop_timeout_counts_only_the_time_the_supervisor_ran(tmp_path: Path) -> None:
    async def main() -> tuple[StandIn, float, float]:
        server = PieceServer(DOCUMENT)
        address = await server.start_unix(tmp_path / "status.sock")
        engines = StandInEngines(Script(ignores_stop=True))
        with structlog.testing.capture_logs():
            runner = runner_of(tmp_path, engines, status_url=address, drain="none",
                               stop_timeout="10s", stall_after="0s")
            runner.start()
            assert await runner.wait_for(lambda: runner.state is State.RUNNING)
            virtual_loop().call_later(1.0, virtual_loop().freeze, 20.0)
            await finish(runner, server)
        return engines.spawned[0], runner._run_clock.frozen_seconds_total, 0.0

    proc, frozen, _ = run_virtual(main)
    [(term_at, term), (kill_at, kill)] = proc.signals
    assert (term, kill) == (signal.SIGTERM, signal.SIGKILL)
    assert 20.0 - HEARTBEAT <= frozen <= 20.0
    assert abs((kill_at - term_at - frozen) - 10) <= 1e-6


# -- stall restarts (item 5) --------------------------------------------------------------

def busy_document(busy_secs: float) -> bytes:
    """DOCUMENT with worker 0 proving one listed partition for ``busy_secs``."""
    doc = json.loads(DOCUMENT)
    job = doc["pipelines"][0]["job_id"]
    doc["gpu_workers"][0] = {**doc["gpu_workers"][0], "state": "proving", "current_job": job,
                             "current_partition": 0, "busy_secs": busy_secs}
    return json.dumps(doc).encode()


STALL_BACKOFF = {"backoff_initial": "2s", "backoff_max": "60s", "backoff_multiplier": 2,
                 "backoff_reset_after": "10m", "restart": "never"}


def test_stall_restarts_back_off_like_crashes(tmp_path: Path) -> None:
    """An engine that stalls again at once after every restart: restarted whatever the restart
    policy, but the delays grow (0, then 2, 4, 8 s) instead of a SIGKILL/respawn loop."""
    spawned, _ = replaced(tmp_path, PieceServer(DOCUMENT), times=4,  # work, never moving
                          stall_after="2s", health_interval="1s", **STALL_BACKOFF)
    gaps = [b.spawned_at - a.signals[0][0] for a, b in itertools.pairwise(spawned)]
    assert gaps[0] == 0
    for gap, base in zip(gaps[1:], (2, 4, 8), strict=True):
        assert base * 0.8 <= gap <= base


def test_a_span_older_than_the_process_is_not_a_stall_at_its_first_poll(
        tmp_path: Path) -> None:
    """A document claiming a worker busy for 11 days from the first poll (far above the 300 s
    busy limit): no process is taken as busy for longer than it has lived, so the first stall
    kill comes once it has lived the busy limit, not at its first poll."""
    (first, _), _ = replaced(tmp_path, PieceServer(busy_document(1e6)), stall_after="10m",
                             health_interval="1s", **STALL_BACKOFF)
    (killed_at, signum), *_ = first.signals
    assert signum == signal.SIGKILL
    assert 300 <= killed_at - first.spawned_at <= 300 + 10 + 1  # + a stall sample's pace


def test_the_exec_of_an_upgrade_is_one_more_freeze_however_short() -> None:
    ledger = FreezeLedger.carried(frozen_total=3.0, freezes=2, handed_at=100.0, now=100.2)
    assert (ledger.freezes, round(ledger.frozen_total, 6)) == (3, 3.2)
    # a late timer of the new code that overlaps the gap is not counted twice
    assert ledger.late(100.1, 100.2 + FREEZE_THRESHOLD + 0.1) == pytest.approx(
        FREEZE_THRESHOLD + 0.1)
    assert ledger.freezes == 3
