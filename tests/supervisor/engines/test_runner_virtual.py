"""EngineRunner and the engine set in-process, on virtual time, with stand-in engines.

Every test here runs a runner through minutes of supervision in milliseconds: the loop's clock
is virtual (``support.virtual_clock.run_virtual``), the processes are stand-ins
(``support.virtual_engines``) spawned through the real child table, and their exits reach the runner
through the table's ``dispatch`` as from the reaper. Waits are on state transitions (a spawn, a
lifecycle state), never on time since spawn. What only real processes show (signals, reaping,
process groups, PDEATHSIG) stays in the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from pathlib import Path
from typing import Any

import msgspec
import pytest
import structlog
from support.big_status import big_document
from support.piece_server import PieceServer
from support.started import started
from support.virtual_clock import run_virtual
from support.virtual_engines import (
    Script,
    StandIn,
    StandInEngines,
    config_of,
    engine_set,
    exited,
    in_state,
    no_such_file,
    readout_of,
    too_many_files,
)

from cuzkd.metrics.http import render
from cuzkd.states import State
from cuzkd.status.client import StatusSource
from cuzkd.status.document import StatusDocument
from cuzkd.supervisor.core.reloadplan import plan
from cuzkd.supervisor.core.stall import StallEvidence, StallWatch
from cuzkd.supervisor.engines.engineset import EngineReading
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.runner import EngineRunner


def runner_of(tmp_path: Path, engines: StandInEngines, **keys: Any) -> EngineRunner:
    config = config_of(tmp_path, {"name": "e", **keys})
    return EngineRunner(config.engine[0], config, children=engines.table,
                        binary_resolver=lambda: "unused", on_change=lambda: None,
                        clock=RunClock(asyncio.get_running_loop().time))


async def finish(runner: EngineRunner) -> None:
    await runner.stop()
    await runner.close()


def restart_gaps(spawned: list[StandIn]) -> list[float]:
    """Seconds from each stand-in's exit (it ran its script) to the next spawn."""
    return [round(b.spawned_at - (a.spawned_at + (a.script.runs_for or 0)), 6)
            for a, b in itertools.pairwise(spawned)]


CRASH = Script(runs_for=5, status=exited(1))
BACKOFF = {"backoff_initial": "2s", "backoff_max": "60s", "backoff_multiplier": 2,
           "backoff_reset_after": "60s", "restart": "always"}


def test_first_crash_after_a_healthy_run_restarts_at_once_then_backoff_grows(
        tmp_path: Path) -> None:
    async def main() -> list[StandIn]:
        engines = StandInEngines(CRASH)
        runner = runner_of(tmp_path, engines, **BACKOFF)
        runner.start()
        while len(engines.spawned) < 5:
            await engines.next_spawn()
        assert runner.lifecycle.exits["exit_1"] == 4 and runner.lifecycle.restarts == 4
        await finish(runner)
        return engines.spawned

    gaps = restart_gaps(run_virtual(main))
    assert gaps[0] == 0  # the first crash after settling (healthy) restarts immediately
    for gap, base in zip(gaps[1:], (2, 4, 8), strict=True):
        assert base * 0.8 <= gap <= base  # jitter only shortens a delay, by at most 20 %


def test_a_run_of_reset_after_resets_the_backoff(tmp_path: Path) -> None:
    long_run = Script(runs_for=120, status=exited(1))

    async def main() -> list[StandIn]:
        engines = StandInEngines(CRASH, CRASH, CRASH, long_run, CRASH)
        runner = runner_of(tmp_path, engines, **BACKOFF)
        runner.start()
        while len(engines.spawned) < 5:
            await engines.next_spawn()
        await finish(runner)
        return engines.spawned

    gaps = restart_gaps(run_virtual(main))
    assert gaps[0] == 0 and gaps[1] > 0 and gaps[2] > gaps[1]
    assert gaps[3] == 0  # 120 s of healthy running >= backoff_reset_after: immediate again


def test_stop_escalates_from_the_stop_signal_to_sigkill_after_stop_timeout(
        tmp_path: Path) -> None:
    async def main() -> tuple[StandIn, float, EngineRunner]:
        engines = StandInEngines(Script(ignores_stop=True))
        runner = runner_of(tmp_path, engines, stop_timeout="10s", stop_signal="SIGINT")
        runner.start()
        await in_state(runner, State.RUNNING)
        asked = asyncio.get_running_loop().time()
        await runner.stop()
        await runner.close()
        return engines.spawned[0], asked, runner

    proc, asked, runner = run_virtual(main)
    assert proc.signals == [(asked, signal.SIGINT), (asked + 10, signal.SIGKILL)]
    assert runner.state is State.STOPPED and runner.lifecycle.restarts == 0


