"""A start is not a failure: the polls an engine fails before its first answer, within its
start_timeout, are neither counted in ``cuzkd_status_fetch_errors_total`` nor logged as
failures, and ``cuzkd_engine_first_answer_seconds`` says how long the start took.

In-process on virtual time (a status socket that starts listening seconds after the spawn, as
cuzk's does after its config and GPU listing), then once with real processes through ``cuzkd
run``: an engine whose listener comes up after 2 s of 0.1 s polls, then a real failure.
"""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import structlog
from prometheus_client.parser import text_string_to_metric_families
from support.big_status import big_document
from support.piece_server import PieceServer
from support.supervisor_harness import (
    RunningSupervisor,
    scripted_engine,
    start_supervisor,
    write_config,
)
from support.virtual_clock import run_virtual
from support.virtual_engines import Script, StandInEngines, config_of, in_state
from support.waiting import wait_until

from cuzkd.metrics.sample import EngineSample
from cuzkd.states import State
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.runner import EngineRunner


def runner_of(tmp_path: Path, engines: StandInEngines, **keys: Any) -> EngineRunner:
    config = config_of(tmp_path, {"name": "e", "drain": "none", **keys})
    return EngineRunner(config.engine[0], config, children=engines.table,
                        binary_resolver=lambda: "unused", on_change=lambda: None,
                        clock=RunClock(asyncio.get_running_loop().time))


def status_failures(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "engine_status_failed"]


def test_a_slow_start_counts_no_error_and_a_failure_after_the_first_answer_does(
        tmp_path: Path) -> None:
    """120 failed polls in a 12 s start (and a scrape's failed fetch in it) are the start;
    the first answer makes the engine running and sets how long it took; a poll that fails
    after that is counted and logged."""
    sock = tmp_path / "status.sock"

    async def main() -> tuple[EngineSample, EngineSample, EngineSample, float, list[Any],
                              list[Any]]:
        loop = asyncio.get_running_loop()
        server = PieceServer(big_document(0, extensions=True))
        engines = StandInEngines(Script())
        with structlog.testing.capture_logs() as logs:
            runner = runner_of(tmp_path, engines, status_url=f"unix:{sock}",
                               start_timeout="30s", health_interval="1s", status_timeout="1s",
                               unhealthy_after="60s", stall_after="0s")
            runner.start()
            spawned_at = engines.spawned[0].spawned_at
            await asyncio.sleep(6)
            during = await runner.sample(max_age=0)  # a scrape in the start: it fails too
            await asyncio.sleep(6)
            await server.start_unix(sock)
            await in_state(runner, State.RUNNING)
            answered = await runner.sample(max_age=0)
            took = loop.time() - spawned_at
            start_logs = list(logs)
            server.hang = True
            source = runner.status_source
            assert source is not None
            while source.fetch_errors_total == 0:  # each poll's arrival: the last one failed
                await server.arrived.wait()
            failed = await runner.sample(max_age=1)
            await runner.stop()
            await runner.close()
        await server.close()
        return during, answered, failed, took, start_logs, logs

    during, answered, failed, took, start_logs, logs = run_virtual(main)
    assert (during.fetch_errors_total, during.first_answer_seconds) == (0, None)
    assert answered.fetch_errors_total == 0
    assert answered.first_answer_seconds is not None
    assert 12 <= answered.first_answer_seconds <= took <= 12.2  # polled every 100 ms
    assert not status_failures(start_logs)
    assert failed.fetch_errors_total >= 1 and status_failures(logs)
    assert failed.first_answer_seconds == answered.first_answer_seconds


def test_polls_past_start_timeout_are_failures(tmp_path: Path) -> None:
    """A status that never answers: the ~30 polls of a 3 s start_timeout are the start, the
    one that finds it over is counted and logged; the error is still known."""
    async def main() -> tuple[EngineRunner, EngineSample, list[Any]]:
        engines = StandInEngines(Script())
        with structlog.testing.capture_logs() as logs:
            runner = runner_of(tmp_path, engines, status_url=f"unix:{tmp_path}/nobody.sock",
                               start_timeout="3s", restart="never")
            runner.start()
            await in_state(runner, State.FAILED)
            sample = await runner.sample(max_age=0)
            await runner.close()
        return runner, sample, logs

    runner, sample, logs = run_virtual(main)
    assert runner.lifecycle.exits == {"start_timeout": 1}
    assert sample.fetch_errors_total == 1 and sample.first_answer_seconds is None
    [logged] = status_failures(logs)
    assert "cannot connect" in logged["error"] and logged["repeated"] == 1
    assert "cannot connect" in str(runner.last_error)  # what the kill names


def test_a_wrong_answer_while_starting_is_a_failure(tmp_path: Path) -> None:
    """An engine whose listener is up but answers HTTP 500 is not starting, it is broken: each
    such poll counts and is logged (rate-limited), start or not."""
    async def main() -> tuple[int, list[Any]]:
        server = PieceServer(b"worker pool gone", status=500, framing="length")
        address = await server.start_unix(tmp_path / "status.sock")
        engines = StandInEngines(Script())
        with structlog.testing.capture_logs() as logs:
            runner = runner_of(tmp_path, engines, status_url=address, start_timeout="30s")
            runner.start()
            while server.requests < 10:
                await server.arrived.wait()
            source = runner.status_source
            assert source is not None and runner.state is State.STARTING
            counted = source.fetch_errors_total
            await runner.stop()
            await runner.close()
        await server.close()
        return counted, logs

    counted, logs = run_virtual(main)
    assert counted >= 9  # every poll answered before the tenth, start or not
    [logged] = status_failures(logs)
    assert logged["state"] == "starting" and "HTTP 500" in logged["error"]


# -- with real processes ----------------------------------------------------------------------


def metrics(sup: RunningSupervisor) -> dict[str, float]:
    """The engine ``slow``'s cuzkd_* samples of one scrape, by name."""
    url = f"http://{sup.about()['metrics_listen']}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.labels == {"engine": "slow"}}


def test_a_listener_up_after_two_seconds_is_a_start_then_a_real_failure_counts(
        tmp_path: Path) -> None:
    config = write_config(tmp_path, [scripted_engine(
        tmp_path, "slow", args=["--listen-after", "2"], health_interval="100ms",
        status_timeout="500ms", start_timeout="20s", unhealthy_after="60s", drain="none")])
    sup = start_supervisor(config)
    try:
        pid = sup.wait_engine("slow", lambda e: e["state"] == "running", timeout=30)["pid"]
        found = metrics(sup)
        assert found["cuzkd_status_fetch_errors_total"] == 0
        assert found["cuzkd_engine_first_answer_seconds"] >= 2
        assert not sup.events("engine_status_failed")
        os.kill(pid, signal.SIGSTOP)  # its status stops answering: a real failure
        try:
            wait_until(lambda: metrics(sup)["cuzkd_status_fetch_errors_total"] >= 1, 30,
                       "a failed poll of the stopped engine counted")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: sup.events("engine_status_failed", engine="slow"), 15,
                   "the failure logged")
    finally:
        sup.stop()