def test_an_engine_that_ends_on_the_stop_signal_gets_no_sigkill(tmp_path: Path) -> None:
    async def main() -> StandIn:
        engines = StandInEngines(Script())
        runner = runner_of(tmp_path, engines, stop_timeout="10s")
        runner.start()
        await in_state(runner, State.RUNNING)
        await finish(runner)
        return engines.spawned[0]

    proc = run_virtual(main)
    assert [signum for _, signum in proc.signals] == [signal.SIGTERM]


def test_silent_status_kills_after_start_timeout_and_restarts_with_backoff(
        tmp_path: Path) -> None:
    """A status that never answers (nothing listens on its socket): the engine is stopped
    start_timeout after its spawn and counted; restarted at once the first time (no failure
    yet), after backoff_initial the second."""
    silent = f"unix:{tmp_path}/nobody-listens.sock"

    async def main() -> tuple[list[StandIn], EngineRunner]:
        engines = StandInEngines(Script())
        runner = runner_of(tmp_path, engines, status_url=silent, start_timeout="30s",
                           drain="none", stop_timeout="5s", backoff_initial="3s",
                           backoff_max="3s", restart="always")
        with structlog.testing.capture_logs():
            runner.start()
            await engines.next_spawn()
            await engines.next_spawn()
            await finish(runner)
        return engines.spawned, runner

    spawned, runner = run_virtual(main)
    kills = [proc.signals[0] for proc in spawned[:2]]
    assert [signum for _, signum in kills] == [signal.SIGTERM, signal.SIGTERM]
    for proc, (killed_at, _) in zip(spawned, kills, strict=False):
        assert 30 <= killed_at - proc.spawned_at <= 30.2  # polled every 100 ms while starting
    assert spawned[1].spawned_at == kills[0][0]
    assert 3 * 0.8 <= spawned[2].spawned_at - kills[1][0] <= 3
    assert runner.lifecycle.exits["start_timeout"] == 2


def test_a_spawn_that_cannot_succeed_fails_and_a_transient_one_is_retried(
        tmp_path: Path) -> None:
    async def main() -> tuple[EngineRunner, EngineRunner, list[float]]:
        missing = StandInEngines()
        missing.failures.append(no_such_file())
        fails = runner_of(tmp_path, missing)
        fails.start()
        await in_state(fails, State.FAILED)
        await fails.close()

        # Descriptors short for a moment: retried at once (the first failure), then after
        # backoff_initial, and the third try spawns.
        short = StandInEngines(Script())
        short.failures += [too_many_files(), too_many_files()]
        retried = runner_of(tmp_path, short, backoff_initial="1s")
        started = asyncio.get_running_loop().time()
        retried.start()
        assert retried.state is State.BACKOFF and not short.failures
        await short.next_spawn()
        await in_state(retried, State.RUNNING)
        await finish(retried)
        return fails, retried, [started, *(p.spawned_at for p in short.spawned)]

    fails, retried, (started, spawned_at) = run_virtual(main)
    assert "No such file" in str(fails.lifecycle.last_error) and not fails.lifecycle.restarts
    assert 0.8 <= spawned_at - started <= 1 and retried.state is State.STOPPED


def test_reload_restarts_a_changed_running_engine_and_keeps_the_others(tmp_path: Path) -> None:
    async def main() -> tuple[StandInEngines, Any]:
        engines = StandInEngines(Script())
        before = config_of(tmp_path, {"name": "a"}, {"name": "b"})
        after = config_of(tmp_path, {"name": "a", "command": ["stand-in", "--new"]}, {"name": "b"},
                          {"name": "c"})
        group = engine_set(before, engines.table,
                           clock=RunClock(asyncio.get_running_loop().time))
        group.start_all()
        await asyncio.gather(*(in_state(group.runner(n), State.RUNNING) for n in ("a", "b")))
        todo = await group.apply(after)
        await asyncio.gather(*(in_state(group.runner(n), State.RUNNING) for n in ("a", "c")))
        assert group.names() == ["a", "b", "c"]
        await group.stop_all(30)
        await group.close()
        return engines, todo

    engines, todo = run_virtual(main)
    assert (todo.stop, todo.keep, todo.start, todo.change) == ([], ["b"], ["c"], ["a"])
    old_a, b, new_a, c = engines.spawned
    assert [s for _, s in old_a.signals] == [signal.SIGTERM] and not old_a.alive
    assert new_a.argv == ["stand-in", "--new"] and c.env["CUZKD_ENGINE"] == "c"
    assert [s for _, s in b.signals] == [signal.SIGTERM]  # only by stop_all at the end


def test_plan_sorts_every_engine_into_one_bucket(tmp_path: Path) -> None:
    old = config_of(tmp_path, {"name": "gone"}, {"name": "same"}, {"name": "edited"})
    new = config_of(tmp_path, {"name": "edited", "stop_timeout": "3s"}, {"name": "added"},
                    {"name": "same"})
    todo = plan({s.name: s for s in old.engine}, new.engine)
    assert todo.stop == ["gone"] and todo.keep == ["same"]
    assert todo.start == ["added"] and todo.change == ["edited"]
    assert plan({}, []) == plan({}, [])  # nothing to do is a plan too
    unchanged = plan({s.name: s for s in old.engine}, old.engine)
    assert unchanged.keep == ["gone", "same", "edited"] and not unchanged.change


def test_shutdown_grace_caps_every_stop_then_sigkill(tmp_path: Path) -> None:
    """stop_all: the stop sequences run in parallel; at shutdown_grace whatever is left gets
    SIGKILL; a hurried stop (second signal) kills at once."""
    async def main() -> tuple[list[StandIn], float]:
        engines = StandInEngines(Script(ignores_stop=True), Script())
        group = engine_set(config_of(tmp_path, {"name": "stubborn", "stop_timeout": "20s"},
                                     {"name": "polite", "stop_timeout": "20s"}), engines.table,
                           clock=RunClock(asyncio.get_running_loop().time))
        group.start_all()
        await asyncio.gather(*(in_state(group.runner(n), State.RUNNING)
                               for n in ("stubborn", "polite")))
        asked = asyncio.get_running_loop().time()
        await group.stop_all(grace=7)
        await group.close()
        assert all(group.runner(n).state is State.STOPPED
                   for n in ("stubborn", "polite"))
        return engines.spawned, asked

    (stubborn, polite), asked = run_virtual(main)
    assert stubborn.signals == [(asked, signal.SIGTERM), (asked + 7, signal.SIGKILL)]
    assert polite.signals == [(asked, signal.SIGTERM)]

    async def hurried() -> tuple[StandIn, float]:
        engines = StandInEngines(Script(ignores_stop=True))
        group = engine_set(config_of(tmp_path, {"name": "stubborn"}), engines.table,
                           clock=RunClock(asyncio.get_running_loop().time))
        group.start_all()
        await in_state(group.runner("stubborn"), State.RUNNING)
        asked = asyncio.get_running_loop().time()
        await group.stop_all(grace=30, hurry=True)
        await group.close()
        return engines.spawned[0], asked

    proc, asked = run_virtual(hurried)
    assert (asked, signal.SIGKILL) in proc.signals  # at once, not after the grace
    assert {at for at, _ in proc.signals} == {asked}


def test_a_reload_while_a_scrape_waits_never_mixes_engines_up(tmp_path: Path) -> None:
    """/status and /metrics take each engine's entry and sample from one list of runners: a
    reload that removes and adds engines while the status fetches are still out changes
    nothing in that answer (the next one shows the new engines)."""
    async def main() -> tuple[list[EngineReading], list[str]]:
        server = PieceServer(b"", hang=True)  # a status that never answers: fetches wait
        address = await server.start_unix(tmp_path / "hang.sock")
        keys = {"status_url": address, "drain": "none", "start_timeout": "10m"}
        engines = StandInEngines(Script())
        group = engine_set(config_of(tmp_path, {"name": "a", **keys}, {"name": "b", **keys}),
                           engines.table,
                           clock=RunClock(asyncio.get_running_loop().time))
        group.start_all()
        scrape = await started(group.readings(max_age=0))  # it has taken its list of runners
        await group.apply(config_of(tmp_path, {"name": "c", **keys}, {"name": "b", **keys}))
        views = await scrape
        after = group.names()
        await group.stop_all(30)
        await group.close()
        await server.close()
        return views, after

    views, after = run_virtual(main)
    assert [(v.info.name, v.sample.name) for v in views] == [("a", "a"), ("b", "b")]
    assert after == ["c", "b"]


async def running_then_silent(tmp_path: Path, script: Script, **keys: Any
                              ) -> tuple[PieceServer, StandInEngines, EngineRunner]:
    """A runner whose status answered a real document (it is running), then hangs."""
    server = PieceServer(big_document(0, extensions=True))
    address = await server.start_unix(tmp_path / "status.sock")
    engines = StandInEngines(script)
    runner = runner_of(tmp_path, engines, status_url=address, stall_after="0s", **keys)
    runner.start()
    await in_state(runner, State.RUNNING)
    server.hang = True
    return server, engines, runner


def test_an_engine_whose_status_goes_silent_is_killed_after_unhealthy_after(
        tmp_path: Path) -> None:
    """Running (its status answered a real document), then the status hangs: stopped
    unhealthy_after after the last answer, counted as ``unhealthy``, and restarted."""
    async def main() -> tuple[list[StandIn], float, EngineRunner]:
        with structlog.testing.capture_logs():
            server, engines, runner = await running_then_silent(
                tmp_path, Script(), drain="none", health_interval="1s", status_timeout="1s",
                unhealthy_after="15s")
            assert runner.lifecycle.last_ok is not None
            last_answer = runner.lifecycle.last_ok
            await engines.next_spawn()
            await finish(runner)
        await server.close()
        return engines.spawned, last_answer, runner

    (silent, *_), last_answer, runner = run_virtual(main)
    [(stopped_at, signum), *_] = silent.signals
    assert signum == signal.SIGTERM
    assert 15 <= stopped_at - last_answer <= 15 + 1 + 1  # one poll interval + status_timeout
    assert runner.lifecycle.exits["unhealthy"] == 1


def test_wait_healthy_on_virtual_time(tmp_path: Path) -> None:
    """The swap's wait: healthy after answering and settling; a process that crashes in the
    settle period is named with its exit."""
    async def main() -> tuple[str | None, str | None, float]:
        engines = StandInEngines(Script(), Script(runs_for=3, status=exited(4)))
        group = engine_set(config_of(tmp_path, {"name": "e", "restart": "never"}), engines.table,
                           clock=RunClock(asyncio.get_running_loop().time))
        group.start_all()
        started = asyncio.get_running_loop().time()
        healthy = await group.wait_healthy("e", settle=10)
        took = asyncio.get_running_loop().time() - started
        await group.restart_engine("e")
        crashed = await group.wait_healthy("e", settle=10)
        await group.stop_all(30)
        await group.close()
        return healthy, crashed, took

    healthy, crashed, took = run_virtual(main)
    assert healthy is None and abs(took - (1 + 10)) < 1e-3  # settled after 1 s, then 10 s
    assert crashed is not None and "did not stay up for the 10s settle period" in crashed
    assert "last exit: exit_4" in crashed


def test_a_hung_status_read_never_stretches_a_drain_past_drain_timeout(tmp_path: Path) -> None:
    """A quiet drain reads the status to find a quiet moment; a status that stops answering
    (status_timeout 30 s) must not hold the stop signal past drain_timeout (2 s), or the
    stop could outlast shutdown_grace."""
    async def main() -> tuple[StandIn, float, EngineRunner]:
        with structlog.testing.capture_logs():
            server, engines, runner = await running_then_silent(
                tmp_path, Script(ignores_stop=True), drain="quiet", drain_timeout="2s",
                status_timeout="30s", stop_timeout="5s")
            asked = asyncio.get_running_loop().time()
            await finish(runner)
        await server.close()
        return engines.spawned[0], asked, runner

    proc, asked, runner = run_virtual(main)
    assert proc.signals == [(asked + 2, signal.SIGTERM), (asked + 2 + 5, signal.SIGKILL)]
    assert runner.drains["timeout"] == 1


class BrokenStallWatch(StallWatch):
    """A stall watch with a bug: its first ``failures`` samples raise."""

    def __init__(self, after: float, failures: int) -> None:
        super().__init__(after)
        self.failures = failures

    def observe(self, now: float, doc: Any, ext: Any) -> StallEvidence | None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a bug in the stall watch")
        return super().observe(now, doc, ext)


def test_a_health_loop_that_dies_is_started_again_and_counted(tmp_path: Path) -> None:
    """Whatever kills the health loop (here a bug in what it calls), the engine stays
    supervised: the loop is started again, counted, and still kills the engine once its status
    goes silent."""
    async def main() -> tuple[EngineRunner, list[dict[str, Any]], list[StandIn]]:
        server = PieceServer(big_document(0, extensions=True))
        address = await server.start_unix(tmp_path / "status.sock")
        engines = StandInEngines(Script())
        with structlog.testing.capture_logs() as logs:
            runner = runner_of(tmp_path, engines, status_url=address, drain="none",
                               stall_after="1m", health_interval="1s", unhealthy_after="5s",
                               status_timeout="1s")
            runner.stall = BrokenStallWatch(60, failures=3)
            runner.start()
            assert await runner.wait_for(lambda: runner.health_loop_failures == 3)
            await server.arrived.wait()  # the loop runs again
            assert (await runner.sample(0)).health_loop_failures_total == 3
            server.hang = True
            await engines.next_spawn()  # still supervised: silent, so restarted
            await finish(runner)
        await server.close()
        return runner, logs, engines.spawned

    runner, logs, spawned = run_virtual(main)
    assert runner.lifecycle.exits["unhealthy"] == 1 and len(spawned) == 2
    failed = [e for e in logs if e["event"] == "engine_health_loop_failed"]
    assert failed and failed[0]["error"] == "RuntimeError: a bug in the stall watch"


class ExplodingSource(StatusSource):
    """A status source with a bug: every scrape's fetch raises."""

    async def fetch(self, max_age: float) -> StatusDocument | None:
        raise RuntimeError("a bug in the status source")


DEEP = "deep document"
BUG = "bug in the sample"


@pytest.mark.parametrize("breakage", [DEEP, BUG])
def test_one_engines_document_never_breaks_the_scrape_of_the_others(tmp_path: Path,
                                                                     breakage: str) -> None:
    """An engine serving a valid document plus an unknown key 1000 deep (msgspec raises
    RecursionError), or one whose sample meets a bug, is exported down, with no status, in
    /metrics and /status; the other engine's series and status are there as ever."""
    async def main() -> tuple[str, dict[str, Any]]:
        good = big_document(0, extensions=True)
        servers = {name: PieceServer(good) for name in ("deep", "fine")}
        keys = {"drain": "none", "health_interval": "1s"}
        config = config_of(tmp_path, *[
            {"name": name, "status_url": await server.start_unix(tmp_path / f"{name}.sock"),
             **keys} for name, server in servers.items()])
        engines = StandInEngines(Script(), Script())
        group = engine_set(config, engines.table, clock=RunClock(asyncio.get_running_loop().time))
        group.start_all()
        for name in servers:
            await in_state(group.runner(name), State.RUNNING)
        if breakage == DEEP:
            servers["deep"].body = (good.rstrip()[:-1] + b', "k": ' + b'{"k": ' * 1000 + b"0"
                                    + b"}" * 1001)
            source = group.runner("deep").status_source
            assert source is not None and await source.poll()  # a light poll: kept
        else:
            runner = group.runner("deep")
            assert runner.status_source is not None
            runner.status_source = ExplodingSource(runner.status_source.address, timeout=1)
        views = readout_of(group, engines.table)
        text = render(await views.sample(), accept="", accept_encoding="").body.decode()
        status = msgspec.json.decode(await views.status_body())
        await group.stop_all(30)
        await group.close()
        for server in servers.values():
            await server.close()
        return text, status

    text, status = run_virtual(main)
    assert 'cuzkd_engine_up{engine="deep"} 0.0' in text
    assert 'cuzkd_engine_up{engine="fine"} 1.0' in text
    assert 'cuzk_engine_uptime_seconds{engine="fine"}' in text
    assert 'engine="deep"' not in "".join(line for line in text.splitlines(keepends=True)
                                          if line.startswith("cuzk_"))
    documents = {e["name"]: e["status"] for e in status["engines"]}
    assert documents["deep"] is None and documents["fine"] is not None


def test_status_is_encoded_once_per_document_and_shared(tmp_path: Path) -> None:
    """``/status``'s bytes are one object for every request while nothing changed (the
    responses in flight share it; an encoding per request cost ~15 ms and a copy per client
    for 1 MB), the same JSON as the document's fields; new bytes once the document changed."""
    async def main() -> tuple[list[bytes], list[list[Any]]]:
        server = PieceServer(big_document(0, extensions=True))
        config = config_of(tmp_path, {
            "name": "e", "status_url": await server.start_unix(tmp_path / "e.sock"),
            "drain": "none", "health_interval": "1s"})
        engines = StandInEngines(Script())
        group = engine_set(config, engines.table, clock=RunClock(asyncio.get_running_loop().time))
        group.start_all()
        await in_state(group.runner("e"), State.RUNNING)
        views = readout_of(group, engines.table)
        bodies, documents = [], []
        for body in (server.body, big_document(2**16, extensions=True)):
            server.body = body
            await asyncio.sleep(2)  # virtual: the next readings fetch again
            bodies += [await views.status_body(), await views.status_body()]
            documents.append([msgspec.to_builtins(r.sample.status)
                              for r in await group.readings()])
        await group.stop_all(30)
        await group.close()
        await server.close()
        return bodies, documents

    (first, again, changed, changed_again), documents = run_virtual(main)
    assert again is first and changed_again is changed
    assert changed != first
    for body, expected in ((first, documents[0]), (changed, documents[1])):
        assert [e["status"] for e in msgspec.json.decode(body)["engines"]] == expected
